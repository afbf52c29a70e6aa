"""Flax-free models: parameters are plain dicts, the forward pass a plain function.

Both models take an `Ops` table, so the same code runs on jaxdnn's primitives or on the
jax.lax / jax.nn reference ops (``--compare-lax``) from the same initialisation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxdnn

BN_MOMENTUM = 0.9
BN_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class Ops:
    """The primitives a model uses. All tensors are channels-last."""

    name: str
    # (x, w, stride=1, padding="SAME", groups=1, bias=, activation=, residual=) -> y, HWIO
    # filter; y = activation(conv + bias + residual), one fused op on jaxdnn
    conv: Callable
    # Batch norm over N, H, W; `activation` ("relu" or None) and `residual` end a residual
    # block in the same op: y = activation(normalised + residual).
    batch_norm: Callable    # (x, scale, bias, activation=, residual=) -> (y, mean, var)
    bn_inference: Callable  # (x, scale, bias, mean, var, activation=, residual=) -> y
    relu: Callable
    max_pool: Callable      # (x, window, stride, padding): square window, "SAME" or "VALID"
    global_avg_pool: Callable  # (N, H, W, C) -> (N, C)
    layer_norm: Callable    # (x, scale, bias) over the last axis
    gelu: Callable
    log_softmax: Callable
    dense: Callable         # (x, w, b) -> x @ w + b


def _dense(precision):
    """x @ w + b in x's dtype. jaxdnn has no matrix product: both tables use jnp.dot."""
    def dense(x, w, b):
        return jnp.dot(x, w.astype(x.dtype), precision=precision) + b.astype(x.dtype)
    return dense


def _then(y, acts, bias=None, activation=None, residual=None):
    """The epilogue written out as separate ops, as a user chains them: y + bias + residual,
    then the activation (`acts`: name -> function)."""
    if bias is not None:
        y = y + bias.astype(y.dtype)
    if residual is not None:
        y = y + residual
    return acts[activation](y) if activation else y


_JAXDNN_ACTS = {"relu": jaxdnn.relu, "gelu": jaxdnn.gelu}
_LAX_ACTS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu}


# The example keeps float32 accuracy on the GPU too (HIGHEST: 3xTF32 on tensor cores for jaxdnn,
# no TF32 for XLA); precision=None is JAX's default, TF32 for float32 on a GPU. fused=False
# runs each epilogue (bias, residual add, activation) as its own op after the convolution or the
# batch norm, as the networks did before the fused ops: the baseline that shows what they buy.
def jaxdnn_ops(algo: str | None = None, precision=lax.Precision.HIGHEST,
               fused: bool = True) -> Ops:
    def plain_conv(x, w, stride, padding, groups, **epilogue):
        return jaxdnn.conv(x, w, stride=stride, padding=padding, groups=groups, algo=algo,
                           precision=precision, **epilogue)

    def conv(x, w, stride=1, padding="SAME", groups=1, **epilogue):
        if fused:
            return plain_conv(x, w, stride, padding, groups, **epilogue)
        return _then(plain_conv(x, w, stride, padding, groups), _JAXDNN_ACTS, **epilogue)

    def batch_norm(x, s, b, **epilogue):
        if fused:
            return jaxdnn.batch_norm(x, s, b, eps=BN_EPS, **epilogue)
        y, mean, var = jaxdnn.batch_norm(x, s, b, eps=BN_EPS)
        return _then(y, _JAXDNN_ACTS, **epilogue), mean, var

    def bn_inference(x, s, b, m, v, **epilogue):
        if fused:
            return jaxdnn.batch_norm_inference(x, s, b, m, v, eps=BN_EPS, **epilogue)
        return _then(jaxdnn.batch_norm_inference(x, s, b, m, v, eps=BN_EPS), _JAXDNN_ACTS,
                     **epilogue)

    return Ops(
        name="jaxdnn" if fused else "jaxdnn (unfused)",
        conv=conv,
        batch_norm=batch_norm,
        bn_inference=bn_inference,
        relu=jaxdnn.relu,
        max_pool=lambda x, window, stride, padding: jaxdnn.max_pool(
            x, (window, window), strides=(stride, stride), padding=padding),
        global_avg_pool=jaxdnn.global_avg_pool,
        layer_norm=lambda x, s, b: jaxdnn.layer_norm(x, s, b, eps=BN_EPS),
        gelu=jaxdnn.gelu,
        log_softmax=jaxdnn.log_softmax,
        dense=_dense(precision),
    )


