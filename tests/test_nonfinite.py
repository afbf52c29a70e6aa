"""Non-finite inputs against jax.lax / jnp in float64 (and float32): where max pooling's
gradient goes in windows of -inf and ties, the normalisation statistics of groups holding inf
or NaN, and the NaN that a convolution's padded taps make from infinite operands."""

from __future__ import annotations

import zlib
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn
from jaxdnn.ops import norm as norm_ops
from util import PLATFORMS, assert_close, device, on

CPU = jax.devices("cpu")[0]
FLOATS = (jnp.float32, jnp.float64)


def _ids(d):
    return np.dtype(d).name


# ----------------------------------------------------------------------------------------------
# Max pooling: the gradient of windows of -inf, ties and padding
# ----------------------------------------------------------------------------------------------

def _pool_ref_vjp(x, ct, window, strides, pads):
    """jax.grad of lax.reduce_window max (padding -inf, flax's max_pool) in float64 on the
    CPU: select_and_scatter_add's gradient goes to the first maximal element in window order,
    padding counting as -inf, so a window of -inf whose first tap is padding drops it."""
    with jax.default_device(CPU):
        def f(v):
            return lax.reduce_window(v, -jnp.inf, lax.max, (1, *window, 1), (1, *strides, 1),
                                     ((0, 0), *pads, (0, 0)))
        y, vjp = jax.vjp(f, jnp.asarray(np.asarray(x, np.float64)))
        return y, vjp(jnp.asarray(np.asarray(ct, np.float64)))[0]


# (x shape, window, strides, padding): windows starting on padding and on the input, windows
# made only of padding, a window that covers the whole input (global pooling), and on the GPU
# the tile (2x2/2), strip (3x3/2) and general window kernels, with one and two output columns
# per thread.
POOL_CASES = {
    "1d_pad_only_windows": ((2, 6, 16), (3,), (1,), [(3, 2)]),
    "1d_stride2_pad": ((2, 9, 4), (2,), (2,), [(1, 1)]),
    "2d_3x3_s2_pad1": ((2, 9, 11, 16), (3, 3), (2, 2), [(1, 1), (1, 1)]),
    "2d_3x3_s1_same": ((2, 7, 6, 16), (3, 3), (1, 1), [(1, 1), (1, 1)]),
    "2d_2x2_s2_valid": ((2, 8, 10, 64), (2, 2), (2, 2), [(0, 0), (0, 0)]),
    "2d_asym_pad_scalar": ((2, 7, 5, 3), (2, 3), (1, 2), [(1, 0), (2, 1)]),
    "2d_global": ((3, 5, 7, 16), (5, 7), (1, 1), [(0, 0), (0, 0)]),
    "2d_global_long": ((2, 40, 48, 8), (40, 48), (1, 1), [(0, 0), (0, 0)]),
    "3d_overlap": ((1, 4, 5, 4, 8), (2, 3, 2), (1, 2, 1), [(1, 0), (1, 1), (0, 1)]),
}


def _pool_input(rng, shape, dtype):
    """Mostly -inf with ties: values from {-inf, 0, 1}; channel 0 all -inf, channel 1 -inf
    but for a few ones, the rest a mix (every window kind: all -inf, tied maxima)."""
    x = rng.choice(np.array([-np.inf, -np.inf, -np.inf, 0.0, 1.0]), size=shape)
    x[..., 0] = -np.inf
    if shape[-1] > 1:
        x[..., 1] = np.where(rng.random(shape[:-1]) < 0.1, 1.0, -np.inf)
    return x.astype(np.dtype(dtype))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [*FLOATS, jnp.bfloat16], ids=_ids)
@pytest.mark.parametrize("case", list(POOL_CASES), ids=str)
def test_max_pool_gradient_of_inf_windows_and_ties(case, dtype, platform):
    """y and jax.grad of max_pool equal lax's bit for bit on windows of -inf (the gradient to
    the first tap, dropped when that tap is padding) and tied maxima (the first one)."""
    device(platform)
    shape, window, strides, pads = POOL_CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    x = _pool_input(rng, shape, dtype)
    y_shape = jax.eval_shape(lambda v: jaxdnn.max_pool(v, window, strides, pads),
                             jax.ShapeDtypeStruct(shape, dtype)).shape
    ct = rng.integers(1, 5, y_shape).astype(np.dtype(dtype))  # exact sums in every dtype
    ref_y, ref_dx = _pool_ref_vjp(x, ct, window, strides, pads)

    @jax.jit
    def run(v, c):
        y, vjp = jax.vjp(lambda u: jaxdnn.max_pool(u, window, strides, pads), v)
        return y, vjp(c)[0]

    y, dx = run(*on(platform, x, ct))
    np.testing.assert_array_equal(np.asarray(y, np.float64), np.asarray(ref_y), err_msg="y")
    np.testing.assert_array_equal(np.asarray(dx, np.float64), np.asarray(ref_dx), err_msg="dx")


