"""Activations: relu, relu6, leaky_relu, elu, sigmoid, tanh, gelu, silu (swish), softplus.

Two primitives serve every op (the op is a parameter), lowered to one forward and one backward
kernel family (``cc/activation``)::

    activation_fwd_p(x; op, alpha)       -> y  = f(x)
    activation_bwd_p(s, dy; op, alpha)   -> dx = dy * f'(x)    s = y for sigmoid and tanh, else x

The forward's jvp is the backward primitive applied to the tangent: linear in it, and its own
transpose (the Jacobian is diagonal), so ``grad`` runs our backward kernel. From second order
on, the backward primitive is differentiated in its saved operand s: writing f'(x) = g(s), that
term is ``dy * g'(s) * ds``, in jnp on the saved operand. Every op matches ``jax.nn``, special
values included (see ``cc/activation/activation_math.h``).
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching

from .. import _ffi

__all__ = ["elu", "gelu", "leaky_relu", "relu", "relu6", "sigmoid", "silu", "softplus", "swish",
           "tanh"]

SUPPORTED_DTYPES = tuple(np.dtype(d) for d in (jnp.float32, jnp.float64, jnp.float16,
                                                jnp.bfloat16))

# Op codes of the kernels: the position in this tuple (cc/activation/activation.h: Op).
_OPS = ("relu", "relu6", "leaky_relu", "elu", "sigmoid", "tanh", "gelu_tanh", "gelu_erf", "silu",
        "softplus")
# Ops whose backward kernel reads y instead of x (activation::backward_takes_output).
_TAKES_OUTPUT = frozenset({"sigmoid", "tanh"})
# Python floats (weakly typed): they keep the operand's dtype in the jnp formulas below.
_SQRT_2_OVER_PI = float(np.sqrt(2 / np.pi))
_INV_SQRT_2PI = float(1 / np.sqrt(2 * np.pi))


# ----------------------------------------------------------------------------------------------
# Primitives
# ----------------------------------------------------------------------------------------------

def _fwd_abstract_eval(x, *, op, alpha):
    return ShapedArray(x.shape, x.dtype)


def _bwd_abstract_eval(s, dy, *, op, alpha):
    if s.shape != dy.shape or s.dtype != dy.dtype:
        raise TypeError(f"jaxdnn activation bwd: operands {s.str_short()} and {dy.str_short()} "
                        "must have one shape and dtype")
    return ShapedArray(s.shape, s.dtype)


def _attrs(platform, ctx, *, op, alpha):
    # alpha as float64[1]: float64 kernels see the exact Python value (cc/ffi/activation_common.h)
    return dict(op=_OPS.index(op), alpha=np.array([alpha], dtype=np.float64))


activation_fwd_p = _ffi.define_primitive("jaxdnn_activation_fwd", _fwd_abstract_eval,
                                         attrs=_attrs)
activation_bwd_p = _ffi.define_primitive("jaxdnn_activation_bwd", _bwd_abstract_eval,
                                         attrs=_attrs)


def _slope_derivative(op, alpha, s):
    """g'(s), where f'(x) = g(s) is the slope the backward kernel computes from its saved
    operand s (y for sigmoid and tanh, else x); None where it is zero."""
    if op in ("relu", "relu6", "leaky_relu"):
        return None
    if op == "elu":
        return jnp.where(s > 0, 0, alpha * jnp.exp(s))
    if op == "sigmoid":  # g(y) = y (1 - y)
        return 1 - 2 * s
    if op == "tanh":  # g(y) = 1 - y^2
        return -2 * s
    if op == "softplus":  # g(x) = sigmoid(x)
        p = jax.nn.sigmoid(s)
        return p * (1 - p)
    if op == "silu":  # g(x) = p (1 + x (1 - p)), p = sigmoid(x)
        p = jax.nn.sigmoid(s)
        return p * (1 - p) * (2 + s * (1 - 2 * p))
    if op == "gelu_erf":  # g(x) = Phi(x) + x phi(x)
        return _INV_SQRT_2PI * jnp.exp(-s * s / 2) * (2 - s * s)
    # gelu_tanh: f = x S(v), v = 2 sqrt(2/pi) (x + 0.044715 x^3); f'' = 2 S' + x S''.
    k, a = 2 * _SQRT_2_OVER_PI, 0.044715
    p = jax.nn.sigmoid(k * s * (1 + a * s * s))
    dv, d2v = k * (1 + 3 * a * s * s), 6 * a * k * s
    ds = dv * p * (1 - p)
    d2s = d2v * p * (1 - p) + dv * dv * p * (1 - p) * (1 - 2 * p)
    return 2 * ds + s * d2s


def _fwd_jvp(t, y, x, *, op, alpha):
    return activation_bwd_p.bind(y if op in _TAKES_OUTPUT else x, t, op=op, alpha=alpha)


def _bwd_jvp_saved(t, s, dy, *, op, alpha):
    d = _slope_derivative(op, alpha, s)
    return ad.Zero(jax.typeof(t)) if d is None else dy * d * t


def _bwd_jvp_cotangent(t, s, dy, *, op, alpha):
    return activation_bwd_p.bind(s, t, op=op, alpha=alpha)


def _bwd_transpose(ct, s, dy, *, op, alpha):
    # Linear in dy only; s is always a known value when this is transposed.
    if type(ct) is ad.Zero:
        return None, ad.Zero(dy.aval)
    return None, activation_bwd_p.bind(s, ct, op=op, alpha=alpha)


ad.defjvp2(activation_fwd_p, _fwd_jvp)
ad.defjvp(activation_bwd_p, _bwd_jvp_saved, _bwd_jvp_cotangent)
ad.primitive_transposes[activation_bwd_p] = _bwd_transpose


# Batching: elementwise, so the mapped axis just passes through; when the two backward
# operands are mapped differently (one may be unmapped), both move to the front.

def _fwd_batch(args, dims, **params):
    return activation_fwd_p.bind(args[0], **params), dims[0]


def _bwd_batch(args, dims, **params):
    s, dy = args
    if dims[0] == dims[1]:
        return activation_bwd_p.bind(s, dy, **params), dims[0]
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    s, dy = (jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
             for a, d in zip(args, dims))
    return activation_bwd_p.bind(s, dy, **params), 0


batching.primitive_batchers[activation_fwd_p] = _fwd_batch
batching.primitive_batchers[activation_bwd_p] = _bwd_batch


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def _input(x, api):
    try:
        x = jnp.asarray(x)
    except TypeError as e:
        raise TypeError(f"jaxdnn.{api}: `x` must be an array, got {type(x).__name__}") from e
    if np.dtype(x.dtype) not in SUPPORTED_DTYPES:
        raise TypeError(f"jaxdnn.{api}: `x` has dtype {x.dtype}; supported dtypes are float32, "
                        "float64, float16 and bfloat16")
    return x


def _scalar(value, name, api):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise TypeError(f"jaxdnn.{api}: `{name}` must be a finite Python or numpy real scalar, "
                        f"got {value!r}")
    return float(value)


def _apply(op, x, api, alpha=0.0):
    return activation_fwd_p.bind(_input(x, api), op=op, alpha=alpha)


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