def _lax_batch_norm(x, scale, bias, activation=None, residual=None):
    stats_dtype = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(stats_dtype)
    mean = jnp.mean(xf, axis=(0, 1, 2))
    var = jnp.mean(jnp.square(xf - mean), axis=(0, 1, 2))
    return _lax_normalise(x, scale, bias, mean, var, activation, residual), mean, var


def _lax_normalise(x, scale, bias, mean, var, activation=None, residual=None):
    """As a user writes it: normalise, then the block's add and ReLU (XLA fuses them)."""
    stats_dtype = mean.dtype
    y = (x.astype(stats_dtype) - mean) * lax.rsqrt(var + BN_EPS) * scale + bias
    return _then(y.astype(x.dtype), _LAX_ACTS, activation=activation, residual=residual)


def _lax_layer_norm(x, scale, bias):
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    return ((xf - mean) * lax.rsqrt(var + BN_EPS) * scale + bias).astype(x.dtype)


def lax_ops(precision=lax.Precision.HIGHEST) -> Ops:
    def conv(x, w, stride=1, padding="SAME", groups=1, **epilogue):
        """As a user writes it: the convolution, then + bias, + residual and the activation
        (XLA fuses them, and cuDNN's fused convolution may take the bias and ReLU)."""
        y = lax.conv_general_dilated(x, w, (stride, stride), padding,
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     feature_group_count=groups, precision=precision)
        return _then(y, _LAX_ACTS, **epilogue)

    return Ops(
        name="jax.lax",
        conv=conv,
        batch_norm=_lax_batch_norm,
        bn_inference=_lax_normalise,
        relu=jax.nn.relu,
        max_pool=lambda x, window, stride, padding: lax.reduce_window(
            x, -jnp.inf, lax.max, (1, window, window, 1), (1, stride, stride, 1), padding),
        global_avg_pool=lambda x: jnp.mean(x, axis=(1, 2)),
        layer_norm=_lax_layer_norm,
        gelu=jax.nn.gelu,
        log_softmax=jax.nn.log_softmax,
        dense=_dense(precision),
    )


# ---- initialisation ---------------------------------------------------------------------------

def _he(key, shape, fan_in):
    return jax.random.normal(key, shape, jnp.float32) * np.sqrt(2.0 / fan_in)


def _conv_params(key, k, cin, cout):
    return {"w": _he(key, (k, k, cin, cout), k * k * cin),
            "scale": jnp.ones((cout,)), "bias": jnp.zeros((cout,))}


def _bn_state(c):
    return {"mean": jnp.zeros((c,)), "var": jnp.ones((c,))}


def _dense_params(key, din, dout):
    return {"w": _he(key, (din, dout), din), "b": jnp.zeros((dout,))}


# ---- a small ResNet ---------------------------------------------------------------------------
# stem conv3x3 -> BN -> ReLU, a residual block, 2x2 max pool, conv3x3 to `width*2` -> BN -> ReLU,
# a residual block, global average pool, dense -> log_softmax.

CNN_LAYERS = ("stem", "res1a", "res1b", "down", "res2a", "res2b")


