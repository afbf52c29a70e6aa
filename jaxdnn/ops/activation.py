"""Activations: relu, relu6, leaky_relu, elu, sigmoid, tanh, gelu, silu (swish), softplus.

Two primitives serve every op (the op is a parameter), lowered to one forward and one backward
kernel family (``cc/activation``)::

    activation_fwd_p(x; op, alpha)       -> y  = f(x)
    activation_bwd_p(x, dy; op, alpha)   -> dx = dy * f'(x)

The forward's jvp is the backward primitive applied to the tangent: linear in it, and its own
transpose (the Jacobian is diagonal), so ``grad`` runs our backward kernel, which needs only x
saved. From second order on, the backward primitive is differentiated in x too: that term,
``dy * f''(x) * dx``, is jnp on the saved x. Every op matches ``jax.nn``, special values
included (see ``cc/activation/activation_math.h``).
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching

from .. import _checks, _ffi, _partition

__all__ = ["elu", "gelu", "leaky_relu", "relu", "relu6", "sigmoid", "silu", "softplus", "swish",
           "tanh"]

# Op codes of the kernels: the position in this tuple (cc/activation/activation.h: Op).
_OPS = ("relu", "relu6", "leaky_relu", "elu", "sigmoid", "tanh", "gelu_tanh", "gelu_erf", "silu",
        "softplus")
# Python floats (weakly typed): they keep the operand's dtype in the jnp formulas below.
_SQRT_2_OVER_PI = float(np.sqrt(2 / np.pi))
_INV_SQRT_2PI = float(1 / np.sqrt(2 * np.pi))


# ----------------------------------------------------------------------------------------------
# Primitives
# ----------------------------------------------------------------------------------------------

def _fwd_abstract_eval(x, *, op, alpha):
    return ShapedArray(x.shape, x.dtype)


def _bwd_abstract_eval(x, dy, *, op, alpha):
    if x.shape != dy.shape or x.dtype != dy.dtype:
        raise TypeError(f"jaxdnn activation bwd: operands {x.str_short()} and {dy.str_short()} "
                        "must have one shape and dtype")
    return ShapedArray(x.shape, x.dtype)


def _attrs(platform, ctx, *, op, alpha):
    # alpha as float64[1]: float64 kernels see the exact Python value (cc/ffi/activation_common.h)
    return dict(op=_OPS.index(op), alpha=np.array([alpha], dtype=np.float64))


activation_fwd_p = _ffi.define_primitive("jaxdnn_activation_fwd", _fwd_abstract_eval,
                                         attrs=_attrs)
activation_bwd_p = _ffi.define_primitive("jaxdnn_activation_bwd", _bwd_abstract_eval,
                                         attrs=_attrs)


def _second_derivative(op, alpha, x):
    """f''(x) in jnp, or None where it is zero (away from the kinks)."""
    if op in ("relu", "relu6", "leaky_relu"):
        return None
    if op == "elu":
        return jnp.where(x > 0, 0, alpha * jnp.exp(x))
    if op in ("sigmoid", "softplus"):  # f' = p (1 - p) and f' = p, with p = sigmoid(x)
        p = jax.nn.sigmoid(x)
        return p * (1 - p) * (1 - 2 * p) if op == "sigmoid" else p * (1 - p)
    if op == "tanh":  # f' = 1 - t^2
        t = jnp.tanh(x)
        return -2 * t * (1 - t) * (1 + t)
    if op == "silu":  # f' = p (1 + x (1 - p))
        p = jax.nn.sigmoid(x)
        return p * (1 - p) * (2 + x * (1 - 2 * p))
    if op == "gelu_erf":  # f' = Phi(x) + x phi(x)
        return _INV_SQRT_2PI * jnp.exp(-x * x / 2) * (2 - x * x)
    # gelu_tanh: f = x S(v), v = 2 sqrt(2/pi) (x + 0.044715 x^3); f'' = 2 S' + x S''.
    k, a = 2 * _SQRT_2_OVER_PI, 0.044715
    p = jax.nn.sigmoid(k * x * (1 + a * x * x))
    dv, d2v = k * (1 + 3 * a * x * x), 6 * a * k * x
    ds = dv * p * (1 - p)
    d2s = d2v * p * (1 - p) + dv * dv * p * (1 - p) * (1 - 2 * p)
    return 2 * ds + x * d2s


def _fwd_jvp(t, x, *, op, alpha):
    return activation_bwd_p.bind(x, t, op=op, alpha=alpha)


def _bwd_jvp_x(t, x, dy, *, op, alpha):
    d2 = _second_derivative(op, alpha, x)
    return ad.Zero(jax.typeof(t)) if d2 is None else dy * d2 * t


def _bwd_jvp_dy(t, x, dy, *, op, alpha):
    return activation_bwd_p.bind(x, t, op=op, alpha=alpha)


def _bwd_transpose(ct, x, dy, *, op, alpha):
    # Linear in dy only; x is always a known value when this is transposed.
    if type(ct) is ad.Zero:
        return None, ad.Zero(dy.aval)
    return None, activation_bwd_p.bind(x, ct, op=op, alpha=alpha)


ad.defjvp(activation_fwd_p, _fwd_jvp)
ad.defjvp(activation_bwd_p, _bwd_jvp_x, _bwd_jvp_dy)
ad.primitive_transposes[activation_bwd_p] = _bwd_transpose


# Batching: elementwise, so the mapped axis just passes through; when the two backward
# operands are mapped differently (one may be unmapped), both move to the front.

def _fwd_batch(args, dims, **params):
    return activation_fwd_p.bind(args[0], **params), dims[0]


def _bwd_batch(args, dims, **params):
    if dims[0] == dims[1]:
        return activation_bwd_p.bind(*args, **params), dims[0]
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    x, dy = (jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
             for a, d in zip(args, dims))
    return activation_bwd_p.bind(x, dy, **params), 0


batching.primitive_batchers[activation_fwd_p] = _fwd_batch
batching.primitive_batchers[activation_bwd_p] = _bwd_batch

# Partitioning: elementwise, every dim passes through.
_partition.partitionable(activation_fwd_p, _partition.elementwise)
_partition.partitionable(activation_bwd_p, _partition.elementwise)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def _scalar(value, name, api):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise TypeError(f"jaxdnn.{api}: `{name}` must be a finite Python or numpy real scalar, "
                        f"got {value!r}")
    return float(value)


def _apply(op, x, api, alpha=0.0):
    return activation_fwd_p.bind(_checks.operand(x, "x", f"jaxdnn.{api}"), op=op, alpha=alpha)


def relu(x):
    """max(x, 0), with relu'(0) = 0 (as ``jax.nn.relu``)."""
    return _apply("relu", x, "relu")


