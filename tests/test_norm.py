"""Normalisation ops against float64 numpy / jnp references, on every platform."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.test_util import check_grads

import jaxdnn
from jaxdnn import _ffi
from util import (DTYPES, PLATFORMS, TOL, assert_close, device, needs_cuda_module, needs_gpu, on,
                  rand)

EPS = float(np.float32(1e-5))  # the ops use eps as float32; so do the references


# ----------------------------------------------------------------------------------------------
# Cases: one op, one layout, one shape. `reduce` are the statistics axes of x, `pshape` the
# shape of scale/bias and `pexpand` how they broadcast against x; the references below are
# written from these alone, independently of the canonical form the ops use.
# ----------------------------------------------------------------------------------------------

class Case:
    def __init__(self, op, shape, reduce, pshape, pexpand, **kw):
        self.op, self.shape, self.reduce, self.pshape, self.pexpand, self.kw = (
            op, shape, reduce, pshape, pexpand, kw)

    def __repr__(self):
        extra = ",".join(f"{k}={v}" for k, v in self.kw.items())
        return f"{self.op}{self.shape}{extra and ':' + extra}"

    @property
    def centered(self):
        return self.op != "rms_norm"

    def run(self, x, s, b, **extra):
        """The jaxdnn op; batch_norm returns (y, mean, var), the others y."""
        f = getattr(jaxdnn, self.op)
        if self.op == "rms_norm":
            return f(x, s, **self.kw, **extra)
        return f(x, s, b, **self.kw, **extra)


def _ln(shape, axis=-1):
    axes = tuple(sorted(a % len(shape) for a in (axis if isinstance(axis, tuple) else (axis,))))
    pshape = tuple(shape[a] for a in axes)
    expand = lambda p, nd=len(shape): p.reshape([shape[a] if a in axes else 1 for a in range(nd)])
    return axes, pshape, expand


def layer_case(op, shape, axis=-1):
    axes, pshape, expand = _ln(shape, axis)
    return Case(op, shape, axes, pshape, expand, axis=axis)


def batch_case(shape, axis=-1):
    ax = axis % len(shape)
    reduce = tuple(a for a in range(len(shape)) if a != ax)
    expand = lambda p: p.reshape([shape[a] if a == ax else 1 for a in range(len(shape))])
    return Case("batch_norm", shape, reduce, (shape[ax],), expand, axis=axis)


def group_case(shape, groups, layout=None):
    channels_first = layout is not None and layout[1] == "C" and len(shape) > 2
    c = shape[1] if channels_first else shape[-1]
    return Case("group_norm", shape, None, (c,), None, groups=groups, layout=layout)


# (RMS norm of a single value, x / sqrt(x^2 + eps), has a derivative that is pure cancellation
# in any float32 evaluation; its size-1 case keeps the size-1 dim out of the normalised axes.)
LAYER = [layer_case(op, s, ax) for op in ("layer_norm", "rms_norm") for s, ax in [
    ((5, 7, 33), -1), ((3, 1) if op == "layer_norm" else (3, 1, 4), -1), ((4, 1000), -1),
    ((3, 4096), -1), ((2, 6, 5), (1, 2)), ((6, 5, 4), 0), ((2, 40003), -1)]]
# (Rows or segments of a multiple of 16 bytes, e.g. (4, 6, 5, 16) and (2, 16, 8, 8) on axis 1,
# take the single-pass CUDA forward; channels-first segments of at least 512 values, e.g.
# (3, 5, 16, 40) on axis 1, its split forward (statistics, table, flat apply); the others its
# three-pass fallback. 16, 64 and 96 channels also cover the CPU column path's register kernels
# at several widths.)
BATCH = [batch_case(s, ax) for s, ax in [
    ((4, 5, 6, 3), -1), ((4, 3, 5, 6), 1), ((7, 5), -1), ((3, 1000, 7), -1), ((1, 1, 1, 3), -1),
    ((2, 3, 4, 5, 2), -1), ((3, 2, 5, 3, 4), 1), ((2, 3, 1037), 1), ((4, 6, 5, 16), -1),
    ((2, 16, 8, 8), 1), ((3, 5, 7, 64), -1), ((2, 3, 5, 96), -1), ((3, 5, 16, 40), 1)]]
GROUP = [group_case(s, g, lay) for s, g, lay in [
    ((2, 5, 6, 8), 4, None), ((2, 8, 5, 6), 4, "NCHW"), ((3, 5, 6), 6, "NWC"),
    ((3, 6, 5), 3, "NCW"), ((2, 4, 3, 5, 6), 1, "NCDHW"), ((4, 12), 3, "NC"),
    ((2, 3, 3, 2, 8), 8, "NDHWC"), ((1, 33, 2), 2, None), ((2, 16, 8, 8), 4, "NCHW"),
    ((2, 12, 16, 36), 4, "NCHW")]]
CASES = LAYER + BATCH + GROUP
# Forward only: one value per channel (variance 0, so rstd = 1/sqrt(eps) and every gradient
# term is a cancellation of values ~300x larger than the result).
FORWARD_ONLY = [batch_case((5,), 0)]


def _group_axes(case):
    """(x reshaped to expose groups, statistics axes, reshape back) for a group_norm case."""
    shape, g = case.shape, case.kw["groups"]
    lay = case.kw["layout"]
    cf = lay is not None and lay[1] == "C" and len(shape) > 2
    c = shape[1] if cf else shape[-1]
    if cf:  # (N, G, C/G, spatial...)
        gshape = (shape[0], g, c // g, *shape[2:])
        axes = tuple(range(2, len(gshape)))
    else:  # (N, spatial..., G, C/G)
        gshape = (*shape[:-1], g, c // g)
        axes = tuple(a for a in range(1, len(gshape)) if a != len(gshape) - 2)
    return gshape, axes, cf


def reference(case, x, s, b):
    """float64 numpy: y (and, for batch norm, mean and biased var)."""
    x = np.asarray(x, np.float64)
    s, b = np.asarray(s, np.float64), np.asarray(b, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if case.op == "group_norm":
            gshape, axes, cf = _group_axes(case)
            xg = x.reshape(gshape)
            m = xg.mean(axes, keepdims=True)
            v = ((xg - m) ** 2).mean(axes, keepdims=True)
            xh = ((xg - m) / np.sqrt(v + EPS)).reshape(x.shape)
            bshape = [1] * x.ndim
            bshape[1 if cf else -1] = -1
            return xh * s.reshape(bshape) + b.reshape(bshape)
        m = x.mean(case.reduce, keepdims=True) if case.centered else 0.0
        v = ((x - m) ** 2).mean(case.reduce, keepdims=True)
        y = (x - m) / np.sqrt(v + EPS) * case.pexpand(s)
        if case.centered:  # RMS norm has no bias
            y = y + case.pexpand(b)
        if case.op == "batch_norm":
            return y, np.reshape(m, -1), np.reshape(v, -1)
        return y


@functools.cache
def jnp_reference(case):
    """The op in jnp (float64 inputs), for gradient references."""
    def f(x, s, b):
        if case.op == "group_norm":
            gshape, axes, cf = _group_axes(case)
            xg = x.reshape(gshape)
            m = xg.mean(axes, keepdims=True)
            v = jnp.square(xg - m).mean(axes, keepdims=True)
            xh = ((xg - m) * lax.rsqrt(v + EPS)).reshape(x.shape)
            bshape = [1] * x.ndim
            bshape[1 if cf else -1] = -1
            return xh * s.reshape(bshape) + b.reshape(bshape)
        m = x.mean(case.reduce, keepdims=True) if case.centered else 0.0
        v = jnp.square(x - m).mean(case.reduce, keepdims=True)
        y = (x - m) * lax.rsqrt(v + EPS) * case.pexpand(s)
        if case.centered:
            y = y + case.pexpand(b)
        if case.op == "batch_norm":
            return y, jnp.reshape(m, -1), jnp.reshape(v, -1)
        return y
    return f


def _stat(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def _inputs(case, dtype, seed=0):
    """x, and scale/bias in the statistics dtype (float64 for float64 x, else float32)."""
    rng = np.random.default_rng(seed)
    x = rand(rng, case.shape, dtype, scale=2.0, offset=0.5)
    s = rand(rng, case.pshape, _stat(dtype))
    b = rand(rng, case.pshape, _stat(dtype))
    return x, s, b


# ----------------------------------------------------------------------------------------------
# Forward and backward against the references
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES + FORWARD_ONLY, ids=repr)
def test_forward(case, dtype, platform):
    x, s, b = _inputs(case, dtype)
    _check_forward(case, dtype, (x, s, b), jax.jit(case.run)(*on(platform, x, s, b)))


def _check_forward(case, dtype, args, out):
    """The op's output(s) `out` on inputs `args` against the float64 reference."""
    ref = reference(case, *args)
    if case.op == "batch_norm":
        y, mean, var = out
        ref_y, ref_m, ref_v = ref
        sd = _stat(dtype)
        assert mean.dtype == sd and var.dtype == sd
        tol = max(TOL[np.dtype(sd)], 1e-6)
        assert_close(mean, ref_m, sd, tol=tol, what="mean")
        assert_close(var, ref_v, sd, tol=tol, what="var")
    else:
        y, ref_y = out, ref
    assert y.dtype == np.dtype(dtype) and y.shape == case.shape
    assert_close(y, ref_y, dtype, what="y")


