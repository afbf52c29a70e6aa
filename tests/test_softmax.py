"""softmax and log_softmax against jax.nn in float64: values, vjp and jvp over axes and shapes
(long rows, unaligned rows, size-1 and empty dims), extreme logits, -inf/+inf/NaN rows,
transformations, second-order gradient checks and argument errors, on every platform present."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxdnn
from jaxdnn.selection import softmax as softmax_sel
from util import DTYPES, PLATFORMS, assert_close, needs_cuda_module, needs_gpu, on, rand

FUNCS = {"softmax": (jaxdnn.softmax, jax.nn.softmax),
         "log_softmax": (jaxdnn.log_softmax, jax.nn.log_softmax)}


@functools.cache
def _value_vjp_jvp(f, axes):
    """jit([(x, c)] -> [(f(x), vjp(c), jvp(c))]) for one axis per input pair: one compilation
    for all the cases (and cached: the float64 references are shared by every dtype)."""
    def one(x, c, axis):
        y, vjp = jax.vjp(lambda v: f(v, axis=axis), x)
        return y, vjp(c)[0], jax.jvp(lambda v: f(v, axis=axis), (x,), (c,))[1]
    return jax.jit(lambda pairs: [one(x, c, axis) for (x, c), axis in zip(pairs, axes)])


def _check(name, platform, cases, dtype, *, round_ref=False):
    """cases: [(x, c, axis)]; compares value, vjp and jvp with jax.nn in float64."""
    f, ref = FUNCS[name]
    axes = tuple(axis for _, _, axis in cases)
    outs = _value_vjp_jvp(f, axes)([on(platform, x, c) for x, c, _ in cases])
    refs = _value_vjp_jvp(ref, axes)([(np.asarray(x, np.float64), np.asarray(c, np.float64))
                                      for x, c, _ in cases])
    for (x, c, axis), case_outs, case_refs in zip(cases, outs, refs):
        for what, out, want in zip(("value", "vjp", "jvp"), case_outs, case_refs):
            assert out.dtype == np.dtype(dtype)
            want = np.asarray(want)
            if round_ref:  # the exact result, rounded to the dtype (overflow included)
                with np.errstate(over="ignore"):
                    want = want.astype(dtype).astype(np.float64)
            scale = (_log_softmax_vjp_scale(np.asarray(case_refs[0]), c, axis)
                     if name == "log_softmax" and what == "vjp" else None)
            assert_close(out, want, dtype, scale=scale,
                         what=f"{name} {what} {x.shape} axis={axis}")


def _log_softmax_vjp_scale(y, c, axis):
    """Per element, the magnitude of the terms of log_softmax's vjp c - p * sum(c) (p = exp(y)).
    Like jax.nn's, the backward takes p from the forward's output y as stored (its residual), so
    p carries y's rounding, a relative error of up to half an ulp of y: ~eps * |y|, which the
    long rows' |y| ~ 10 multiply (a float16 row of 20000: 2 ulps of a result of 14)."""
    c = np.asarray(c, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.sum(c, axis=axis, keepdims=True)
        return np.abs(c) + np.exp(y) * np.abs(total) * np.maximum(1.0, np.abs(y))


# (shape, axis): odd sizes; rows unaligned for 16-byte vectors (37, 1001); every GPU path: a
# warp per row (37, 128), blocks of 64 to 512 threads per row (2048, 4100, 12000), a row longer
# than a block holds in registers (20000 > 16384 elements: the online kernel); a non-last axis;
# several axes; all axes; size-1 reduced and non-reduced dims.
CASES = [((5, 37), -1), ((3, 4, 128), -1), ((2, 1001), -1), ((2, 2048), -1), ((3, 4100), 1),
         ((1, 12000), -1), ((2, 20000), -1), ((4, 9, 6), 1), ((3, 4, 5), (0, 2)), ((6, 7), None),
         ((5, 1), -1), ((1, 7), 0)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", FUNCS)
def test_against_jax_nn(platform, dtype, name):
    rng = np.random.default_rng(0)
    cases = [(rand(rng, shape, dtype, scale=3.0), rand(rng, shape, dtype), axis)
             for shape, axis in CASES]
    _check(name, platform, cases, dtype)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", FUNCS)
def test_large_logits(platform, name):
    """Logits of +-1e4 in float32: max subtraction keeps exp in range."""
    rng = np.random.default_rng(1)
    cases = []
    for shape in [(4, 33), (3, 4096)]:
        x = rand(rng, shape, np.float32, scale=1e4)
        x[:, 1] = x.max(axis=1) - 1.0  # a close second, so the result is not one-hot
        cases.append((x, rand(rng, shape, np.float32), -1))
    _check(name, platform, cases, np.float32)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", FUNCS)
def test_bfloat16_extreme_range(platform, name):
    """Logits across the whole bfloat16 range, up to +-3.3e38 (x - max overflows to -inf)."""
    rng = np.random.default_rng(2)
    shape = (8, 300)
    mag = 10.0 ** rng.uniform(-38, 38.5, shape)
    x = (np.sign(rng.standard_normal(shape)) * np.minimum(mag, 3.3e38)).astype(jnp.bfloat16)
    x[0, :] = x[0, :] * 0 + np.float32(3.0e38)  # a row of equal huge values
    x[1, :5] = 1.0  # a row whose max is small
    x[1, 5:] = -3.0e38
    c = rand(rng, shape, jnp.bfloat16)
    f, ref = FUNCS[name]
    if name == "softmax":
        _check(name, platform, [(x, c, -1)], jnp.bfloat16, round_ref=True)
    else:  # log_softmax's derivatives: exp(y) - 1 at the overflowed -inf outputs is not checked
        with np.errstate(over="ignore"):
            want = np.asarray(ref(np.asarray(x, np.float64))).astype(jnp.bfloat16)
        assert_close(f(on(platform, x)), want.astype(np.float64), jnp.bfloat16, what=name)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", FUNCS)
def test_infinities_and_nan(platform, dtype, name):
    """Rows of only -inf give NaN, as jax.nn (0/0); a +inf or NaN makes its row NaN; -inf
    elsewhere gives 0 (softmax) or -inf (log_softmax)."""
    inf = np.inf
    for cols in (5, 300):  # a warp-sized and a longer row
        x = np.zeros((6, cols), np.float64) + np.linspace(-1, 1, cols)
        x[0] = -inf
        x[1, 0] = -inf
        x[2, ::2] = -inf
        x[3, 3] = inf
        x[4, 2] = np.nan
        x = x.astype(dtype)
        f, ref = FUNCS[name]
        assert_close(f(on(platform, x)), ref(np.asarray(x, np.float64)), dtype, what=name)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("shape,axis", [((0, 5), -1), ((3, 0), -1), ((3, 0), 0), ((2, 0, 4), 2),
                                        ((), None), ((4,), -1)])
def test_empty_and_small(platform, shape, axis):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 0.25
    for name in FUNCS:
        _check(name, platform, [(x, x, axis)], np.float32)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_transformations(platform):
    rng = np.random.default_rng(3)
    x = on(platform, rand(rng, (4, 6, 5), np.float64))

    def transforms(f):
        return jax.jit(lambda x: (
            jax.vmap(lambda v: f(v, axis=-1), 0, 0)(x),
            jax.vmap(lambda v: f(v, axis=0), 1, 1)(x),
            jax.vmap(lambda v: f(v, axis=-1), 2, 2)(x),  # the mapped axis is the last one
            jax.vmap(jax.grad(lambda v: jnp.sum(f(v, axis=0) * v)), 2, 2)(x),
            jax.jacrev(lambda v: f(v, axis=-1))(x[0]),  # cotangents mapped, y not
            jax.jacfwd(lambda v: f(v, axis=-1))(x[0]),
            jax.hessian(lambda v: jnp.sum(f(v, axis=-1) ** 2))(x[0, 0])))

    for name, (f, ref) in FUNCS.items():
        for i, (out, want) in enumerate(zip(transforms(f)(x), transforms(ref)(x))):
            # Scale 1: the derivatives sum and cancel products of softmax values (<= 1) and
            # the O(1) inputs, while some results are ~1e-2 (the default scale, their RMS).
            assert_close(out, want, np.float64, scale=1.0, what=f"{name} transform {i}")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("name", FUNCS)
def test_check_grads_order2(platform, name, axis):
    rng = np.random.default_rng(4)
    x = rand(rng, (3, 6), np.float64)
    f = jax.jit(lambda v: FUNCS[name][0](v, axis=axis))
    check_grads(f, (on(platform, x),), order=2, modes=("fwd", "rev"))


def test_derivatives_run_our_kernels():
    x = jnp.ones((2, 3), jnp.float32)
    for name, (f, _) in FUNCS.items():
        grad = jax.jit(jax.grad(lambda v: jnp.sum(f(v) * v))).lower(x).as_text()
        jvp = jax.jit(lambda v: jax.jvp(f, (v,), (v,))[1]).lower(x).as_text()
        assert "jaxdnn_softmax_bwd" in grad and "jaxdnn_softmax_bwd" in jvp, name


def test_bad_arguments():
    x = jnp.ones((2, 3), jnp.float32)
    for f in (jaxdnn.softmax, jaxdnn.log_softmax):
        with pytest.raises(ValueError, match="`axis`"):
            f(x, axis=2)
        with pytest.raises(ValueError, match="`axis`"):
            f(x, axis=-3)
        with pytest.raises(ValueError, match="`axis`"):
            f(x, axis=(0, -2))
        with pytest.raises(TypeError, match="`axis`"):
            f(x, axis=1.0)
        with pytest.raises(TypeError, match="`x`"):
            f(jnp.ones((2, 3), jnp.int32))


@needs_cuda_module
def test_cuda_lowering():
    """Both ops and their derivatives lower to our custom calls for the GPU, also on a machine
    without one (when the CUDA module is built)."""
    x = jnp.ones((3, 5), jnp.bfloat16)
    for name, (f, _) in FUNCS.items():
        grad = jax.grad(lambda v, f=f: jnp.sum(f(v, axis=0).astype(jnp.float32) ** 2))
        text = jax.jit(lambda v: (f(v), grad(v))).trace(x).lower(
            lowering_platforms=("cuda",)).as_text()
        assert "jaxdnn_softmax_fwd" in text and "jaxdnn_softmax_bwd" in text, name


# ---- the algorithm registry and selection (jaxdnn/selection, as for conv) ---------------------

def _problem(rows, cols, dtype=jnp.float32, direction="fwd", op="softmax", algo=None):
    return softmax_sel.SoftmaxProblem(direction, op, rows, cols, np.dtype(dtype), algo)


def test_cpu_registry_and_forced_errors():
    infos = jaxdnn.softmax_algorithms(_problem(8, 16), "cpu")
    assert [a.name for a in infos] == ["rows"] and infos[0].supported and infos[0].rank == 0
    x = jnp.ones((4, 8))
    with pytest.raises(ValueError, match="unknown softmax algorithm 'fast' for fwd on (cpu|cuda); registered: "):
        jax.jit(lambda x: jaxdnn.softmax(x, algo="fast")).lower(x)
    with pytest.raises(TypeError, match="`algo` must be None or an algorithm name"):
        jaxdnn.softmax(x, algo=3)


def test_explain_lists_softmax_calls():
    f = jax.grad(lambda x: jnp.sum(jaxdnn.log_softmax(x) * jnp.arange(8.0)))
    rows = jaxdnn.explain(f, jnp.ones((4, 8), jnp.float32), platform="cpu")
    assert [(r.direction, r.problem.op) for r in rows] == [("fwd", "log_softmax"),
                                                           ("bwd", "log_softmax_vjp")]
    assert all(r.algo == "rows" and r.reason == "heuristic" for r in rows)
    assert "softmax fwd  log_softmax 4x8 float32" in str(rows)


@needs_cuda_module
def test_cuda_registry_support_rules():
    """Needs the CUDA module, not a GPU: "rows" keeps a row in registers (16K float32 or
    bfloat16, 8K float64 elements; 256 when the row is not a multiple of 16 bytes)."""
    def names(rows, cols, dtype):
        return {a.name: a for a in jaxdnn.softmax_algorithms(_problem(rows, cols, dtype), "cuda")}

    short = names(32768, 4096, jnp.float32)
    assert short["rows"].supported and short["rows"].rank == 0 and short["online"].supported
    assert not names(8, 16388, jnp.float32)["rows"].supported
    assert names(8, 16384, jnp.bfloat16)["rows"].supported
    assert not names(8, 8194, jnp.float64)["rows"].supported
    odd = names(8, 257, jnp.float32)["rows"]
    assert not odd.supported and "does not fit in registers" in odd.reason
    assert names(8, 100000, jnp.float32)["online"].rank == 0


@needs_gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: np.dtype(d).name)
def test_every_gpu_algorithm_matches_jax_nn(dtype):
    rng = np.random.default_rng(4)
    x = jax.device_put(rand(rng, (64, 1000), dtype), jax.devices("gpu")[0])
    ref = jax.nn.log_softmax(x.astype(jnp.float32))
    ct = jax.device_put(rand(rng, (64, 1000), dtype), jax.devices("gpu")[0])
    ref, ref_vjp = jax.vjp(jax.nn.log_softmax, x.astype(jnp.float32))
    for algo in ("rows", "online"):
        y, vjp = jax.vjp(jax.jit(lambda x, a=algo: jaxdnn.log_softmax(x, algo=a)), x)
        assert_close(y, ref, dtype, what=algo)
        assert_close(vjp(ct)[0], ref_vjp(ct.astype(jnp.float32))[0], dtype, what=f"{algo} vjp")
    with pytest.raises(ValueError, match="cannot run this fwd problem"):
        jax.jit(lambda x: jaxdnn.softmax(x, algo="rows")).lower(jnp.ones((2, 20000)))


@needs_gpu
def test_gpu_benchmark_mode_times_softmax(tmp_path):
    x = jax.device_put(jnp.ones((256, 2048)), jax.devices("gpu")[0])
    with jaxdnn.config(benchmark=True, cache_dir=str(tmp_path)):
        rows = jaxdnn.explain(jaxdnn.softmax, x)
        assert rows[0].reason == "benchmark (measured)"
        assert jaxdnn.explain(jaxdnn.softmax, x)[0].reason == "benchmark (cached)"
