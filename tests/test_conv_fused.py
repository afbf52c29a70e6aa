"""The fused convolution epilogue, ``jaxdnn.conv(..., bias=, activation=, residual=)``, against
jax.lax.conv_general_dilated followed by the same jax.nn activation in float64, on every
platform: forward, gradients of every operand, second-order check_grads, vmap, the custom calls
it lowers to, and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jaxdnn
from jaxdnn.ops.conv import EPILOGUE_ACTIVATIONS
from util import PLATFORMS, assert_close, error_growth, on, rand, rms

ACTIVATIONS = sorted(EPILOGUE_ACTIVATIONS)

# The pre-activation z = conv + bias + residual carries the convolution's rounding error, which
# reaches the output scaled by |act'(z)| <= 1.13 (gelu's steepest slope; every other epilogue
# activation's is at most 1) and d(residual) = ct * act'(z) scaled by |ct * act''(z)| <=
# |ct| (elu's curvature reaches 1, gelu's 0.8). So the elementwise bounds of both take the
# pre-activation's scale, not the RMS of their own reference, which an activation such as tanh
# or sigmoid shrinks while z's error stays.
MAX_SLOPE = 1.13

# (x shape, w shape, conv keywords, layout): channels-last 2-D, strided and grouped,
# channels-first (the residual arrives in the caller's layout), 1-D and 3-D.
CASES = {
    "nhwc": ((2, 9, 8, 6), (3, 3, 6, 5), dict(padding="SAME"), "NHWC"),
    "strided_groups": ((2, 9, 9, 6), (3, 3, 2, 9), dict(stride=2, padding=1, groups=3), "NHWC"),
    "nchw": ((2, 6, 7, 8), (5, 6, 3, 3), dict(padding="SAME"), "NCHW"),
    "1d": ((3, 17, 4), (5, 4, 7), dict(padding="VALID", dilation=2), "NWC"),
    "3d": ((2, 4, 5, 6, 3), (3, 3, 3, 3, 4), dict(padding="SAME"), "NDHWC"),
}


def _lax_conv(x, w, layout, stride=1, padding="SAME", dilation=1, groups=1):
    nd = x.ndim - 2
    rhs = layout[1:-1] + "IO" if layout[-1] == "C" else "OI" + layout[2:]
    if isinstance(padding, int):
        padding = [(padding, padding)] * nd
    return lax.conv_general_dilated(x, w, (stride,) * nd, padding,
                                    rhs_dilation=(dilation,) * nd,
                                    dimension_numbers=(layout, rhs, layout),
                                    feature_group_count=groups,
                                    precision=lax.Precision.HIGHEST)


def _channel_axis(layout):
    return layout.index("C")


def twin(x, w, bias, residual, *, activation, layout, **kw):
    """The unfused lax / jax.nn form of the fused op."""
    z = _lax_conv(x, w, layout, **kw)
    if bias is not None:
        shape = [1] * z.ndim
        shape[_channel_axis(layout)] = -1
        z = z + bias.reshape(shape).astype(z.dtype)
    if residual is not None:
        z = z + residual
    return EPILOGUE_ACTIVATIONS[activation][2](z) if activation else z


def fused(x, w, bias, residual, *, activation, layout, **kw):
    return jaxdnn.conv(x, w, layout=layout, bias=bias, activation=activation,
                       residual=residual, precision="highest", **kw)


def _inputs(case, dtype, seed=0):
    x_shape, w_shape, kw, layout = CASES[case]
    rng = np.random.default_rng(seed)
    x, w = rand(rng, x_shape, dtype), rand(rng, w_shape, dtype, scale=0.3)
    y = jax.eval_shape(lambda x, w: _lax_conv(x, w, layout, **kw),
                       jax.ShapeDtypeStruct(x_shape, jnp.float32),
                       jax.ShapeDtypeStruct(w_shape, jnp.float32)).shape
    k = y[_channel_axis(layout)]
    bias = rand(rng, (k,), np.float64 if dtype == jnp.float64 else np.float32)
    return x, w, bias, rand(rng, y, dtype), kw, layout


def _k(w_shape, layout):
    """The reduction length of one output: taps x input channels per group."""
    return int(np.prod(w_shape[:-1] if layout[-1] == "C" else w_shape[1:]))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("activation", [None, *ACTIVATIONS], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_forward(case, activation, dtype, platform):
    x, w, bias, res, kw, layout = _inputs(case, dtype)
    for b, r in ((bias, res), (bias, None), (None, res)):
        got = jax.jit(lambda *a: fused(*a, activation=activation, layout=layout, **kw))(
            *on(platform, x, w), None if b is None else on(platform, b),
            None if r is None else on(platform, r))
        assert got.dtype == np.dtype(dtype)
        f64 = lambda a: None if a is None else np.asarray(a, np.float64)  # noqa: E731
        with jax.default_device(jax.devices("cpu")[0]):
            want, pre = (twin(f64(x), f64(w), f64(b), f64(r), activation=act, layout=layout,
                              **kw) for act in (activation, None))
        assert_close(got, want, dtype, k=_k(w.shape, layout),
                     scale=MAX_SLOPE * max(rms(want), rms(pre)),
                     what=f"{activation} bias={b is not None} residual={r is not None}")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu", "elu"], ids=str)
@pytest.mark.parametrize("case", ["nhwc", "strided_groups", "nchw", "3d"])
def test_gradients(case, activation, dtype, platform):
    """d(x), d(w), d(bias), d(residual) for a random cotangent, against the vjp of the float64
    twin on the same values."""
    x, w, bias, res, kw, layout = _inputs(case, dtype, seed=1)
    ct = rand(np.random.default_rng(2), res.shape, dtype)

    def vjp(f, args, ct):
        _, back = jax.vjp(lambda *a: f(*a, activation=activation, layout=layout, **kw), *args)
        return back(ct)

    got = jax.jit(lambda a, c: vjp(fused, a, c))(on(platform, x, w, bias, res), on(platform, ct))
    f64 = lambda a: jnp.asarray(np.asarray(a, np.float64))  # noqa: E731
    with jax.default_device(jax.devices("cpu")[0]):
        want = vjp(twin, [f64(a) for a in (x, w, bias, res)], f64(ct))
        pre = twin(*(f64(a) for a in (x, w, bias, res)), activation=None, layout=layout, **kw)
    for name, g in zip(("dx", "dw", "dbias"), got):
        assert g.dtype == (bias.dtype if name == "dbias" else np.dtype(dtype)), name
    assert_gradients(got, want, pre, ct, dtype, w.shape, layout)


def assert_gradients(got, want, pre, ct, arith, w_shape, layout, growth=1.0, what=""):
    """d(x), d(w), d(bias), d(residual) against the float64 twin's (`want`), `pre` the twin's
    pre-activation and `ct` the cotangent."""
    n_out = int(np.prod(ct.shape)) // ct.shape[_channel_axis(layout)]
    k_conv = _k(w_shape, layout)
    for name, g, r, k in zip(("dx", "dw", "dbias", "dresidual"), got, want,
                             (k_conv, n_out, n_out, k_conv)):
        # d(residual) = ct * act'(z): its own rounding, and z's error through act''
        scale = rms(r) + np.abs(ct) * rms(pre) if name == "dresidual" else None
        assert_close(g, r, arith, k=k, scale=scale, what=f"{what}{name}", growth=growth)


# Channels in multiples of 8, so that the tensor-core GEMM algorithms run it: their wgmma
# kernels apply the epilogue as they store their result; every other algorithm leaves it to the
# call's pass.
GEMM_CASE = ((2, 10, 9, 16), (3, 3, 16, 24), dict(padding="SAME"), "NHWC")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: np.dtype(d).name)
def test_every_forward_algorithm(dtype, platform):
    """bias + GELU + residual under each forward algorithm (and variant) that runs the problem,
    pinned, at the default precision (TF32 for float32 on a GPU, as the GEMMs' wgmma kernels
    take it): the value, and the gradients, whose GELU derivative needs the convolution's
    result c, which the call then keeps beside y (an algorithm storing both); and the value
    with ReLU, whose backward needs no c (y written in place)."""
    x_shape, w_shape, kw, layout = GEMM_CASE
    rng = np.random.default_rng(8)
    x, w = rand(rng, x_shape, dtype), rand(rng, w_shape, dtype, scale=0.3)
    y_shape = (*x_shape[:-1], w_shape[-1])
    bias, res, ct = (rand(rng, (w_shape[-1],), np.float32), rand(rng, y_shape, dtype),
                     rand(rng, y_shape, dtype))
    arith = "tf32" if platform == "gpu" and dtype == jnp.float32 else dtype
    operands, ct_dev = on(platform, x, w, bias, res), on(platform, ct)

    def call(x, w, b, r, name, activation="gelu"):
        return jaxdnn.conv(x, w, layout=layout, bias=b, activation=activation, residual=r,
                           algo={"fwd": name}, **kw)

    row, = jaxdnn.explain(jax.jit(lambda *a: call(*a, None)), x, w, bias, res,
                          platform=platform)
    names = [a.name for a in jaxdnn.conv_algorithms(
        row.problem, "cuda" if platform == "gpu" else "cpu") if a.supported]
    assert names
    f64 = lambda a: jnp.asarray(np.asarray(a, np.float64))  # noqa: E731
    with jax.default_device(jax.devices("cpu")[0]):
        args64 = [f64(a) for a in (x, w, bias, res)]
        pre = twin(*args64, activation=None, layout=layout, **kw)
        want, back = jax.vjp(lambda *a: twin(*a, activation="gelu", layout=layout, **kw),
                             *args64)
        want_grads = back(f64(ct))
        want_relu = twin(*args64, activation="relu", layout=layout, **kw)
    k_conv = _k(w_shape, layout)
    for name in names:
        growth = error_growth(name, arith)
        y, back = jax.vjp(jax.jit(lambda *a, name=name: call(*a, name)), *operands)
        assert_close(y, want, arith, k=k_conv, scale=MAX_SLOPE * max(rms(want), rms(pre)),
                     what=f"{name} y", growth=growth)
        assert_gradients(back(ct_dev), want_grads, pre, ct, arith, w_shape, layout, growth,
                         what=f"{name} ")
        y = jax.jit(lambda *a, name=name: call(*a, name, "relu"))(*operands)
        assert_close(y, want_relu, arith, k=k_conv, scale=rms(pre), what=f"{name} relu y",
                     growth=growth)


def _away_from_kink(x, w, bias, kw, layout, rng):
    """A residual that keeps conv + bias + residual at least 0.5 from zero, so that
    check_grads' finite differences never cross relu's kink."""
    z = np.asarray(twin(x, w, bias, None, activation=None, layout=layout, **kw))
    u = rng.standard_normal(z.shape)
    return -z + np.sign(u) * (0.5 + np.abs(u))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_check_grads(platform):
    """Second order, forward and reverse, in float64: relu (its residual clear of the kink),
    gelu and silu (through the saved convolution result), and no activation."""
    x, w, bias, _, kw, layout = _inputs("nhwc", jnp.float64, seed=3)
    rng = np.random.default_rng(4)
    with jax.default_device(jax.devices("cpu")[0]):
        res = _away_from_kink(x, w, bias, kw, layout, rng)
    for activation in ("relu", "gelu", "silu", None):
        f = jax.jit(lambda *a, act=activation: fused(*a, activation=act, layout=layout, **kw))
        check_grads(f, on(platform, x, w, bias, res), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_vmap(platform):
    """x and the residual mapped fold into the batch; a mapped filter or bias takes the
    unfused composition; both agree with per-index calls."""
    x, w, bias, res, kw, layout = _inputs("nhwc", jnp.float32, seed=5)
    rng = np.random.default_rng(6)
    xs, rs = rand(rng, (3, *x.shape)), rand(rng, (3, *res.shape))
    ws, bs = rand(rng, (3, *w.shape), scale=0.3), rand(rng, (3, *bias.shape))
    f = jax.jit(lambda x, w, b, r: fused(x, w, b, r, activation="gelu", layout=layout, **kw))
    args = on(platform, xs, rs, ws, bs, x, w, bias, res)
    xs, rs, ws, bs, x, w, bias, res = args
    for in_axes, call in (((0, None, None, 0), (xs, w, bias, rs)),
                          ((0, None, None, None), (xs, w, bias, res)),
                          ((None, 0, None, None), (x, ws, bias, res)),
                          ((None, None, 0, 0), (x, w, bs, rs))):
        got = jax.jit(jax.vmap(f, in_axes=in_axes))(*call)
        want = np.stack([f(*(a if ax is None else a[i] for a, ax in zip(call, in_axes)))
                         for i in range(3)])
        assert_close(got, want, jnp.float32, k=_k(w.shape, layout), what=str(in_axes))


def test_lowers_to_one_fused_call():
    """The forward is one custom call (no XLA add, no activation kernel); its gradient runs
    the backward-data and backward-filter kernels."""
    x, w, bias, res, kw, layout = _inputs("nhwc", jnp.float32)
    loss = lambda *a: jnp.sum(fused(*a, activation="silu", layout=layout, **kw) ** 2)  # noqa
    text = jax.jit(loss).lower(x, w, bias, res).as_text()
    assert text.count("jaxdnn_conv_fwd_fused") == 1 and "jaxdnn_activation" not in text
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(x, w, bias, res).as_text()
    for target in ("jaxdnn_conv_fwd_fused", "jaxdnn_conv_bwd_data", "jaxdnn_conv_bwd_filter"):
        assert target in text, target
    # explain names the fused forward, and it takes the plain forward's choice
    fused_row, = [e for e in jaxdnn.explain(jax.jit(loss), x, w, bias, res, platform="cpu")]
    assert fused_row.problem.epilogue == "bias+silu+residual"
    assert fused_row.problem.describe().endswith(" fused bias+silu+residual")
    plain = jaxdnn.explain(jax.jit(lambda x, w: jaxdnn.conv(x, w, layout=layout, **kw)), x, w,
                           platform="cpu")[0]
    assert fused_row.algo == plain.algo


@pytest.mark.parametrize("call,match", [
    (lambda x, w, b: jaxdnn.conv(x, w, activation="swishy"), "activation"),
    (lambda x, w, b: jaxdnn.conv(x, w, bias=b[:3]), "bias"),
    (lambda x, w, b: jaxdnn.conv(x, w, bias=jnp.ones((5,), jnp.int32)), "bias"),
    (lambda x, w, b: jaxdnn.conv(x, w, padding="VALID", residual=x[..., :5]), "residual"),
    (lambda x, w, b: jaxdnn.conv(x, w, residual=jnp.ones((2, 7, 6, 5), jnp.bfloat16)),
     "residual"),
    (lambda x, w, b: jaxdnn.conv(x.astype(jnp.int8), w.astype(jnp.int8), bias=b),
     "floating-point result"),
])
def test_bad_input(call, match):
    x, w = jnp.ones((2, 9, 8, 6)), jnp.ones((3, 3, 6, 5))
    with pytest.raises((ValueError, TypeError), match=match):
        jax.jit(call)(x, w, jnp.ones((5,)))