def _registry(direction, platform):
    """Every algorithm name of `platform`'s norm registry for `direction` (a problem's listing
    names them all, supported or not); skips where the machine lacks the platform."""
    from jaxdnn.ops.norm import NormShape
    from jaxdnn.selection.norm import NormProblem
    device(platform)
    problem = NormProblem(direction, NormShape(1, 1, 1, 1, 1), np.dtype(np.float32))
    return [a.name for a in jaxdnn.norm_algorithms(problem, "cuda" if platform == "gpu" else
                                                   platform)]


def _forced(platform, run, name):
    """run(algo=name) on `platform`, or None where the algorithm cannot run the problem (the
    ValueError that names it)."""
    try:
        return run(algo=name)
    except ValueError as e:
        assert f"'{name}' cannot run" in str(e), e
        return None


# Every training forward algorithm of each platform against the float64 reference on a grid
# that reaches each one: the row path; channels-last rows of whole 16-byte vectors (every column
# algorithm in 4-byte types) and of 3 values; channels-first segments of 16x16 (single pass,
# three pass, two calls) and of 16x40 values (the split forwards).
ALGO_GRID = [layer_case("layer_norm", (5, 40)), batch_case((4, 6, 5, 16)), batch_case((5, 7, 3)),
             group_case((3, 6, 5, 24), 8, "NHWC"), batch_case((2, 16, 16, 16), 1),
             batch_case((3, 5, 16, 40), 1), group_case((2, 12, 16, 36), 4, "NCHW")]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_training_forward_algorithm(platform, dtype):
    ran = set()
    for name in _registry("fwd", platform):
        for case in ALGO_GRID:
            x, s, b = _inputs(case, dtype)
            args = on(platform, x, s, b)
            out = _forced(platform, lambda algo: jax.jit(
                lambda *a: case.run(*a, algo=algo))(*args), name)
            if out is not None:
                _check_forward(case, dtype, (x, s, b), out)
                ran.add(name)
    missing = set(_registry("fwd", platform)) - ran
    if dtype == jnp.bfloat16:  # (the flat apply is for 4- and 8-byte types)
        missing -= {"column_two_call_flat", "column_three_pass_flat"}
    assert not missing, missing


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_inference_algorithm(platform):
    rng = np.random.default_rng(3)
    ran = set()
    for name in _registry("infer", platform):
        for shape, axis in [((5,), 0), ((4, 5, 8), -1), ((4, 5, 3), -1), ((3, 4, 5, 6), 1)]:
            c = shape[axis]
            x = rand(rng, shape, jnp.float32)
            s, b, m = (rand(rng, (c,), jnp.float32) for _ in range(3))
            v = np.abs(rand(rng, (c,), jnp.float32)) + 0.1
            args = on(platform, x, s, b, m, v)
            y = _forced(platform, lambda algo: jax.jit(lambda *a: jaxdnn.batch_norm_inference(
                *a, axis=axis, algo=algo))(*args), name)
            if y is None:
                continue
            ex = lambda p: np.asarray(p, np.float64).reshape(
                [c if i == axis % len(shape) else 1 for i in range(len(shape))])
            ref = (np.asarray(x, np.float64) - ex(m)) / np.sqrt(ex(v) + EPS) * ex(s) + ex(b)
            assert_close(y, ref, jnp.float32, what=f"y ({name})")
            ran.add(name)
    assert ran == set(_registry("infer", platform))


