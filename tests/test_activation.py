"""Activations against jax.nn in float64: values, gradients, special values, transformations,
second-order gradient checks and argument errors, on every platform present."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxdnn
from util import DTYPES, PLATFORMS, assert_close, needs_cuda_module, on, rand

# name -> (jaxdnn function, jax.nn reference), for default and non-default parameters.
OPS = {
    "relu": (jaxdnn.relu, jax.nn.relu),
    "relu6": (jaxdnn.relu6, jax.nn.relu6),
    "leaky_relu": (jaxdnn.leaky_relu, jax.nn.leaky_relu),
    "leaky_relu_0.2": (functools.partial(jaxdnn.leaky_relu, negative_slope=0.2),
                       functools.partial(jax.nn.leaky_relu, negative_slope=0.2)),
    "elu": (jaxdnn.elu, jax.nn.elu),
    "elu_0.7": (functools.partial(jaxdnn.elu, alpha=0.7), functools.partial(jax.nn.elu, alpha=0.7)),
    "sigmoid": (jaxdnn.sigmoid, jax.nn.sigmoid),
    "tanh": (jaxdnn.tanh, jnp.tanh),
    "gelu": (jaxdnn.gelu, jax.nn.gelu),
    "gelu_exact": (functools.partial(jaxdnn.gelu, approximate=False),
                   functools.partial(jax.nn.gelu, approximate=False)),
    "silu": (jaxdnn.silu, jax.nn.silu),
    "softplus": (jaxdnn.softplus, jax.nn.softplus),
}

# Odd sizes, and an array long enough for several CPU tasks and GPU blocks.
SHAPES = [(3, 37, 5), (70001,)]


# Everything runs under jit: one compilation per function (and list of input shapes) instead
# of one per eager op, cached so the float64 references are shared by every dtype.

@functools.cache
def _value_and_vjp(f):
    """jit([(x, ct)] -> [(f(x), vjp(ct))])."""
    def one(x, ct):
        y, vjp = jax.vjp(f, x)
        return y, vjp(ct)[0]
    return jax.jit(lambda pairs: [one(x, ct) for x, ct in pairs])


def _ref_value_and_vjp(name, pairs):
    """The float64 jax.nn values and vjps at the dtype-rounded inputs."""
    return _value_and_vjp(OPS[name][1])([(np.asarray(x, np.float64), np.asarray(ct, np.float64))
                                         for x, ct in pairs])


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", OPS)
def test_forward_and_backward(platform, dtype, name):
    rng = np.random.default_rng(0)
    pairs = [(rand(rng, shape, dtype, scale=3.0), rand(rng, shape, dtype)) for shape in SHAPES]
    outs = _value_and_vjp(OPS[name][0])([on(platform, x, ct) for x, ct in pairs])
    for (x, ct), (y, dx), (y_ref, dx_ref) in zip(pairs, outs, _ref_value_and_vjp(name, pairs)):
        assert y.dtype == np.dtype(dtype) and y.shape == x.shape
        assert_close(y, y_ref, dtype, what=f"{name} {x.shape}")
        assert_close(dx, dx_ref, dtype, scale=_grad_ref_scale(name, x, ct, dtype),
                     what=f"{name} grad {x.shape}")


def _grad_ref_scale(name, x, ct, dtype):
    """The elementwise bound's scale for a gradient (None: the default). jax.nn.gelu's tanh
    form differentiates x (1 + t) / 2, t = tanh(u): (1 + t) / 2 + x (1 - t^2) u' / 2, whose
    1 + t and 1 - t^2 cancel for x < -5 and carry absolute errors of ~1 ulp of 1 each, so the
    float64 reference itself is off by ~eps * |ct| * (1 + |x u'|) (4e-14 at x = -7.1, where the
    gradient is 1.4e-14; jaxdnn computes x * sigmoid(2u), without the cancellation)."""
    if name != "gelu" or np.dtype(dtype) != np.float64:
        return None
    x = np.asarray(x, np.float64)
    du = np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x * x)
    return np.abs(np.asarray(ct, np.float64)) * (1 + np.abs(x * du))


# Special values: NaN and infinities propagate as in jax.nn (compared in float64, where the
# reference itself is exact), also through the gradients.
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 6.0, 30.0, -30.0, 1e-3, -1e-3, 0.5, -2.0]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", OPS)
def test_special_values(platform, dtype, name):
    x = np.array(SPECIAL, dtype=dtype)
    [(y, dx)] = _value_and_vjp(OPS[name][0])([on(platform, x, np.ones_like(x))])
    [(y_ref, dx_ref)] = _ref_value_and_vjp(name, [(x, np.ones_like(x))])
    assert_close(y, y_ref, dtype, what=name)
    assert_close(dx, dx_ref, dtype, what=f"{name} grad")


def _all_values(dtype, limit):
    """Every normal value of a 16-bit dtype in [-limit, limit], and zero, from its bit patterns
    (subnormal inputs may be flushed to zero: XLA:CPU runs with denormals off)."""
    v = np.arange(1 << 16, dtype=np.uint16).view(np.dtype(dtype))
    v = v[np.isfinite(v)].astype(np.float64)
    return v[(np.abs(v) <= limit) & ((np.abs(v) >= float(jnp.finfo(dtype).tiny)) | (v == 0))]


def _sigmoid64(x):
    """sigmoid in float64 without cancellation on either side."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