def relu6(x):
    """min(max(x, 0), 6), with zero derivative at 0 and 6 (as ``jax.nn.relu6``)."""
    return _apply("relu6", x, "relu6")


def leaky_relu(x, negative_slope=1e-2):
    """x where x >= 0, else negative_slope * x."""
    return _apply("leaky_relu", x, "leaky_relu",
                  _scalar(negative_slope, "negative_slope", "leaky_relu"))


def elu(x, alpha=1.0):
    """x where x > 0, else alpha * (exp(x) - 1)."""
    return _apply("elu", x, "elu", _scalar(alpha, "alpha", "elu"))


def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return _apply("sigmoid", x, "sigmoid")


def tanh(x):
    """Hyperbolic tangent."""
    return _apply("tanh", x, "tanh")


def gelu(x, approximate=True):
    """Gaussian error linear unit: x * Phi(x) with ``approximate=False``, or the tanh
    approximation ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (the default, as
    ``jax.nn.gelu``)."""
    if not isinstance(approximate, (bool, np.bool_)):
        raise TypeError(f"jaxdnn.gelu: `approximate` must be a bool, got {approximate!r}")
    return _apply("gelu_tanh" if approximate else "gelu_erf", x, "gelu")


def silu(x):
    """x * sigmoid(x) (also called swish)."""
    return _apply("silu", x, "silu")


swish = silu


def softplus(x):
    """log(1 + exp(x)), computed without overflow."""
    return _apply("softplus", x, "softplus")