# Large tensors (larger than the L2 and what the single-pass kernels stash in shared memory,
# ~27 MB on an H200) on every supported GPU training forward: channels-last, each single-pass
# block both stashing rows and re-reading streamed ones, several row slices per (sample, column
# tile); channels-first with 9216-value segments (the split forward, several pieces per segment)
# and 256-value ones. Results are bitwise identical from run to run.
LARGE = [batch_case((16, 64, 64, 256)), batch_case((16, 256, 96, 96), 1),
         group_case((8, 64, 64, 256), 32), group_case((16, 256, 96, 96), 32, "NCHW"),
         batch_case((128, 256, 16, 16), 1)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", LARGE, ids=repr)
@needs_gpu
def test_training_forward_large(case, dtype):
    x, s, b = _inputs(case, dtype)
    args = on("gpu", x, s, b)
    for name in _registry("fwd", "gpu"):
        f = jax.jit(lambda *a: case.run(*a, algo=name))
        first = _forced("gpu", lambda algo: f(*args), name)
        if first is None:
            continue
        second = f(*args)
        for u, v in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(second)):
            np.testing.assert_array_equal(u, v)
        _check_forward(case, dtype, (x, s, b), first)


# The two-call algorithms lower to two custom calls, statistics then apply, the others to one;
# the split forward's and the segment path's two-call forms run the same kernels as their one-
# call forms, so their results are bitwise equal. By default a channels-last float32 batch or
# group norm and a channels-first one with segments of at least 512 values take two calls.
@pytest.mark.parametrize("case,pairs,default_two", [
    (batch_case((3, 5, 16, 40), 1), [("segment_split_two_call", "segment_split"),
                                     ("segment_two_call", "segment_three_pass")], True),
    (batch_case((2, 3, 1037), 1), [("segment_two_call", "segment_three_pass")], True),
    (batch_case((4, 6, 10, 16)), [("column_two_call", "column_three_pass"),
                                  ("column_two_call_flat", "column_three_pass_flat")], True),
    (batch_case((2, 16, 8, 8), 1), [("segment_two_call", "segment_three_pass")], False)],
    ids=repr)