_ERFC = np.vectorize(math.erfc)
_U = lambda x: 2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)  # tanh-gelu's 2u

# (f, f') in float64 written so that neither cancels where the value is small (jax.nn's
# float64 tanh-gelu is x (1 + tanh(u)) / 2, which loses all digits for x < -10): the exact
# values the 16-bit test compares against.
STABLE = {
    "relu": (lambda x: np.maximum(x, 0), lambda x: (x > 0) * 1.0),
    "relu6": (lambda x: np.clip(x, 0, 6), lambda x: ((x > 0) & (x < 6)) * 1.0),
    "leaky_relu": (lambda x: np.where(x >= 0, x, 0.01 * x), lambda x: np.where(x >= 0, 1, 0.01)),
    "leaky_relu_0.2": (lambda x: np.where(x >= 0, x, 0.2 * x),
                       lambda x: np.where(x >= 0, 1, 0.2)),
    "elu": (lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
            lambda x: np.where(x > 0, 1, np.exp(np.minimum(x, 0)))),
    "elu_0.7": (lambda x: np.where(x > 0, x, 0.7 * np.expm1(np.minimum(x, 0))),
                lambda x: np.where(x > 0, 1, 0.7 * np.exp(np.minimum(x, 0)))),
    "sigmoid": (_sigmoid64, lambda x: _sigmoid64(x) * _sigmoid64(-x)),
    "tanh": (np.tanh, lambda x: 1 / np.cosh(x) ** 2),
    "gelu": (lambda x: x * _sigmoid64(_U(x)),
             lambda x: _sigmoid64(_U(x)) + x * 2 * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x**2)
             * _sigmoid64(_U(x)) * _sigmoid64(-_U(x))),
    "gelu_exact": (lambda x: 0.5 * x * _ERFC(-x / np.sqrt(2)),
                   lambda x: 0.5 * _ERFC(-x / np.sqrt(2)) + x * np.exp(-x * x / 2)
                   / np.sqrt(2 * np.pi)),
    "silu": (lambda x: x * _sigmoid64(x), lambda x: _sigmoid64(x) * (1 + x * _sigmoid64(-x))),
    "softplus": (lambda x: np.logaddexp(0, x), _sigmoid64),
}


def _assert_rounds_like(out, ref, dtype, what):
    """`out` (the dtype's values) is `ref` (exact) rounded to the dtype, except next to a rounding
    midpoint: a result one step away must have the midpoint within 2e-5 (relative) + 1e-6
    (absolute: float evaluation of O(1) terms) of the exact value. An approximation that is
    good to 2e-5 passes; one good only to the dtype's own precision (2^-9 in bfloat16) fails."""
    out = np.asarray(out).astype(np.float64)
    want = np.asarray(ref.astype(np.dtype(dtype)), np.float64)
    both_nan = np.isnan(out) & np.isnan(want)
    off = ~both_nan & (out != want)
    mid = (out + want) / 2
    near_mid = np.abs(ref - mid) <= 2e-5 * np.abs(ref) + 1e-6
    step = np.nextafter(want.astype(np.dtype(dtype)), out.astype(np.dtype(dtype)))
    adjacent = np.asarray(step, np.float64) == out
    tiny = 64 * float(np.finfo(np.float32).tiny)  # float intermediates may flush to zero
    underflow = (np.abs(out) < tiny) & (np.abs(ref) < tiny)
    bad = off & ~(near_mid & adjacent) & ~underflow
    assert not bad.any(), (f"{what}: {bad.sum()} of {out.size} values misrounded, e.g. x-index "
                           f"{np.flatnonzero(bad)[:5]}: got {out[bad][:5]}, exact {ref[bad][:5]}")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", OPS)
