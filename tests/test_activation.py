"""Activations against jax.nn in float64: values, gradients, special values, transformations,
second-order gradient checks and argument errors, on every platform present."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxdnn
from util import DTYPES, PLATFORMS, assert_close, on, rand

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
    for (x, _), (y, dx), (y_ref, dx_ref) in zip(pairs, outs, _ref_value_and_vjp(name, pairs)):
        assert y.dtype == np.dtype(dtype) and y.shape == x.shape
        assert_close(y, y_ref, dtype, what=f"{name} {x.shape}")
        assert_close(dx, dx_ref, dtype, what=f"{name} grad {x.shape}")


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


def test_cuda_lowering():
    """Every op lowers to our custom calls for the GPU, also on a machine without one (when the
    CUDA module is built)."""
    if jaxdnn._ffi._cuda is None:
        pytest.skip("built without CUDA")
    x = jnp.ones((3, 5), jnp.bfloat16)
    for name, (f, _) in OPS.items():
        grad = jax.grad(lambda v, f=f: jnp.sum(f(v).astype(jnp.float32)))
        text = jax.jit(lambda v: (f(v), grad(v))).trace(x).lower(
            lowering_platforms=("cuda",)).as_text()
        assert "jaxdnn_activation_fwd" in text and "jaxdnn_activation_bwd" in text, name