@needs_gpu
def test_two_call_forward(case, pairs, default_two):
    x, s, b = _inputs(case, jnp.float32)
    args = on("gpu", x, s, b)

    def run(algo):
        f = jax.jit(lambda *a: case.run(*a, algo=algo))
        return re.findall(r"custom_call @(\w+)", f.lower(*args).as_text()), f(*args)

    two_targets = [_ffi.target_name("jaxdnn_norm_fwd_stats"),
                   _ffi.target_name("jaxdnn_norm_fwd_apply")]
    assert (run(None)[0] == two_targets) == default_two
    for two_name, one_name in pairs:
        (two_calls, two), (one_call, one) = run(two_name), run(one_name)
        assert two_calls == two_targets, two_calls
        assert one_call == [_ffi.target_name("jaxdnn_norm_fwd")], one_call
        for u, v in zip(jax.tree_util.tree_leaves(two), jax.tree_util.tree_leaves(one)):
            np.testing.assert_array_equal(u, v)
        _check_forward(case, jnp.float32, (x, s, b), two)


# ---- the registry's listing and forced algorithms -------------------------------------------

@pytest.mark.parametrize("direction", ["fwd", "infer", "bwd"])
def test_norm_algorithms_listing(direction):
    from jaxdnn.ops.norm import NormShape
    from jaxdnn.selection.norm import NormProblem
    problem = NormProblem(direction, NormShape(P=1, A=8, C=4, K=1, T=1), np.dtype(np.float32))
    infos = jaxdnn.norm_algorithms(problem, "cpu")
    assert [a.name for a in infos] == ["column", "row", "segment"]
    assert [a.supported for a in infos] == [True, False, False]
    assert all(a.reason for a in infos[1:]) and "column path" in infos[1].reason
    assert infos[0].rank == 0 and infos[0].direction == direction


@needs_cuda_module
def test_norm_cuda_listing():
    from jaxdnn.ops.norm import NormShape
    from jaxdnn.selection.norm import NormProblem
    problem = NormProblem("fwd", NormShape(P=1, A=8, C=4, K=1, T=1), np.dtype(np.float32))
    infos = {a.name: a for a in jaxdnn.norm_algorithms(problem, "cuda")}
    assert set(infos) == {"row", "column_two_call_flat", "column_two_call", "column_single_pass",
                          "column_three_pass_flat", "column_three_pass", "segment_split_two_call",
                          "segment_split", "segment_single_pass", "segment_two_call",
                          "segment_three_pass"}
    assert not infos["row"].supported and "row path" in infos["row"].reason
    assert infos["column_two_call"].supported


def test_forced_norm_algorithm():
    x = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    with jax.default_device(jax.devices("cpu")[0]):
        y = jax.jit(lambda x: jaxdnn.layer_norm(x, None, None, algo="row"))(x)
        ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + EPS)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="'column' cannot run"):
            jaxdnn.layer_norm(x, None, None, algo="column")
        with pytest.raises(ValueError, match="unknown norm algorithm 'nope'"):
            jaxdnn.batch_norm(x, None, None, algo="nope")
        with pytest.raises(TypeError, match="`algo` must be None or an algorithm name"):
            jaxdnn.group_norm(x, None, None, groups=2, algo=3)


@functools.cache
def _vjp_fn(case, f):
    """Jitted (args, cotangents) -> (dx, dscale, dbias); cached so that every dtype of a case
    shares one compiled float64 reference."""
    @jax.jit
    def run(args, cts):
        _, vjp = jax.vjp(f, *args)
        return vjp(tuple(cts) if case.op == "batch_norm" else cts[0])
    return run


def _vjp(case, f, args, cts):
    return _vjp_fn(case, f)(args, cts)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_backward(case, dtype, platform):
    """dx, dscale, dbias (and the statistics outputs' cotangents for batch norm)."""
    x, s, b = _inputs(case, dtype)
    rng = np.random.default_rng(1)
    cts = [rand(rng, case.shape, dtype)]
    if case.op == "batch_norm":
        cts += [rand(rng, case.pshape, _stat(dtype)), rand(rng, case.pshape, _stat(dtype))]
    dx, ds, db = _vjp(case, case.run, [on(platform, a) for a in (x, s, b)],
                      [on(platform, c) for c in cts])
    f64 = lambda a: jnp.asarray(np.asarray(a, np.float64))
    with jax.default_device(jax.devices("cpu")[0]):
        rdx, rds, rdb = _vjp(case, jnp_reference(case), [f64(a) for a in (x, s, b)],
                             [f64(c) for c in cts])
    assert dx.dtype == np.dtype(dtype) and ds.dtype == _stat(dtype)
    assert_close(dx, rdx, dtype, scale=_dx_scale(case, s, cts[0]), what="dx")
    assert_close(ds, rds, dtype, what="dscale")
    if case.centered:
        assert_close(db, rdb, dtype, what="dbias")
    else:
        np.testing.assert_array_equal(db, 0)