# ----------------------------------------------------------------------------------------------
# Normalisation statistics: jnp.mean / jnp.var of groups holding inf and NaN
# ----------------------------------------------------------------------------------------------

def _pattern(members: np.ndarray, kind: int, x: np.ndarray):
    """Writes non-finite pattern `kind` into the group whose flat indices (memory order) are
    `members`. The first member is the one the kernels subtract as a shift, and slices,
    blocks and pieces start at others."""
    flat = x.reshape(-1)
    n = members.size
    mid, last = members[n // 2], members[-1]
    if kind == 1:
        flat[members[0]] = np.inf
    elif kind == 2:
        flat[last] = np.inf
    elif kind == 3:
        flat[members[::7]] = np.inf
    elif kind == 4:
        flat[members[0]] = flat[mid] = -np.inf
    elif kind == 5:
        flat[members[0]], flat[last] = np.inf, -np.inf
    elif kind == 6:
        flat[mid] = np.nan
    elif kind == 7:
        flat[members] = np.inf
    elif kind == 8:
        flat[mid] = np.inf
    elif kind == 9:
        flat[members[1::3]] = -np.inf
    # kind 0: finite (a control group)


def _group_ids(op, shape, axis=None, groups=None, layout=None):
    """The statistics group of every element of x, numbered like the kernels' mean and var:
    batch norm per channel, layer / RMS norm per row, group norm per (sample, group)."""
    nd = len(shape)
    if op == "batch_norm":
        ax = axis % nd
        return np.broadcast_to(np.arange(shape[ax]).reshape(
            [shape[a] if a == ax else 1 for a in range(nd)]), shape)
    if op in ("layer_norm", "rms_norm"):  # over the last axis
        return np.broadcast_to(np.arange(int(np.prod(shape[:-1]))).reshape(*shape[:-1], 1),
                               shape)
    cf = layout is not None and layout[1] == "C" and nd > 2
    c_axis = 1 if cf else nd - 1
    c = shape[c_axis]
    chan = np.arange(c).reshape([c if a == c_axis else 1 for a in range(nd)])
    n = np.arange(shape[0]).reshape([shape[0]] + [1] * (nd - 1))
    return np.broadcast_to(n * groups + chan // (c // groups), shape)


def _nonfinite_input(rng, shape, dtype, gid):
    """Random x with pattern g % 10 in group g; the group's members in memory order."""
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float64)
    flat_gid = gid.reshape(-1)
    groups = int(flat_gid.max()) + 1
    members = [np.flatnonzero(flat_gid == g) for g in range(groups)]
    for g in range(groups):
        _pattern(members[g], g % 10, x)
    return x.astype(np.dtype(dtype)), members


def _ref_stats(x, members, centered):
    """jnp.mean and jnp.var of each group (RMS norm: mean 0, var the mean square) in float64."""
    flat = jnp.asarray(np.asarray(x, np.float64).reshape(-1))
    with jax.default_device(CPU):
        if centered:
            mean = np.array([jnp.mean(flat[m]) for m in members])
            var = np.array([jnp.var(flat[m]) for m in members])
        else:
            mean = np.zeros(len(members))
            var = np.array([jnp.mean(jnp.square(flat[m])) for m in members])
    return mean, var


def _ref_y(x, gid, mean, var, scale, bias, centered, param_index):
    eps = float(np.float32(1e-5))
    x64 = np.asarray(x, np.float64)
    m, v = mean[gid], var[gid]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        y = (x64 - m) / np.sqrt(v + eps) * scale[param_index]
        return y + bias[param_index] if centered else y


def _stats_tol(dtype):
    return 1e-10 if np.dtype(dtype) == np.float64 else 1e-5  # as tests/test_norm.py


# (op, x shape, keyword arguments). Every statistics path: rows (layer / RMS norm, and a batch
# norm of one sample: groups of one value), columns (channels-last batch and group norm: few
# rows, several row slices, the GPU's single-pass kernel at 16 channels) and segments
# (channels-first: short segments, CPU blocks of 1024 within a segment, the GPU's single-pass
# kernel and its split forward at 512+ values).
NORM_CASES = [
    ("batch_norm", (1, 10), dict(axis=-1)),
    ("batch_norm", (7, 10), dict(axis=-1)),
    ("batch_norm", (3, 1000, 10), dict(axis=-1)),
    ("batch_norm", (4, 6, 5, 16), dict(axis=-1)),
    ("batch_norm", (4, 10, 37), dict(axis=1)),
    ("batch_norm", (2, 10, 3000), dict(axis=1)),
    ("batch_norm", (2, 16, 8, 8), dict(axis=1)),
    ("batch_norm", (3, 10, 16, 40), dict(axis=1)),
    ("layer_norm", (10, 37), dict(axis=-1)),
    ("layer_norm", (10, 3000), dict(axis=-1)),
    ("layer_norm", (10, 40003), dict(axis=-1)),
    ("rms_norm", (10, 37), dict(axis=-1)),
    ("rms_norm", (10, 40003), dict(axis=-1)),
    ("group_norm", (2, 5, 6, 10), dict(groups=5)),
    ("group_norm", (2, 10, 5, 6), dict(groups=5, layout="NCHW")),
    ("group_norm", (2, 8, 32, 32), dict(groups=4, layout="NCHW")),
]


def _norm_case_id(c):
    return f"{c[0]}{c[1]}" + ("" if not c[2].get("layout") else c[2]["layout"]) + (
        f"_axis{c[2]['axis']}" if "axis" in c[2] else "")


def _run_norm(op, x, scale, bias, kw, monkeypatch):
    """(y, mean, var) of the op, the statistics read from the training forward primitive (the
    layer, RMS and group norms return only y)."""
    seen = {}
    train = norm_ops._train

    def spy(*args, **kwargs):
        y, mean, var = train(*args, **kwargs)
        seen["stats"] = (mean, var)
        return y, mean, var

    monkeypatch.setattr(norm_ops, "_train", spy)
    f = getattr(jaxdnn, op)
    out = f(x, scale, **kw) if op == "rms_norm" else f(x, scale, bias, **kw)
    y = out[0] if op == "batch_norm" else out
    mean, var = seen["stats"]
    return y, np.asarray(mean).reshape(-1), np.asarray(var).reshape(-1)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", FLOATS, ids=_ids)
@pytest.mark.parametrize("case", NORM_CASES, ids=_norm_case_id)
def test_norm_statistics_of_nonfinite_groups(case, dtype, platform, monkeypatch):
    """mean is jnp.mean's (+inf for +inf values, -inf for -inf, NaN for both or a NaN, also
    when the group's first value, the kernels' shift, is infinite), var jnp.var's (NaN for any
    non-finite value; RMS norm: the mean square, inf for an infinity), y follows from them.
    (The heuristic's training forward; tests/test_norm.py runs every registered one.)"""
    device(platform)
    op, shape, kw = case
    centered = op != "rms_norm"
    gid = _group_ids(op, shape, kw.get("axis"), kw.get("groups"), kw.get("layout"))
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x, members = _nonfinite_input(rng, shape, dtype, gid)
    # scale / bias and the index of each element's parameter
    if op == "batch_norm":
        pidx = gid
    elif op in ("layer_norm", "rms_norm"):
        pidx = np.broadcast_to(np.arange(shape[-1]), shape)
    else:
        cf = kw.get("layout") is not None
        c_axis = 1 if cf else len(shape) - 1
        pidx = np.broadcast_to(np.arange(shape[c_axis]).reshape(
            [shape[c_axis] if a == c_axis else 1 for a in range(len(shape))]), shape)
    sd = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    nparam = int(pidx.max()) + 1
    scale = (rng.standard_normal(nparam) + 1.5).astype(sd)
    bias = rng.standard_normal(nparam).astype(sd)
    y, mean, var = _run_norm(op, *on(platform, x, scale, bias), kw, monkeypatch)
    ref_mean, ref_var = _ref_stats(x, members, centered)
    # Each statistic sums a group's values (var: their squares), so its rounding follows
    # their magnitude and the group's size, not the statistic's own (a mean near 0).
    values = np.asarray(x, np.float64)[np.isfinite(np.asarray(x, np.float64))]
    rms, group = float(np.sqrt(np.mean(values ** 2))), x.size // len(ref_mean.ravel())
    assert_close(mean, ref_mean, dtype, tol=_stats_tol(dtype), scale=rms, k=group, what="mean")
    assert_close(var, ref_var, dtype, tol=_stats_tol(dtype), scale=rms ** 2, k=group,
                 what="var")
    ref_y = _ref_y(x, gid, ref_mean, ref_var, scale.astype(np.float64),
                   bias.astype(np.float64), centered, pidx)
    assert_close(y, ref_y, dtype, tol=1e-10 if np.dtype(dtype) == np.float64 else 1e-5,
                 what="y")


# ----------------------------------------------------------------------------------------------
# Convolution: a tap over padding multiplies a zero (0 * inf = NaN)
# ----------------------------------------------------------------------------------------------

# Transform algorithms mix a tile's values before multiplying, so one non-finite operand
# spreads over the tile (as in cuDNN); they make no per-output IEEE claim (docs/design.md).
TRANSFORM_ALGORITHMS = frozenset({"winograd", "winograd_nonfused", "fft", "fft_tiling"})

# (name, x shape, w shape, conv_general_dilated keywords); channels-last, padding >= 0.
CONV_CASES = [
    ("3x3_pad1", (2, 7, 6, 3), (3, 3, 3, 8), dict(window_strides=(1, 1),
                                                  padding=((1, 1), (1, 1)))),
    ("3x3_stride2_asym", (2, 9, 8, 8), (3, 3, 8, 16), dict(window_strides=(2, 2),
                                                           padding=((1, 2), (0, 1)))),
    ("dilated", (1, 9, 9, 8), (3, 3, 8, 8), dict(window_strides=(1, 1),
                                                 padding=((2, 2), (2, 2)),
                                                 rhs_dilation=(2, 2))),
    ("groups", (2, 6, 7, 16), (3, 3, 8, 16), dict(window_strides=(1, 1),
                                                  padding=((1, 1), (1, 1)),
                                                  feature_group_count=2)),
    ("depthwise", (2, 8, 9, 16), (3, 3, 1, 16), dict(window_strides=(1, 1),
                                                     padding=((1, 1), (1, 1)),
                                                     feature_group_count=16)),
    ("depthwise_5x5_s2", (2, 9, 10, 8), (5, 5, 1, 16), dict(window_strides=(2, 2),
                                                            padding=((2, 2), (2, 2)),
                                                            feature_group_count=8)),
    ("1d", (3, 11, 8), (5, 8, 16), dict(window_strides=(1,), padding=((2, 3),),
                                        dimension_numbers=("NWC", "WIO", "NWC"))),
    ("3d", (1, 4, 5, 6, 8), (3, 3, 3, 8, 8), dict(window_strides=(1, 1, 1),
                                                  padding=((1, 1),) * 3,
                                                  dimension_numbers=("NDHWC", "DHWIO",
                                                                     "NDHWC"))),
]


def _conv_kw(kw, nd):
    kw = dict(kw)
    kw.setdefault("dimension_numbers", {2: ("NHWC", "HWIO", "NHWC")}.get(nd))
    return kw


def _conv_ref(x, w, ct, kw):
    """(y, dw) of lax.conv_general_dilated over x zero-padded explicitly (VALID), in float64
    on the CPU: every tap multiplies its (padded) input, so 0 * inf = NaN at padded taps.
    (lax's own padding agrees in float32 on the CPU; its float64 emitter skips padded taps.)"""
    pads = kw["padding"]
    valid = dict(kw, padding=[(0, 0)] * len(pads))
    with jax.default_device(CPU):
        x64 = np.pad(np.asarray(x, np.float64), ((0, 0), *pads, (0, 0)))
        y, vjp = jax.vjp(lambda w: lax.conv_general_dilated(x64, w, **valid),
                         jnp.asarray(np.asarray(w, np.float64)))
        return y, vjp(jnp.asarray(np.asarray(ct, np.float64)))[0]


def _conv_operands(name, x_shape, w_shape, y_shape, dtype):
    """Finite x; w with +inf, -inf and NaN at corner taps (which reach padding at the edges)
    of a few (input, output) channel pairs; a cotangent with infinities at edge outputs (whose
    taps reach padding in the filter gradient)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape)
    first, last = (0,) * (len(w_shape) - 2), tuple(s - 1 for s in w_shape[:-2])
    ci, co = w_shape[-2], w_shape[-1]
    w[(*first, 0, 0)] = np.inf
    w[(*last, ci - 1, co // 2)] = -np.inf
    w[(*first, ci // 2, co - 1)] = np.nan
    ct = rng.integers(1, 4, y_shape).astype(np.float64)
    ct[(0,) * (len(y_shape) - 1) + (0,)] = np.inf
    ct[(-1,) * (len(y_shape) - 1) + (co - 1,)] = -np.inf
    return tuple(a.astype(np.dtype(dtype)) for a in (x, w, ct))


def _check_conv(name, x_shape, w_shape, kw, dtype, platform, algo, arithmetic=None):
    """`arithmetic`: the tolerance's (assert_close), default `dtype`."""
    arithmetic = dtype if arithmetic is None else arithmetic
    kw = _conv_kw(kw, len(x_shape) - 2)
    y_shape = jax.eval_shape(lambda x, w: lax.conv_general_dilated(x, w, **kw),
                             jax.ShapeDtypeStruct(x_shape, dtype),
                             jax.ShapeDtypeStruct(w_shape, dtype)).shape
    x, w, ct = _conv_operands(name, x_shape, w_shape, y_shape, dtype)
    ref_y, _ = _conv_ref(x, w, ct, kw)
    f = partial(jaxdnn.conv_general_dilated, **kw, algo=algo)
    y = jax.jit(f)(*on(platform, x, w))
    assert_close(y, ref_y, arithmetic, what=f"{algo} fwd")
    # The filter gradient with a finite w: only ct's infinities (and padding) matter.
    w_finite = np.nan_to_num(w, nan=0.5, posinf=1.5, neginf=-1.5)
    _, ref_dw = _conv_ref(x, w_finite, ct, kw)
    dw = jax.jit(lambda x, w, c: jax.vjp(lambda v: f(x, v), w)[1](c)[0])(
        *on(platform, x, w_finite, ct))
    assert_close(dw, ref_dw, arithmetic, what=f"{algo} bwd_filter")


def _conv_algorithms(platform, x_shape, w_shape, kw, dtype):
    """{direction: the supported algorithms (infos) that claim IEEE behaviour} of a case."""
    kw = _conv_kw(kw, len(x_shape) - 2)
    x, w = (jax.ShapeDtypeStruct(s, dtype) for s in (x_shape, w_shape))
    y = jax.eval_shape(lambda x, w: lax.conv_general_dilated(x, w, **kw), x, w)

    def f(x, w, ct):
        return jax.vjp(partial(jaxdnn.conv_general_dilated, **kw), x, w)[1](ct)

    plat = {"gpu": "cuda"}.get(platform, platform)
    return {p.direction: [a for a in jaxdnn.conv_algorithms(p, plat)
                          if a.supported and a.base not in TRANSFORM_ALGORITHMS]
            for p in jaxdnn.conv_problems(f, x, w, y)}


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids)
@pytest.mark.parametrize("algo", [None, "direct", "im2col_gemm"], ids=str)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c[0])
def test_conv_padded_taps_multiply_zero_cpu(case, algo, dtype):
    """Every CPU algorithm (each forced, and the default choice) makes NaN where an infinite
    weight meets padding, like lax's zero-padded convolution, in the forward and in the
    filter gradient (an infinite cotangent against padding)."""
    name, x_shape, w_shape, kw = case
    algos = _conv_algorithms("cpu", x_shape, w_shape, kw, dtype)
    bases = {d: {a.base for a in infos} for d, infos in algos.items()}
    assert bases["fwd"] == bases["bwd_filter"] == {"direct", "im2col_gemm"}, \
        "a new CPU algorithm: add it to the parameters"
    _check_conv(name, x_shape, w_shape, kw, dtype, "cpu", algo)


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c[0])
def test_conv_padded_taps_multiply_zero_gpu(case, dtype):
    """Every CUDA algorithm but the transforms, forced one at a time, per direction (fwd and
    bwd_filter), at lax's default precision (TF32 tensor-core passes keep infinities; the
    3xTF32 split of precision HIGHEST does not, see docs/design.md)."""
    device("gpu")
    if not jaxdnn.build_info()["cuda"]:
        pytest.skip("jaxdnn built without CUDA")
    name, x_shape, w_shape, kw = case
    arithmetic = "tf32" if np.dtype(dtype) == np.float32 else dtype  # lax's default precision
    algos = _conv_algorithms("gpu", x_shape, w_shape, kw, dtype)
    fwd, flt = ([a.name for a in algos[d]] for d in ("fwd", "bwd_filter"))
    assert "direct" in fwd and "direct" in flt
    for name_ in dict.fromkeys(fwd + flt):  # each direction it supports, direct for the other
        algo = {"fwd": name_ if name_ in fwd else "direct",
                "bwd_filter": name_ if name_ in flt else "direct"}
        _check_conv(name, x_shape, w_shape, kw, dtype, "gpu", algo, arithmetic)
