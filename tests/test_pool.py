"""Pooling against jax.lax.reduce_window in float64: forward, backward, ties, NaN/inf, layouts,
transformations, gradient checks and bad input."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jaxdnn
from util import DTYPES, PLATFORMS, assert_close, device, needs_cuda_module, needs_gpu, on, rand

CPU = jax.devices("cpu")[0]


@pytest.fixture(autouse=True)
def _skip_missing_platform(request):
    """Skip a test parametrized on a platform this machine lacks before any work."""
    platform = getattr(request.node, "callspec", None) and request.node.callspec.params.get(
        "platform")
    if platform:
        device(platform)


# (channels-last shape, window, strides, padding) covering 1-D/2-D/3-D, default strides,
# every padding form, odd and size-1 dims, channel counts on and off the vector width, windows
# made only of padding, int32 selection indices (window > 254) and multi-block problems.
CASES = {
    "1d_valid": ((3, 17, 5), 3, 2, "VALID"),
    "1d_same_default_stride": ((2, 16, 4), 4, None, "SAME"),
    "1d_pad_only_windows": ((2, 5, 3), 2, 1, [(3, 0)]),
    "2d_resnet_odd": ((2, 9, 11, 6), 3, 2, 1),
    "2d_2x2": ((1, 8, 8, 8), 2, None, "VALID"),
    "2d_asym_pad": ((2, 7, 5, 4), (2, 3), (1, 2), [(1, 0), (2, 1)]),
    "2d_size1": ((2, 1, 6, 5), (1, 3), 1, "SAME"),
    "2d_wide_c": ((2, 12, 10, 130), 3, 2, 1),
    "2d_c128": ((2, 7, 9, 128), 2, 2, "SAME"),
    "2d_multiblock": ((3, 23, 29, 64), 3, 2, 1),
    "2d_int32_index": ((2, 40, 40, 8), 16, 8, "VALID"),
    "3d_same": ((2, 5, 6, 7, 3), (2, 3, 2), (2, 1, 2), "SAME"),
    "3d_overlap": ((1, 4, 4, 4, 8), 3, 1, 1),
}
# Global pooling: (shape, dtype); every dtype on the vector path, the multi-block split path
# (and int32 indices) in float32/bfloat16, 1-D/3-D and the scalar path (C=3) once each.
GLOBAL_CASES = [*(((3, 13, 11, 16), d) for d in DTYPES),
                ((2, 40, 48, 24), jnp.float32), ((2, 40, 48, 24), jnp.bfloat16),
                ((2, 7, 5), jnp.float64), ((2, 3, 4, 5, 8), jnp.float16),
                ((2, 30, 30, 3), jnp.float32)]
OPS = ("max", "avg", "avg_exclude_pad")


# ----------------------------------------------------------------------------------------------
# Independent float64 references (channels-last)
# ----------------------------------------------------------------------------------------------

def _tuple(v, nd):
    return (v,) * nd if isinstance(v, int) else tuple(v)


def _pads(shape, window, strides, padding):
    """Explicit (lo, hi) pairs, SAME computed here (TensorFlow's rule) rather than by lax."""
    nd = len(shape) - 2
    if padding == "VALID":
        return [(0, 0)] * nd
    if padding == "SAME":
        out = []
        for n, w, s in zip(shape[1:-1], window, strides):
            total = max((math.ceil(n / s) - 1) * s + w - n, 0)
            out.append((total // 2, total - total // 2))
        return out
    if isinstance(padding, int):
        return [(padding, padding)] * nd
    return [tuple(p) for p in padding]


def _geometry(shape, window, strides, padding):
    nd = len(shape) - 2
    window = _tuple(window, nd)
    strides = window if strides is None else _tuple(strides, nd)
    return window, strides, _pads(shape, window, strides, padding)


def _out_shape(shape, window, strides, pads):
    return (shape[0], *((n + lo + hi - w) // s + 1 for n, w, s, (lo, hi)
                        in zip(shape[1:-1], window, strides, pads)), shape[-1])


def ref_pool(x, op, window, strides, pads):
    """lax.reduce_window in float64 on the CPU."""
    x = jnp.asarray(x, jnp.float64)
    dims, strd = (1, *window, 1), (1, *strides, 1)
    pad = ((0, 0), *pads, (0, 0))
    if op == "max":
        return lax.reduce_window(x, -jnp.inf, lax.max, dims, strd, pad)
    total = lax.reduce_window(x, 0.0, lax.add, dims, strd, pad)
    if op == "avg":
        return total / np.prod(window)
    count = lax.reduce_window(jnp.ones(x.shape[1:-1]), 0.0, lax.add, window, strides, pads)
    return total / count[None, ..., None]


def ours(x, op, window, strides, padding, layout=None, algo=None):
    if op == "max":
        return jaxdnn.max_pool(x, window, strides, padding, layout=layout, algo=algo)
    return jaxdnn.avg_pool(x, window, strides, padding, count_include_pad=op == "avg",
                           layout=layout, algo=algo)


def as_input(rng, shape, dtype, op):
    """Random inputs; for max pooling a scaled permutation (no ties unless the dtype rounds)."""
    if op == "max":
        return (rng.permutation(int(np.prod(shape))).reshape(shape) / np.prod(shape) - 0.5
                ).astype(np.dtype(dtype))
    return rand(rng, shape, dtype)


def ref_vjp(x, ct, op, window, strides, pads):
    with jax.default_device(CPU):
        _, vjp = jax.vjp(lambda v: ref_pool(v, op, window, strides, pads),
                         jnp.asarray(np.asarray(x, np.float64)))
        return vjp(jnp.asarray(np.asarray(ct, np.float64)))[0]


# ----------------------------------------------------------------------------------------------
# Forward and backward against lax
# ----------------------------------------------------------------------------------------------

def fwd_and_vjp(f):
    """One jitted function returning f(x) and the vjp of f at x applied to ct."""
    def run(x, ct):
        y, vjp = jax.vjp(f, x)
        return y, vjp(ct)[0]
    return jax.jit(run)


@functools.cache
def _ref_runner(op, window, strides, pads):
    return fwd_and_vjp(lambda v: ref_pool(v, op, window, strides, pads))


def ref_fwd_and_vjp(x, ct, op, window, strides, pads):
    """Reference y and vjp in float64 on the CPU (one compilation per problem, shared by the
    dtypes and platforms)."""
    run = _ref_runner(op, tuple(window), tuple(strides), tuple(map(tuple, pads)))
    with jax.default_device(CPU):
        return run(jnp.asarray(x, jnp.float64), jnp.asarray(ct, jnp.float64))


# float32 and float64 on every case; the 16-bit dtypes on the cases that cover their vector
# widths (C % 8 == 0, two vectors per thread at C = 128, int32 indices), the scalar path and
# padding-only windows.
CASES_16BIT = ("1d_pad_only_windows", "2d_resnet_odd", "2d_2x2", "2d_c128", "2d_multiblock",
               "2d_int32_index", "3d_overlap")
CASE_DTYPES = [(c, d) for c in CASES for d in DTYPES
               if np.dtype(d).itemsize >= 4 or c in CASES_16BIT]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case, dtype", CASE_DTYPES, ids=lambda v: getattr(v, "__name__", v))
def test_forward_backward_match_lax(case, dtype, op, platform):
    shape, window, strides, padding = CASES[case]
    win, strd, pads = _geometry(shape, window, strides, padding)
    rng = np.random.default_rng(0)
    x = as_input(rng, shape, dtype, op)
    ct = rand(rng, _out_shape(shape, win, strd, pads), dtype)
    ref_y, ref_dx = ref_fwd_and_vjp(x, ct, op, win, strd, pads)
    y, dx = fwd_and_vjp(lambda v: ours(v, op, window, strides, padding))(*on(platform, x, ct))
    assert y.dtype == x.dtype and dx.dtype == x.dtype and dx.shape == x.shape
    assert_close(y, ref_y, dtype, what=f"{case} {op} fwd")
    assert_close(dx, ref_dx, dtype, what=f"{case} {op} bwd")


def _registry(platform, direction="fwd"):
    """Every algorithm name of `platform`'s pool registry for `direction`."""
    from jaxdnn.ops.pool import PoolSpec
    from jaxdnn.selection.pool import PoolProblem
    spec = PoolSpec((1, 4, 4, 8), (2, 2), (2, 2), ((0, 0), (0, 0)))
    problem = PoolProblem("max_fwd" if direction == "fwd" else "avg_bwd", spec,
                          np.dtype(np.float32))
    return [a.name for a in jaxdnn.pool_algorithms(problem, "cuda" if platform == "gpu" else
                                                   platform)]


# Every forward algorithm of each platform (forced) against lax, with the backward the
# platform's, on a grid that reaches each one: windows that tile the input (tile), 3x3/2
# windows (strip), a global window (global), and others (window).
ALGO_CASES = {"tile": ((2, 8, 12, 16), 2, 2, "VALID"), "strip": ((2, 9, 11, 16), 3, 2, 1),
              "global": ((2, 5, 7, 8), (5, 7), None, "VALID"), "other": ((2, 9, 7, 6), 3, 1, 1)}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_forward_algorithm(platform, dtype):
    ran = set()
    for name in _registry(platform):
        for case, (shape, window, strides, padding) in ALGO_CASES.items():
            win, strd, pads = _geometry(shape, window, strides, padding)
            rng = np.random.default_rng(0)
            for op in OPS:
                x = as_input(rng, shape, dtype, op)
                ct = rand(rng, _out_shape(shape, win, strd, pads), dtype)
                f = fwd_and_vjp(lambda v: ours(v, op, window, strides, padding, algo=name))
                try:
                    y, dx = f(*on(platform, x, ct))
                except ValueError as e:
                    assert f"'{name}' cannot run" in str(e), e
                    continue
                ref_y, ref_dx = ref_fwd_and_vjp(x, ct, op, win, strd, pads)
                assert_close(y, ref_y, dtype, what=f"{case} {op} fwd ({name})")
                assert_close(dx, ref_dx, dtype, what=f"{case} {op} bwd ({name})")
                ran.add(name)
    assert ran == set(_registry(platform))


def test_pool_algorithms_listing():
    from jaxdnn.ops.pool import PoolSpec
    from jaxdnn.selection.pool import PoolProblem
    spec = PoolSpec((1, 4, 4, 8), (2, 2), (2, 2), ((0, 0), (0, 0)))
    for op, direction, name in [("max_fwd", "fwd", "window"), ("max_fwd_index", "fwd", "window"),
                                ("avg_bwd", "bwd", "gather"), ("max_gather", "bwd", "gather")]:
        infos = jaxdnn.pool_algorithms(PoolProblem(op, spec, np.dtype(np.float32)), "cpu")
        assert [(a.name, a.supported, a.direction) for a in infos] == [(name, True, direction)]


@needs_cuda_module
def test_pool_cuda_listing():
    from jaxdnn.ops.pool import PoolSpec
    from jaxdnn.selection.pool import PoolProblem
    spec = PoolSpec((1, 9, 9, 8), (3, 3), (2, 2), ((1, 1), (1, 1)))
    infos = jaxdnn.pool_algorithms(PoolProblem("max_fwd", spec, np.dtype(np.float32)), "cuda")
    assert [a.name for a in infos] == ["strip", "window", "global", "tile"]
    assert [a.supported for a in infos] == [True, True, False, False]
    assert all(a.reason for a in infos[2:])
    odd = PoolSpec((1, 9, 9, 3), (3, 3), (2, 2), ((1, 1), (1, 1)))
    strip = jaxdnn.pool_algorithms(PoolProblem("avg_fwd", odd, np.dtype(np.float32)), "cuda")
    assert "16-byte" in {a.name: a for a in strip}["strip"].reason


def test_forced_pool_algorithm():
    x = np.random.default_rng(0).standard_normal((2, 6, 6, 4)).astype(np.float32)
    with jax.default_device(CPU):
        y = jax.jit(lambda x: jaxdnn.max_pool(x, 2, algo="window"))(x)
        np.testing.assert_array_equal(y, x.reshape(2, 3, 2, 3, 2, 4).max(axis=(2, 4)))
        with pytest.raises(ValueError, match="unknown pool algorithm 'gather'"):
            jaxdnn.avg_pool(x, 2, algo="gather")  # a backward algorithm
        with pytest.raises(ValueError, match="unknown pool algorithm 'tile'"):
            jaxdnn.max_pool(x, 2, algo="tile")  # the GPU's
        with pytest.raises(TypeError, match="`algo` must be None or an algorithm name"):
            jaxdnn.global_avg_pool(x, algo=1)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("shape, dtype", GLOBAL_CASES,
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_global_pooling(shape, dtype, platform):
    rng = np.random.default_rng(1)
    nd = len(shape) - 2
    spatial, window = tuple(range(1, nd + 1)), shape[1:-1]
    x = rand(rng, shape, dtype)
    ct = rand(rng, (shape[0], shape[-1]), dtype)
    y, dx = fwd_and_vjp(jaxdnn.global_avg_pool)(*on(platform, x, ct))
    x64, ct64 = np.asarray(x, np.float64), np.asarray(ct, np.float64)
    assert_close(y, x64.mean(spatial), dtype, what="global avg")
    assert_close(dx, np.broadcast_to(np.expand_dims(ct64, spatial), shape) / np.prod(window),
                 dtype, what="global avg bwd")
    keep = jaxdnn.global_avg_pool(on(platform, x), keepdims=True)
    assert keep.shape == (shape[0], *(1,) * nd, shape[-1])
    # Global max pooling (the split-window path on the GPU, int32 indices past 254 elements).
    xm = as_input(rng, shape, dtype, "max")
    ctm = ct.reshape(shape[0], *(1,) * nd, shape[-1])
    ym, dxm = fwd_and_vjp(lambda v: jaxdnn.max_pool(v, window))(*on(platform, xm, ctm))
    ref_y, ref_dx = ref_fwd_and_vjp(xm, ctm, "max", window, window, [(0, 0)] * nd)
    assert_close(ym, ref_y, dtype, what="global max")
    assert_close(dxm, ref_dx, dtype, what="global max bwd")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_max_pool_ties_first_maximum(dtype, platform):
    """Repeated values: the gradient and the tangent go to the first maximal element, exactly
    as jax.grad / jax.jvp of lax.reduce_window."""
    rng = np.random.default_rng(2)
    shape, window, strides, padding = (2, 9, 10, 8), 3, 1, 1
    win, strd, pads = _geometry(shape, window, strides, padding)
    x = rng.integers(0, 3, shape).astype(np.dtype(dtype))
    x[1] = 1  # a constant image: every window is one big tie
    ct = rng.integers(1, 5, (2, 9, 10, 8)).astype(np.dtype(dtype))
    f = lambda v: jaxdnn.max_pool(v, window, strides, padding)  # noqa: E731
    _, dx = fwd_and_vjp(f)(*on(platform, x, ct))
    np.testing.assert_array_equal(np.asarray(dx, np.float64),
                                  ref_fwd_and_vjp(x, ct, "max", win, strd, pads)[1])
    t = rng.integers(1, 5, shape).astype(np.dtype(dtype))
    ty = jax.jit(lambda v, t: jax.jvp(f, (v,), (t,))[1])(*on(platform, x, t))
    with jax.default_device(CPU):
        _, ref_t = jax.jvp(lambda v: ref_pool(v, "max", win, strd, pads),
                           (jnp.asarray(x, np.float64),), (jnp.asarray(t, np.float64),))
    np.testing.assert_array_equal(np.asarray(ty, np.float64), ref_t)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_nan_inf_propagate(op, dtype, platform):
    rng = np.random.default_rng(3)
    shape, window, strides, padding = (2, 12, 12, 4), 3, 2, 1
    win, strd, pads = _geometry(shape, window, strides, padding)
    x = rand(rng, shape, dtype)
    x[0, 2, 3, 1] = np.nan
    x[0, 7, 7, 2] = np.inf
    x[1, 5, 4, 0] = -np.inf
    x[1, :4, :4, 3] = -np.inf  # windows of nothing but -inf (and padding)
    y = ours(on(platform, x), op, window, strides, padding)
    with jax.default_device(CPU):
        assert_close(y, ref_pool(x, op, win, strd, pads), dtype, what=f"{op} NaN/inf")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_max_pool_nan_gradient_goes_to_first_nan(platform):
    """A window holding NaN outputs NaN; its gradient goes to its first NaN. A window of only
    -inf gives its gradient to its first tap, dropped when that tap is padding (lax's rule;
    more in test_nonfinite.py)."""
    x = np.array([[1.0, np.nan, 3.0, np.nan, 0.0, -np.inf, -np.inf, 2.0]]).T[None]  # (1, 8, 1)
    f = lambda v: jaxdnn.max_pool(v, 2, 2, "VALID")  # noqa: E731
    y, vjp = jax.vjp(f, on(platform, x))
    np.testing.assert_array_equal(np.asarray(y).ravel(), [np.nan, np.nan, 0.0, 2.0])
    dx = vjp(on(platform, np.array([[[1.0], [2.0], [3.0], [4.0]]])))[0]
    np.testing.assert_array_equal(np.asarray(dx).ravel(), [0, 1, 0, 2, 3, 0, 0, 4])
    y = jaxdnn.max_pool(on(platform, np.full((1, 3, 1), -np.inf)), 2, 1, [(1, 0)])
    assert np.all(np.asarray(y) == -np.inf)
    dx = jax.grad(lambda v: jaxdnn.max_pool(v, 2, 1, [(1, 0)]).sum())(
        on(platform, np.full((1, 3, 1), -np.inf)))
    np.testing.assert_array_equal(np.asarray(dx).ravel(), [1.0, 1.0, 0.0])


# ----------------------------------------------------------------------------------------------
# Layouts, empty inputs
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_channels_first_matches_channels_last(nd, op, platform):
    rng = np.random.default_rng(4)
    shape = (2, *(7, 6, 5)[:nd], 3)
    x = as_input(rng, shape, jnp.float32, op)
    cf_layout = {1: "NCW", 2: "NCHW", 3: "NCDHW"}[nd]
    xcf = np.moveaxis(x, -1, 1)
    f_last = lambda v: ours(v, op, 3, 2, "SAME")  # noqa: E731
    f_first = lambda v: ours(v, op, 3, 2, "SAME", layout=cf_layout)  # noqa: E731
    y_last, vjp_last = jax.vjp(f_last, on(platform, x))
    y_first, vjp_first = jax.vjp(f_first, on(platform, xcf))
    np.testing.assert_array_equal(np.moveaxis(np.asarray(y_first), 1, -1), y_last)
    ct = rand(rng, y_last.shape, jnp.float32)
    np.testing.assert_array_equal(
        np.moveaxis(np.asarray(vjp_first(on(platform, np.moveaxis(ct, -1, 1)))[0]), 1, -1),
        vjp_last(on(platform, ct))[0])
    g = jaxdnn.global_avg_pool(on(platform, xcf), layout=cf_layout)
    assert_close(g, np.asarray(x, np.float64).mean(tuple(range(1, nd + 1))), jnp.float32)
    gk = jaxdnn.global_avg_pool(on(platform, xcf), layout=cf_layout, keepdims=True)
    assert gk.shape == (2, 3, *(1,) * nd)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(0, 8, 8, 4), (2, 8, 8, 0)], ids=["empty_batch", "no_channels"])
def test_empty(shape, op, platform):
    x = on(platform, np.zeros(shape, np.float32))
    y, vjp = jax.vjp(lambda v: ours(v, op, 2, 2, "VALID"), x)
    assert y.shape == (shape[0], 4, 4, shape[3])
    assert vjp(jnp.zeros_like(y))[0].shape == shape


# ----------------------------------------------------------------------------------------------
# Transformations
# ----------------------------------------------------------------------------------------------

def _no_ties(rng, shape):
    return rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0


@pytest.mark.parametrize("op", OPS)
def test_check_grads_order2(op):
    """Second order, forward and reverse, float64 on the CPU (max pooling on inputs without
    ties, so that finite differences do not cross a change of the selected element)."""
    rng = np.random.default_rng(5)
    x = _no_ties(rng, (2, 7, 6, 3))
    x1 = _no_ties(rng, (2, 9, 2))
    with jax.default_device(CPU):
        check_grads(lambda v: ours(v, op, 3, 2, 1), (x,), order=2, modes=("fwd", "rev"))
        check_grads(lambda v: ours(v, op, 4, 3, "SAME") ** 2, (x1,), order=2,
                    modes=("fwd", "rev"))


def test_jit_jvp_matches_lax():
    rng = np.random.default_rng(6)
    x, t = _no_ties(rng, (2, 9, 8, 5)), rand(rng, (2, 9, 8, 5), jnp.float64)
    win, strd, pads = _geometry(x.shape, 3, 2, 1)
    with jax.default_device(CPU):
        for op in OPS:
            f = jax.jit(lambda v, op=op: ours(v, op, 3, 2, 1))
            y, ty = jax.jvp(f, (x,), (t,))
            ry, rty = jax.jvp(lambda v, op=op: ref_pool(v, op, win, strd, pads), (x,), (t,))
            assert_close(y, ry, jnp.float64)
            assert_close(ty, rty, jnp.float64, what=f"{op} jvp")
            small = x[:1, :4, :4, :2]
            jac = jax.jacfwd(lambda v, op=op: ours(v, op, 2, 2, "VALID"))(small)
            rjac = jax.jacrev(lambda v, op=op: ref_pool(v, op, (2, 2), (2, 2), [(0, 0)] * 2))(
                small)
            assert_close(jac, rjac, jnp.float64, what=f"{op} jacfwd")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("op", OPS)
def test_vmap_and_vmap_grad(op, platform):
    rng = np.random.default_rng(7)
    xs = _no_ties(rng, (3, 2, 8, 7, 4)).astype(np.float32)
    win, strd, pads = _geometry(xs.shape[1:], 3, 2, 1)
    f = lambda v: ours(v, op, 3, 2, 1)  # noqa: E731
    with jax.default_device(CPU):
        ref = np.stack([ref_pool(v, op, win, strd, pads) for v in xs])
    assert_close(jax.vmap(f)(on(platform, xs)), ref, jnp.float32, what="vmap axis 0")
    assert_close(jax.vmap(f, in_axes=1, out_axes=1)(on(platform, np.swapaxes(xs, 0, 1))),
                 np.swapaxes(ref, 0, 1), jnp.float32, what="vmap axis 1")
    loss = lambda v: (f(v) ** 2).sum()  # noqa: E731
    g = jax.vmap(jax.grad(loss))(on(platform, xs))
    rg = np.stack([ref_vjp(v, 2 * r, op, win, strd, pads) for v, r in zip(xs, ref)])
    assert_close(g, rg, jnp.float32, what="vmap(grad)")
    # An unbatched selection with batched cotangents (scatter with one operand mapped), and a
    # batched jvp (max_fwd_index and gather under vmap).
    y, vjp = jax.vjp(f, on(platform, xs[0]))
    cts = rand(rng, (3, *y.shape), jnp.float32)
    dxs = jax.vmap(vjp)(on(platform, cts))[0]
    assert_close(dxs, np.stack([ref_vjp(xs[0], c, op, win, strd, pads) for c in cts]),
                 jnp.float32, what="vmap(vjp)")
    tys = jax.vmap(lambda v, t: jax.jvp(f, (v,), (t,))[1])(on(platform, xs), on(platform, xs))
    with jax.default_device(CPU):
        rtys = [jax.jvp(lambda v: ref_pool(v, op, win, strd, pads), (v,), (v,))[1] for v in xs]
    assert_close(tys, np.stack(rtys), jnp.float32, what="vmap(jvp)")


@needs_cuda_module
def test_lowers_for_cuda():
    x = jnp.zeros((2, 8, 8, 4), jnp.float32)
    f = jax.grad(lambda v: (jaxdnn.max_pool(v, 3, 2, 1) + jaxdnn.avg_pool(v, 3, 2, 1)).sum())
    text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    for target in ("max_fwd_index", "max_scatter", "avg_bwd"):
        assert f"custom_call @jaxdnn_pool_{target}" in text


@needs_gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_strips_3x3_stride2(dtype):
    """3x3/2 pad 1 on the GPU's strip kernel (cuda_pool.cu) with strips of several output rows
    (2 to 4 on an H200, the last one partial: strip boundaries inside the images): ties go to
    the first maximum (the selection indices), NaN on a boundary row reaches both windows
    that share it, exclude-pad divisors at the edges."""
    rng = np.random.default_rng(10)
    shape, window, strides, padding = (32, 61, 64, 64), 3, 2, 1
    win, strd, pads = _geometry(shape, window, strides, padding)
    x = rng.integers(0, 3, shape).astype(np.dtype(dtype))
    ct = rng.integers(1, 5, _out_shape(shape, win, strd, pads)).astype(np.dtype(dtype))
    f = lambda v: jaxdnn.max_pool(v, window, strides, padding)  # noqa: E731
    y, dx = fwd_and_vjp(f)(*on("gpu", x, ct))
    ref_y, ref_dx = ref_fwd_and_vjp(x, ct, "max", win, strd, pads)
    np.testing.assert_array_equal(np.asarray(y, np.float64), ref_y)
    np.testing.assert_array_equal(np.asarray(dx, np.float64), ref_dx)
    x[0, 7, 5, 3] = x[1, 8, 9, 0] = x[2, 15, 0, 63] = np.nan  # rows 7 and 15: boundaries
    with jax.default_device(CPU):
        for op in OPS:
            assert_close(ours(on("gpu", x), op, window, strides, padding),
                         ref_pool(x, op, win, strd, pads), dtype, what=f"{op} strips")


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda v: v.__name__)
def test_gpu_tiles_2x2_stride2(dtype):
    """2x2/2 VALID on the GPU's tile kernel (cuda_pool.cu: one thread per output vector), odd
    H and W (the last input row and column belong to no window), every dtype's vector width:
    ties go to the first maximum (forward values and the gradient's selection), NaN wins its
    window, averages exact."""
    rng = np.random.default_rng(11)
    shape, window, strides, padding = (5, 13, 17, 64), 2, 2, "VALID"
    win, strd, pads = _geometry(shape, window, strides, padding)
    x = rng.integers(0, 3, shape).astype(np.dtype(dtype))
    ct = rng.integers(1, 5, _out_shape(shape, win, strd, pads)).astype(np.dtype(dtype))
    for op in ("max", "avg"):
        f = lambda v, op=op: ours(v, op, window, strides, padding)  # noqa: E731
        y, dx = fwd_and_vjp(f)(*on("gpu", x, ct))
        ref_y, ref_dx = ref_fwd_and_vjp(x, ct, op, win, strd, pads)
        np.testing.assert_array_equal(np.asarray(y, np.float64), ref_y, err_msg=op)
        np.testing.assert_array_equal(np.asarray(dx, np.float64), ref_dx, err_msg=op)
    # NaN against numpy's max over the tiles: XLA:CPU's reduce_window max (ref_pool) drops the
    # NaN at this size (jax 0.10-0.11; it keeps it on a 4x4 input).
    x[0, 3, 5, 2] = x[4, 10, 15, 63] = np.nan
    tiles = x[:, :12, :16].astype(np.float64).reshape(5, 6, 2, 8, 2, 64)
    np.testing.assert_array_equal(
        np.asarray(ours(on("gpu", x), "max", window, strides, padding), np.float64),
        tiles.max(axis=(2, 4)), err_msg="max tiles with NaN")


@needs_gpu
def test_gpu_deterministic():
    rng = np.random.default_rng(8)
    x = on("gpu", rng.integers(0, 4, (4, 30, 30, 64)).astype(np.float32))
    g = jax.jit(jax.grad(lambda v: (jaxdnn.max_pool(v, 3, 1, 1) ** 2).sum()))
    first = np.asarray(g(x))
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(g(x)), first)


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, error, match", [
    (lambda x: jaxdnn.max_pool(x[0, 0], 2), ValueError, "rank"),
    (lambda x: jaxdnn.max_pool(x, 2, layout="NHCW"), ValueError, "layout"),
    (lambda x: jaxdnn.max_pool(x, 2, layout="NCW"), ValueError, "does not match the rank"),
    (lambda x: jaxdnn.max_pool(x, (2, 2, 2)), ValueError, "window"),
    (lambda x: jaxdnn.max_pool(x, 0), ValueError, "window"),
    (lambda x: jaxdnn.max_pool(x, 2, strides=(1, 0)), ValueError, "strides"),
    (lambda x: jaxdnn.max_pool(x, 2, padding=-1), ValueError, "padding"),
    (lambda x: jaxdnn.max_pool(x, 2, padding=[(1, 1)]), ValueError, "padding"),
    (lambda x: jaxdnn.max_pool(x, 2, padding="FULL"), ValueError, "padding"),
    (lambda x: jaxdnn.max_pool(x, 9), ValueError, "larger than the padded input"),
    (lambda x: jaxdnn.avg_pool(x, (3, 11), padding=1), ValueError, "larger than the padded"),
    (lambda x: jaxdnn.max_pool(x.astype(jnp.int32), 2), TypeError, "dtype"),
    (lambda x: jaxdnn.avg_pool(x, 2, count_include_pad="yes"), TypeError, "count_include_pad"),
    (lambda x: jaxdnn.global_avg_pool(x[:, :0]), ValueError, "empty spatial"),
    (lambda x: jaxdnn.global_avg_pool(x[0, 0]), ValueError, "rank"),
])
def test_bad_input(call, error, match):
    x = jnp.ones((2, 8, 8, 3), jnp.float32)
    with pytest.raises(error, match=match):
        call(x)