def _group_size(case):
    """How many values each statistic reduces."""
    if case.op == "group_norm":
        gshape, axes, _ = _group_axes(case)
        return int(np.prod([gshape[a] for a in axes]))
    return int(np.prod([case.shape[a] for a in case.reduce]))


def _dx_scale(case, s, ct):
    """The elementwise bound's scale for dx (None: the default, the RMS of the reference). A
    group of one value has variance 0, so rstd = 1/sqrt(eps) ~ 316 multiplies every term of
    dx = rstd * (s ct - mean(s ct) - xhat mean(s ct xhat)), terms that cancel to a result of
    0 (layer norm) or ~1 (batch norm, through the statistics' cotangents)."""
    if _group_size(case) != 1:
        return None
    return np.sqrt(np.mean(np.square(np.asarray(ct, np.float64)))) * \
        np.max(np.abs(np.asarray(s, np.float64))) / np.sqrt(EPS)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("used", ["mean", "var", "neither"])
def test_backward_unused_statistics(used, platform):
    """Statistics outputs the loss never reads reach the backward kernel as empty cotangents
    (read as zero, no fill kernel ahead of it); the gradient through the used one counts."""
    case = batch_case((37, 5))
    x, s, b = _inputs(case, jnp.float32)

    def loss(f):
        def total(x, s, b):
            y, m, v = f(x, s, b)
            extra = {"mean": jnp.sum(m * m), "var": jnp.sum(jnp.cos(v)), "neither": 0.0}[used]
            return jnp.sum(jnp.sin(y)) + extra
        return jax.grad(total, argnums=(0, 1, 2))

    got = jax.jit(loss(case.run))(*on(platform, x, s, b))
    with jax.default_device(jax.devices("cpu")[0]):
        want = loss(jnp_reference(case))(*(np.asarray(a, np.float64) for a in (x, s, b)))
    for g, w, what in zip(got, want, ("dx", "dscale", "dbias")):
        assert_close(g, w, jnp.float32, what=what)
    text = jax.jit(loss(case.run)).lower(x, s, b).as_text()
    (call,) = [ln for ln in text.splitlines() if "@jaxdnn_norm_bwd" in ln]
    operands = call.split(": (")[-1].split(") ->")[0].split(", ")  # dy, dmean, dvar, ...
    assert operands[1:3].count("tensor<0xf32>") == {"mean": 1, "var": 1, "neither": 2}[used], call


# The CUDA row backward runs one wave of blocks, each walking its rows through a ring of 2-4
# stages of x and dy in shared memory (cc/norm/cuda_row.cu): these shapes give each row group
# more rows than stages, so the ring wraps. 4096-wide rows: 256 threads per row (16 values
# each), 4 stages in 16-bit types, 3 in float32; 40-wide: four rows per block (a warp each);
# 1001-wide: single values (16-bit ones copied through registers), 126 threads of 8; 8192-wide:
# 512 threads per row (one block per SM), 2 stages in float32; 16384-wide: 512 threads x 32
# values in bfloat16, and in float32 the streaming kernel with its sums in shared memory (the
# (2, 40003) rows of LAYER stream with them in the workspace).
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", [layer_case("layer_norm", (1500, 4096)),
                                  layer_case("rms_norm", (1500, 4096)),
                                  layer_case("layer_norm", (24000, 40)),
                                  layer_case("layer_norm", (3000, 1001)),
                                  layer_case("layer_norm", (1500, 8192)),
                                  layer_case("rms_norm", (600, 16384))], ids=repr)
@needs_gpu
def test_row_backward_ring(case, dtype):
    test_backward(case, dtype, "gpu")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,axis", [((4, 5, 3), -1), ((3, 4, 5, 6), 1), ((2000, 3), 0)])
def test_batch_norm_inference(shape, axis, dtype, platform):
    rng = np.random.default_rng(2)
    c = shape[axis]
    x = rand(rng, shape, dtype)
    s, b, m = (rand(rng, (c,), _stat(dtype)) for _ in range(3))
    v = np.abs(rand(rng, (c,), _stat(dtype))) + 0.1
    bshape = [1] * len(shape)
    bshape[axis] = c
    ex = lambda p: np.asarray(p, np.float64).reshape(bshape)
    y = jax.jit(lambda *a: jaxdnn.batch_norm_inference(*a, axis=axis))(*on(platform, x, s, b, m, v))
    ref = (np.asarray(x, np.float64) - ex(m)) / np.sqrt(ex(v) + EPS) * ex(s) + ex(b)
    assert_close(y, ref, dtype, what="y")
    ct = rand(rng, shape, dtype)
    grads = jax.jit(lambda a, ct: jax.vjp(lambda *a: jaxdnn.batch_norm_inference(*a, axis=axis),
                                          *a)[1](ct))(on(platform, x, s, b, m, v), on(platform, ct))
    f64 = lambda a: jnp.asarray(np.asarray(a, np.float64))
    with jax.default_device(jax.devices("cpu")[0]):
        def jref(x, s, b, m, v):
            r = s.reshape(bshape) * lax.rsqrt(v.reshape(bshape) + EPS)
            return (x - m.reshape(bshape)) * r + b.reshape(bshape)
        rgrads = jax.jit(lambda a, ct: jax.vjp(jref, *a)[1](ct))(tuple(map(f64, (x, s, b, m, v))),
                                                                 f64(ct))
    for g, r, name in zip(grads, rgrads, ("dx", "dscale", "dbias", "dmean", "dvar")):
        assert_close(g, r, dtype, what=name)