def init_cnn(key, image_shape, num_classes, width=32):
    _, _, cin = image_shape
    chans = {"stem": (cin, width), "res1a": (width, width), "res1b": (width, width),
             "down": (width, 2 * width), "res2a": (2 * width, 2 * width),
             "res2b": (2 * width, 2 * width)}
    keys = jax.random.split(key, len(CNN_LAYERS) + 1)
    params = {name: _conv_params(k, 3, *chans[name]) for name, k in zip(CNN_LAYERS, keys)}
    params["head"] = _dense_params(keys[-1], 2 * width, num_classes)
    state = {name: _bn_state(chans[name][1]) for name in CNN_LAYERS}
    return params, state


def _conv_bn(ops: Ops, p, s, x, train, stride=1, padding="SAME", activation=None,
             residual=None):
    """conv, batch norm, then `activation` of (that + `residual`), as one batch-norm op."""
    y = ops.conv(x, p["w"], stride, padding)
    epilogue = dict(activation=activation, residual=residual)
    if train:
        y, mean, var = ops.batch_norm(y, p["scale"], p["bias"], **epilogue)
        s = {"mean": BN_MOMENTUM * s["mean"] + (1 - BN_MOMENTUM) * mean,
             "var": BN_MOMENTUM * s["var"] + (1 - BN_MOMENTUM) * var}
    else:
        y = ops.bn_inference(y, p["scale"], p["bias"], s["mean"], s["var"], **epilogue)
    return y, s


def apply_cnn(ops: Ops, params, state, x, train: bool):
    """Log-probabilities (N, classes) and the updated batch-norm state."""
    new = {}

    def layer(name, x, residual=None):
        y, new[name] = _conv_bn(ops, params[name], state[name], x, train, activation="relu",
                                residual=residual)
        return y

    x = layer("stem", x)
    x = layer("res1b", layer("res1a", x), residual=x)
    x = ops.max_pool(x, 2, 2, "VALID")
    x = layer("down", x)
    x = layer("res2b", layer("res2a", x), residual=x)
    x = ops.global_avg_pool(x)
    logits = ops.dense(x, params["head"]["w"], params["head"]["b"])
    return ops.log_softmax(logits), new


# ---- an MLP -----------------------------------------------------------------------------------

def init_mlp(key, image_shape, num_classes, width=256, depth=2):
    din = int(np.prod(image_shape))
    keys = jax.random.split(key, depth + 1)
    layers = []
    for i in range(depth):
        layers.append({**_dense_params(keys[i], din if i == 0 else width, width),
                       "scale": jnp.ones((width,)), "bias": jnp.zeros((width,))})
    return {"hidden": layers, "head": _dense_params(keys[-1], width, num_classes)}, {}


def apply_mlp(ops: Ops, params, state, x, train: bool):
    x = x.reshape(x.shape[0], -1)
    for p in params["hidden"]:
        x = ops.gelu(ops.layer_norm(ops.dense(x, p["w"], p["b"]), p["scale"], p["bias"]))
    logits = ops.dense(x, params["head"]["w"], params["head"]["b"])
    return ops.log_softmax(logits), state


MODELS = {"cnn": (init_cnn, apply_cnn), "mlp": (init_mlp, apply_mlp)}


def cast_floats(tree, dtype):
    """Every floating leaf of `tree` cast to `dtype` (the compute dtype)."""
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a,
                        tree)


def cross_entropy(logp, labels):
    return -jnp.mean(jnp.take_along_axis(logp.astype(jnp.float32), labels[:, None], axis=1))


def loss_fn(apply, ops, compute_dtype, params, state, x, y):
    """Mean cross-entropy in float32 with the forward pass in `compute_dtype`; BN running
    statistics stay float32."""
    logp, new_state = apply(ops, cast_floats(params, compute_dtype), state,
                            x.astype(compute_dtype), True)
    new_state = cast_floats(new_state, jnp.float32)
    return cross_entropy(logp, y), new_state


def predict(apply, ops, compute_dtype, params, state, x):
    logp, _ = apply(ops, cast_floats(params, compute_dtype), state, x.astype(compute_dtype), False)
    return jnp.argmax(logp, axis=-1)