def test_16bit_results_round_correctly(platform, dtype, name):
    """16-bit storage computes in float, on the GPU with MUFU's exp, log2 and reciprocal and
    short series where those would cancel: over every value of the dtype in [-30, 30], the
    forward and the backward (dy = 1) must be the exact value (STABLE, float64) rounded to the
    dtype, up to ties (_assert_rounds_like)."""
    x64 = _all_values(dtype, 30.0)
    x = x64.astype(np.dtype(dtype))
    [(y, dx)] = _value_and_vjp(OPS[name][0])([on(platform, x, np.ones_like(x))])
    f, df = STABLE[name]
    _assert_rounds_like(y, f(x64), dtype, f"{name} forward")
    _assert_rounds_like(dx, df(x64), dtype, f"{name} backward")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_gelu_exact_near_underflow(platform):
    """float32 gelu_exact(x) for x in [-13.1, -12.8], where the result (~1e-36 to 1e-38) is a
    normal float but Phi(x) alone is not: the form must keep an intermediate as large as jax's
    erfc (x/2 * erfc(-x/sqrt(2))), or XLA:CPU's flush-to-zero turns the result into 0. Exact to
    2e-6 wherever jax's erfc is a normal float; 0 or exact below."""
    x = np.linspace(-13.1, -12.8, 3001).astype(np.float32)
    x64 = x.astype(np.float64)
    [(y, _)] = _value_and_vjp(OPS["gelu_exact"][0])([on(platform, x, np.ones_like(x))])
    y = np.asarray(y, np.float64)
    ref = STABLE["gelu_exact"][0](x64)
    close = np.abs(y - ref) <= 2e-6 * np.abs(ref)
    normal = _ERFC(-x64 / np.sqrt(2)) >= float(np.finfo(np.float32).tiny)
    assert normal.sum() > 1000
    bad = normal & ~close
    assert not bad.any(), f"{bad.sum()} results off, e.g. x = {x[bad][:4]}"
    assert (close | (y == 0))[~normal].all()


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), ()])
def test_empty_and_scalar(platform, shape):
    x = np.full(shape, 0.5, np.float32)
    for name, (f, _) in OPS.items():
        [(y, dx)] = _value_and_vjp(f)([on(platform, x, x)])
        [(y_ref, dx_ref)] = _ref_value_and_vjp(name, [(x, x)])
        assert_close(y, y_ref, np.float32, what=name)
        assert_close(dx, dx_ref, np.float32, what=name)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_transformations(platform):
    rng = np.random.default_rng(1)
    x = on(platform, rand(rng, (4, 6, 5), np.float64, scale=2.0))
    t = on(platform, rand(rng, (4, 6, 5), np.float64))
    v = x[0, 0]
    @functools.cache
    def transforms(f):
        return jax.jit(lambda x, t, v: (
            jax.jvp(f, (x,), (t,))[1],
            jax.vmap(f, 1, 1)(x),
            jax.vmap(jax.grad(lambda u: jnp.sum(f(u) * u)), 2, 2)(x),
            # hessian = jacfwd(jacrev): vmapped jvp and vjp, the cotangent mapped alone
            jax.hessian(lambda u: jnp.sum(f(u)))(v)))

    for name, (f, ref) in OPS.items():
        for out, want in zip(transforms(f)(x, t, v), transforms(ref)(x, t, v)):
            assert_close(out, want, np.float64, what=name)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", OPS)
def test_check_grads_order2(platform, name):
    rng = np.random.default_rng(2)
    x = rand(rng, (3, 7), np.float64, scale=2.0)
    x = x + 0.1 * np.sign(x)  # away from the kinks of relu/relu6/leaky_relu/elu
    check_grads(jax.jit(OPS[name][0]), (on(platform, x),), order=2, modes=("fwd", "rev"))


def test_backward_runs_our_kernel():
    x = jnp.ones((3,), jnp.float32)
    for name, (f, _) in OPS.items():
        text = jax.jit(jax.grad(lambda v, f=f: jnp.sum(f(v)))).lower(x).as_text()
        assert "jaxdnn_activation_bwd" in text, name


def test_swish_is_silu():
    assert jaxdnn.swish is jaxdnn.silu


def test_bad_arguments():
    x = jnp.ones((2, 3), jnp.float32)
    with pytest.raises(TypeError, match="`x`"):
        jaxdnn.relu(jnp.ones((2, 3), jnp.int32))
    with pytest.raises(TypeError, match="`x`"):
        jaxdnn.gelu("not an array")
    with pytest.raises(TypeError, match="`negative_slope`"):
        jaxdnn.leaky_relu(x, negative_slope=jnp.ones(3))
    with pytest.raises(TypeError, match="`alpha`"):
        jaxdnn.elu(x, alpha=float("nan"))
    with pytest.raises(TypeError, match="`approximate`"):
        jaxdnn.gelu(x, approximate="yes")


@needs_cuda_module
def test_cuda_lowering():
    """Every op lowers to our custom calls for the GPU, also on a machine without one (when the
    CUDA module is built)."""
    x = jnp.ones((3, 5), jnp.bfloat16)
    for name, (f, _) in OPS.items():
        grad = jax.grad(lambda v, f=f: jnp.sum(f(v).astype(jnp.float32)))
        text = jax.jit(lambda v: (f(v), grad(v))).trace(x).lower(
            lowering_platforms=("cuda",)).as_text()
        assert "jaxdnn_activation_fwd" in text and "jaxdnn_activation_bwd" in text, name