# ----------------------------------------------------------------------------------------------
# Numerics: NaN/inf, constant groups, large offsets
# ----------------------------------------------------------------------------------------------

NUMERIC_CASES = [layer_case("layer_norm", (4, 37)), layer_case("rms_norm", (4, 37)),
                 layer_case("layer_norm", (3, 2500)), batch_case((40, 5)),
                 batch_case((3, 4, 37), 1), group_case((2, 6, 4), 2),
                 group_case((2, 4, 6), 2, "NCW"), batch_case((2, 3, 768), 1)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", NUMERIC_CASES, ids=repr)
def test_nan_inf_propagate(case, dtype, platform):
    x, s, b = _inputs(case, dtype)
    x = np.array(x)
    flat = x.reshape(-1)
    flat[1] = np.nan
    flat[-2] = np.inf
    out = jax.jit(case.run)(*on(platform, x, s, b))
    y = out[0] if case.op == "batch_norm" else out
    assert_close(y, reference(case, x, s, b)[0] if case.op == "batch_norm"
                 else reference(case, x, s, b), dtype, what="y")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", NUMERIC_CASES, ids=repr)
def test_constant_groups(case, dtype, platform):
    """Zero variance: y is exactly the bias (finite), and so is the gradient."""
    _, s, b = _inputs(case, dtype)
    x = np.full(case.shape, 3.0, dtype)
    xd, sd, bd = on(platform, x, s, b)
    out = jax.jit(case.run)(xd, sd, bd)
    y = np.asarray(out[0] if case.op == "batch_norm" else out, np.float64)
    ref = reference(case, x, s, b)
    ref = ref[0] if case.op == "batch_norm" else ref
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, ref, atol=TOL[np.dtype(dtype)] * 10 + 1e-6)
    g = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(jax.tree_util.tree_leaves(
        case.run(x, sd, bd))[0]))))(xd)
    assert np.isfinite(np.asarray(g, np.float64)).all()


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", [layer_case("layer_norm", (3, 5000)), batch_case((3000, 4)),
                                  batch_case((4, 3, 777), 1), group_case((2, 300, 8), 2),
                                  group_case((2, 8, 300), 4, "NCW"),
                                  batch_case((4, 3, 1024), 1)], ids=repr)
def test_large_offset(case, dtype, platform):
    """Mean 1e4, unit spread. E[x^2] - E[x]^2 in float32 would lose every digit of the
    variance (its rounding error is ~1e8 * 6e-8 = 6 against a variance of 1); the one-pass
    stable algorithms keep the variance to float32 accuracy. y is then limited by the float32
    rounding of the mean itself (ulp(1e4)/2 = 5e-4 against a unit spread), as in any float32
    implementation that stores the mean."""
    rng = np.random.default_rng(3)
    x = rand(rng, case.shape, dtype, offset=1e4)
    s, b = (rand(rng, case.pshape, _stat(dtype)) for _ in range(2))
    out = jax.jit(case.run)(*on(platform, x, s, b))
    ref = reference(case, x, s, b)
    f32 = np.dtype(dtype) == np.float32
    # Elementwise, the errors scale with the offset, not with the unit-spread results: the
    # mean's terms are ~1e4, the variance's (x - mean)^2 carry x's rounding (~eps * 1e4 each, 2x
    # through the square), and y = (x - mean) * rstd * s that of the mean (rstd ~ 1).
    n = _group_size(case)
    if case.op == "batch_norm":
        assert_close(out[1], ref[1], dtype, scale=1e4, k=n, what="mean")
        assert_close(out[2], ref[2], dtype, scale=2e4, k=n, what="var")
        out, ref = out[0], ref[0]
    assert_close(out, ref, dtype, tol=1e-3 if f32 else None, k=n,
                 scale=1e4 * np.max(np.abs(np.asarray(s, np.float64))), what="y")


