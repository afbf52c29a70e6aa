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
    conv: Callable          # (x, w, stride) -> y, SAME padding, HWIO filter
    batch_norm: Callable    # (x, scale, bias) -> (y, batch_mean, batch_var), over N, H, W
    bn_inference: Callable  # (x, scale, bias, mean, var) -> y
    relu: Callable
    max_pool: Callable      # 2x2, stride 2
    global_avg_pool: Callable  # (N, H, W, C) -> (N, C)
    layer_norm: Callable    # (x, scale, bias) over the last axis
    gelu: Callable
    log_softmax: Callable


def jaxdnn_ops(algo: str | None = None) -> Ops:
    return Ops(
        name="jaxdnn",
        # HIGHEST: float32 accuracy on the GPU too (3xTF32 on tensor cores), like the lax side.
        conv=lambda x, w, stride=1: jaxdnn.conv(x, w, stride=stride, padding="SAME", algo=algo,
                                                precision=lax.Precision.HIGHEST),
        batch_norm=lambda x, s, b: jaxdnn.batch_norm(x, s, b, eps=BN_EPS),
        bn_inference=lambda x, s, b, m, v: jaxdnn.batch_norm_inference(x, s, b, m, v, eps=BN_EPS),
        relu=jaxdnn.relu,
        max_pool=lambda x: jaxdnn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID"),
        global_avg_pool=jaxdnn.global_avg_pool,
        layer_norm=lambda x, s, b: jaxdnn.layer_norm(x, s, b, eps=BN_EPS),
        gelu=jaxdnn.gelu,
        log_softmax=jaxdnn.log_softmax,
    )


def _lax_batch_norm(x, scale, bias):
    stats_dtype = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(stats_dtype)
    mean = jnp.mean(xf, axis=(0, 1, 2))
    var = jnp.mean(jnp.square(xf - mean), axis=(0, 1, 2))
    return _lax_normalise(x, scale, bias, mean, var), mean, var


def _lax_normalise(x, scale, bias, mean, var):
    stats_dtype = mean.dtype
    y = (x.astype(stats_dtype) - mean) * lax.rsqrt(var + BN_EPS) * scale + bias
    return y.astype(x.dtype)


def _lax_layer_norm(x, scale, bias):
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    return ((xf - mean) * lax.rsqrt(var + BN_EPS) * scale + bias).astype(x.dtype)


def lax_ops() -> Ops:
    return Ops(
        name="jax.lax",
        # HIGHEST: float32 accuracy, as on the jaxdnn side (XLA:GPU would otherwise use TF32).
        conv=lambda x, w, stride=1: lax.conv_general_dilated(
            x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=lax.Precision.HIGHEST),
        batch_norm=_lax_batch_norm,
        bn_inference=_lax_normalise,
        relu=jax.nn.relu,
        max_pool=lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                             "VALID"),
        global_avg_pool=lambda x: jnp.mean(x, axis=(1, 2)),
        layer_norm=_lax_layer_norm,
        gelu=jax.nn.gelu,
        log_softmax=jax.nn.log_softmax,
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


def _dense(x, p):
    """x @ w + b in exact float32 on every platform (no TF32), like the convolutions."""
    w, b = p["w"].astype(x.dtype), p["b"].astype(x.dtype)
    return jnp.dot(x, w, precision=lax.Precision.HIGHEST) + b


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


def _conv_bn(ops: Ops, p, s, x, train, stride=1):
    y = ops.conv(x, p["w"], stride)
    if train:
        y, mean, var = ops.batch_norm(y, p["scale"], p["bias"])
        s = {"mean": BN_MOMENTUM * s["mean"] + (1 - BN_MOMENTUM) * mean,
             "var": BN_MOMENTUM * s["var"] + (1 - BN_MOMENTUM) * var}
    else:
        y = ops.bn_inference(y, p["scale"], p["bias"], s["mean"], s["var"])
    return y, s


def apply_cnn(ops: Ops, params, state, x, train: bool):
    """Log-probabilities (N, classes) and the updated batch-norm state."""
    new = {}

    def layer(name, x, relu=True):
        y, new[name] = _conv_bn(ops, params[name], state[name], x, train)
        return ops.relu(y) if relu else y

    x = layer("stem", x)
    x = ops.relu(x + layer("res1b", layer("res1a", x), relu=False))
    x = ops.max_pool(x)
    x = layer("down", x)
    x = ops.relu(x + layer("res2b", layer("res2a", x), relu=False))
    x = ops.global_avg_pool(x)
    logits = _dense(x, params["head"])
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
        x = ops.gelu(ops.layer_norm(_dense(x, p), p["scale"], p["bias"]))
    logits = _dense(x, params["head"])
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