@pytest.mark.parametrize("axis", [-1, 1], ids=["NHWC", "NCHW"])
def test_cpu_bfloat16_output_rounding(axis):
    """The CPU kernels' bfloat16 stores (column and segment paths) round float32 to nearest
    even and keep NaN, bit for bit. With mean 0 and var + eps = 1 the kernel's float32 y is
    exactly x * scale + 0, which numpy computes exactly as well (8 x 9 significant bits), so y
    must equal ml_dtypes' rounding of it, ties included (95 of these 9600 values)."""
    rng = np.random.default_rng(7)
    C = 16
    shape = (3, 40, 5, C) if axis == -1 else (3, C, 40, 5)
    x = rng.standard_normal(shape).astype(jnp.bfloat16)
    flat = x.reshape(-1)
    flat[::97], flat[5], flat[6] = np.nan, np.inf, -np.inf
    scale = (1 + rng.integers(0, 256, C) / 256).astype(np.float32)
    zeros = np.zeros(C, np.float32)
    y = jaxdnn.batch_norm_inference(*on("cpu", x, scale, zeros, zeros, zeros + 0.75), axis=axis,
                                    eps=0.25)
    bshape = (C,) if axis == -1 else (C, 1, 1)
    expect = (x.astype(np.float32) * scale.reshape(bshape) + np.float32(0)).astype(jnp.bfloat16)
    y = np.asarray(y)
    nan = np.isnan(expect.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(y.astype(np.float32)), nan)
    np.testing.assert_array_equal(y.view(np.uint16)[~nan], expect.view(np.uint16)[~nan])


@pytest.mark.parametrize("platform", PLATFORMS)
def test_empty(platform):
    x, s, b = on(platform, np.zeros((0, 8), np.float32), np.ones(8, np.float32),
                 np.zeros(8, np.float32))
    assert jaxdnn.layer_norm(x, s, b).shape == (0, 8)
    y, m, v = jaxdnn.batch_norm(x, s, b)
    assert y.shape == (0, 8) and np.isnan(np.asarray(m)).all() and np.isnan(np.asarray(v)).all()
    g = jax.grad(lambda s: jaxdnn.batch_norm(x, s, b)[0].sum())(s)
    np.testing.assert_array_equal(g, np.zeros(8))
    g = jax.grad(lambda m: jaxdnn.batch_norm_inference(x, s, b, m, s).sum())(s)
    np.testing.assert_array_equal(g, np.zeros(8))
    assert jaxdnn.group_norm(on(platform, np.zeros((2, 0, 4), np.float32)), None, None,
                             groups=2).shape == (2, 0, 4)


# ----------------------------------------------------------------------------------------------
# Transformations: our backward kernels run, jvp, vmap, vmap(grad), check_grads
# ----------------------------------------------------------------------------------------------

def _loss(case):
    def f(x, s, b):
        out = case.run(x, s, b)
        if case.op == "batch_norm":
            y, m, v = out
            return jnp.sum(jnp.sin(y)) + jnp.sum(m * v)
        return jnp.sum(jnp.sin(out))
    return f


# One case per op and kernel path (row, column, segment).
GRAD_CASES = [layer_case("layer_norm", (3, 4, 5), (1, 2)), layer_case("rms_norm", (4, 6)),
              batch_case((40, 3)), batch_case((3, 2, 4), 1), group_case((2, 3, 4), 2),
              group_case((2, 4, 3), 2, "NCW")]


@pytest.mark.parametrize("case", GRAD_CASES, ids=repr)
def test_grad_runs_backward_kernel(case):
    x, s, b = _inputs(case, jnp.float32)
    text = jax.jit(jax.grad(_loss(case), argnums=(0, 1, 2))).lower(x, s, b).as_text()
    assert "jaxdnn_norm_bwd" in text
    assert "jaxdnn_norm_fwd" in text


def test_inference_grad_runs_backward_kernel():
    args = [np.ones((4, 3), np.float32)] + [np.ones(3, np.float32)] * 4
    f = lambda *a: jaxdnn.batch_norm_inference(*a).sum()
    assert "jaxdnn_norm_infer_bwd" in jax.jit(jax.grad(f, argnums=(0, 1, 2, 3, 4))).lower(
        *args).as_text()


@pytest.mark.parametrize("platform", PLATFORMS)
def test_check_grads(platform):
    """Second order, forward and reverse, for every op and kernel path at once: one loss sums
    the GRAD_CASES losses and batch_norm_inference's, each on its own inputs, all raveled into
    one vector (one compiled program per derivative, and check_grads' own arithmetic on a
    single shape)."""
    rng = np.random.default_rng(4)
    inputs = [_inputs(case, jnp.float64) for case in GRAD_CASES]
    x = rand(rng, (5, 3), jnp.float64)
    s, b, m = (rand(rng, (3,), jnp.float64) for _ in range(3))
    inference = (x, s, b, m, np.abs(rand(rng, (3,), jnp.float64)) + 0.5)

    def loss(inputs, inference):
        total = sum(_loss(case)(*args) for case, args in zip(GRAD_CASES, inputs))
        return total + jnp.sum(jnp.sin(jaxdnn.batch_norm_inference(*inference)))

    flat, unravel = ravel_pytree((inputs, inference))
    check_grads(jax.jit(lambda v: loss(*unravel(v))), (on(platform, flat),), order=2,
                modes=("fwd", "rev"))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", GRAD_CASES, ids=repr)
def test_jvp_matches_reference(case, platform):
    rng = np.random.default_rng(5)
    x, s, b = _inputs(case, jnp.float64)
    t = (rand(rng, x.shape, np.float64), rand(rng, s.shape, np.float64),
         rand(rng, b.shape, np.float64))
    jvp = jax.jit(lambda f, a, t: jax.jvp(f, a, t), static_argnums=0)
    _, out = jvp(case.run, on(platform, x, s, b), on(platform, *t))
    with jax.default_device(jax.devices("cpu")[0]):
        _, ref = jvp(jnp_reference(case), (x, s, b), t)
    for o, r in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        assert_close(o, r, jnp.float64)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", GRAD_CASES, ids=repr)
def test_vmap_and_vmap_grad(case, platform):
    """A mapped axis keeps independent statistics per index (also with a mapped scale)."""
    rng = np.random.default_rng(6)
    xs = rand(rng, (3, *case.shape), jnp.float32)
    ss = rand(rng, (3, *case.pshape), jnp.float32)
    _, s, b = _inputs(case, jnp.float32)
    xs, ss, s, b = on(platform, xs, ss, s, b)
    f = jax.jit(lambda x, s: case.run(x, s, b))
    pick = lambda a, ax, i: a if ax is None else a[i]
    for in_axes, args in (((0, None), (xs, s)), ((0, 0), (xs, ss)), ((None, 0), (xs[0], ss))):
        got = jax.jit(jax.vmap(f, in_axes=in_axes))(*args)
        want = [f(*(pick(a, ax, i) for a, ax in zip(args, in_axes))) for i in range(3)]
        for g, w in zip(jax.tree_util.tree_leaves(got),
                        zip(*[jax.tree_util.tree_leaves(w) for w in want])):
            assert_close(g, np.stack(w), jnp.float32)
        grad = jax.jit(jax.grad(lambda x, s: _loss(case)(x, s, b), argnums=(0, 1)))
        got = jax.jit(jax.vmap(grad, in_axes=in_axes))(*args)
        want = [grad(*(pick(a, ax, i) for a, ax in zip(args, in_axes))) for i in range(3)]
        for g, w in zip(got, zip(*want)):
            assert_close(g, np.stack(w), jnp.float32)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", [layer_case("layer_norm", (700, 256)), batch_case((3000, 4)),
                                  batch_case((4, 3, 777), 1)], ids=repr)
def test_deterministic(case, platform):
    """Bitwise identical results run to run (multi-block reductions included)."""
    args = on(platform, *_inputs(case, jnp.float32))
    f = jax.jit(jax.value_and_grad(_loss(case), argnums=(0, 1, 2)))
    first, second = f(*args), f(*args)
    for u, v in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(second)):
        np.testing.assert_array_equal(u, v)


@needs_cuda_module
def test_cuda_lowering():
    x = np.ones((4, 8), np.float32)
    f = jax.jit(jax.grad(lambda x: jaxdnn.layer_norm(x, None, None).sum()))
    text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "jaxdnn_norm_fwd" in text and "jaxdnn_norm_bwd" in text


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------

def test_bad_input():
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="axis"):
        jaxdnn.layer_norm(x, None, None, axis=3)
    with pytest.raises(ValueError, match="axis"):
        jaxdnn.layer_norm(x, None, None, axis=(1, -2))
    with pytest.raises(ValueError, match="axis"):
        jaxdnn.batch_norm(x, None, None, axis=-4)
    with pytest.raises(ValueError, match="scale"):
        jaxdnn.layer_norm(x, np.ones(3), None)
    with pytest.raises(ValueError, match="bias"):
        jaxdnn.batch_norm(x, np.ones(4), np.ones(3))
    with pytest.raises(ValueError, match="scale"):
        jaxdnn.rms_norm(x, np.ones((2, 4)))
    with pytest.raises(ValueError, match="mean"):
        jaxdnn.batch_norm_inference(x, None, None, np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="groups"):
        jaxdnn.group_norm(x, None, None, groups=3)
    with pytest.raises(ValueError, match="groups"):
        jaxdnn.group_norm(x, None, None, groups=0)
    with pytest.raises(ValueError, match="layout"):
        jaxdnn.group_norm(x, None, None, groups=2, layout="NHWC")
    with pytest.raises(ValueError, match="scale"):
        jaxdnn.group_norm(x, np.ones(3), None, groups=2)
    with pytest.raises(TypeError, match="dtype"):
        jaxdnn.layer_norm(np.ones((2, 3), np.int32), None, None)
    with pytest.raises(TypeError, match="scale"):
        jaxdnn.layer_norm(x, np.ones(4, np.int32), None)
    with pytest.raises(ValueError, match="eps"):
        jaxdnn.layer_norm(x, None, None, eps=-1.0)
    with pytest.raises(TypeError, match="axis"):
        jaxdnn.batch_norm(x, None, None, axis=1.5)
