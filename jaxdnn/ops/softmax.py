"""softmax and log_softmax over any axis (or axes).

Two primitives, both over the last axis of operands of any rank >= 1 (the other dimensions are
rows), lowered to the kernels of ``cc/softmax``::

    softmax_fwd_p(x; log)      -> y = softmax(x), or log_softmax(x) with log=True
    softmax_bwd_p(y, c; kind)  -> kind "softmax":          y * (c - sum(y c))
                                  kind "log_softmax_vjp":  c - exp(y) sum(c)
                                  kind "log_softmax_jvp":  c - sum(exp(y) c)

The backward primitive is linear in c. softmax's Jacobian is symmetric, so its jvp and vjp are
the same "softmax" map (self-transpose); log_softmax's jvp map ("log_softmax_jvp") and vjp map
("log_softmax_vjp") are each other's transpose. So ``jvp`` and ``grad`` both run our kernels.
The backward primitive's derivative in y (second order on) is written in jnp. Other axes are
moved last (and several axes merged into one) with a transpose and a reshape around the call.

Both primitives carry ``algo`` (an algorithm forced by the caller, or None) and ``policy`` (the
jaxdnn.config policy at trace time); the algorithm is chosen from the platform's registry at
lowering time (jaxdnn/selection, whose softmax family is ``selection/softmax.py``: heuristic,
forced or benchmark) and named in the custom call, as for convolutions. The GPU registers
"rows" (the row in registers, one HBM read) and "online" (any row length); the CPU has one
kernel.
"""

from __future__ import annotations

import operator

import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching

from .. import _checks, _ffi, _partition
from .. import _config as config_lib
from ..selection import core

__all__ = ["log_softmax", "softmax"]

# Codes of the backward kernel (cc/softmax/softmax.h: Linear), and each map's transpose.
_KINDS = ("softmax", "log_softmax_vjp", "log_softmax_jvp")
_TRANSPOSE = {"softmax": "softmax", "log_softmax_vjp": "log_softmax_jvp",
              "log_softmax_jvp": "log_softmax_vjp"}


# ----------------------------------------------------------------------------------------------
# Primitives
# ----------------------------------------------------------------------------------------------

def _fwd_abstract_eval(x, *, log, algo, policy):
    if x.ndim == 0:
        raise TypeError("jaxdnn softmax fwd: the operand must have rank >= 1")
    return ShapedArray(x.shape, x.dtype)


def _bwd_abstract_eval(y, c, *, kind, algo, policy):
    if y.ndim == 0 or y.shape != c.shape or y.dtype != c.dtype:
        raise TypeError(f"jaxdnn softmax bwd: operands {y.str_short()} and {c.str_short()} must "
                        "have one shape (rank >= 1) and dtype")
    return ShapedArray(y.shape, y.dtype)


# The choice is made (and a forced algorithm checked) on every platform; the CPU handler has
# one kernel, so only the GPU's custom call names it.
def _fwd_attrs(platform, ctx, **params):
    name = core.choose_for_call(softmax_fwd_p, ctx.avals_in, params, platform).name
    log = params["log"]
    return dict(log=log) if platform == "cpu" else dict(log=log, algo=name)


def _bwd_attrs(platform, ctx, **params):
    name = core.choose_for_call(softmax_bwd_p, ctx.avals_in, params, platform).name
    kind = _KINDS.index(params["kind"])
    return dict(kind=kind) if platform == "cpu" else dict(kind=kind, algo=name)


softmax_fwd_p = _ffi.define_primitive("jaxdnn_softmax_fwd", _fwd_abstract_eval,
                                      attrs=_fwd_attrs)
softmax_bwd_p = _ffi.define_primitive("jaxdnn_softmax_bwd", _bwd_abstract_eval,
                                      attrs=_bwd_attrs)

def _row_sum(a):
    return jnp.sum(a, axis=-1, keepdims=True)


def _fwd_jvp(t, y, x, *, log, algo, policy):
    return softmax_bwd_p.bind(y, t, kind="log_softmax_jvp" if log else "softmax", algo=algo,
                              policy=policy)


def _bwd_jvp_y(t, y, c, *, kind, algo, policy):
    if kind == "softmax":  # d/dy [y (c - sum(y c))]
        return t * (c - _row_sum(y * c)) - y * _row_sum(t * c)
    if kind == "log_softmax_vjp":  # d/dy [c - exp(y) sum(c)]
        return -jnp.exp(y) * t * _row_sum(c)
    return jnp.broadcast_to(-_row_sum(jnp.exp(y) * t * c), y.shape)  # d/dy [c - sum(exp(y) c)]


def _bwd_jvp_c(t, y, c, *, kind, algo, policy):
    return softmax_bwd_p.bind(y, t, kind=kind, algo=algo, policy=policy)


def _bwd_transpose(ct, y, c, *, kind, algo, policy):
    # Linear in c only; y is always a known value when this is transposed.
    if type(ct) is ad.Zero:
        return None, ad.Zero(c.aval)
    return None, softmax_bwd_p.bind(y, ct, kind=_TRANSPOSE[kind], algo=algo, policy=policy)


ad.defjvp2(softmax_fwd_p, _fwd_jvp)
ad.defjvp(softmax_bwd_p, _bwd_jvp_y, _bwd_jvp_c)
ad.primitive_transposes[softmax_bwd_p] = _bwd_transpose


# Batching: the mapped axis joins the rows. It can stay where it is unless it is the last
# axis (the reduced one); then, or when the two backward operands are mapped differently, the
# mapped axis moves to the front (an unmapped operand is broadcast).

def _fwd_batch(args, dims, **params):
    x, d = args[0], dims[0]
    if d == x.ndim - 1:
        x, d = jnp.moveaxis(x, d, 0), 0
    return softmax_fwd_p.bind(x, **params), d


def _bwd_batch(args, dims, **params):
    y, c = args
    if dims[0] == dims[1] and dims[0] != y.ndim - 1:
        return softmax_bwd_p.bind(y, c, **params), dims[0]
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    y, c = (jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
            for a, d in zip(args, dims))
    return softmax_bwd_p.bind(y, c, **params), 0


batching.primitive_batchers[softmax_fwd_p] = _fwd_batch
batching.primitive_batchers[softmax_bwd_p] = _bwd_batch


# Partitioning: the softmax axis (the last) needs replication; every other dim passes through.

def _partition_rule(*avals, **params):
    d = [*_partition.dims("d", avals[0].ndim - 1), "axis"]
    return _partition.Rule(_partition.einsum([d] * len(avals), [d]), need_replication=("axis",))


_partition.partitionable(softmax_fwd_p, _partition_rule)
_partition.partitionable(softmax_bwd_p, _partition_rule)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def _axes(axis, ndim, api):
    """`axis` (an int, a sequence of ints or None for all) as a sorted tuple of non-negative
    axes."""
    if axis is None:
        return tuple(range(ndim))
    seq = axis if isinstance(axis, (tuple, list)) else (axis,)
    try:
        seq = [operator.index(a) for a in seq]
    except TypeError as e:
        raise TypeError(f"jaxdnn.{api}: `axis` must be an int, a sequence of ints or None, got "
                        f"{axis!r}") from e
    out = []
    for a in seq:
        if not -ndim <= a < ndim:
            raise ValueError(f"jaxdnn.{api}: `axis` {a} is out of range for `x` of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"jaxdnn.{api}: `axis` has repeated axes: {axis!r}")
    return tuple(sorted(out))


def _apply(x, axis, log, api, algo):
    x = _checks.operand(x, "x", f"jaxdnn.{api}")
    axes = _axes(axis, x.ndim, api)
    if algo is not None and not isinstance(algo, str):
        raise TypeError(f"jaxdnn.{api}: `algo` must be None or an algorithm name, got {algo!r}")
    params = dict(log=log, algo=algo, policy=config_lib.settings().policy())
    if axes == (x.ndim - 1,):
        return softmax_fwd_p.bind(x, **params)
    # Reduced axes last, merged into one (a reshape of the moved array).
    last = tuple(range(x.ndim - len(axes), x.ndim))
    moved = jnp.moveaxis(x, axes, last)
    rows_shape = moved.shape[:x.ndim - len(axes)]
    y = softmax_fwd_p.bind(moved.reshape(*rows_shape, int(np.prod(moved.shape[len(rows_shape):]))),
                           **params)
    return jnp.moveaxis(y.reshape(moved.shape), last, axes)


def softmax(x, axis=-1, *, algo=None):
    """exp(x) / sum(exp(x)) along `axis` (an int, a sequence of ints, or None for all axes),
    computed stably; a row holding +inf or NaN, or only -inf, gives NaN (as ``jax.nn``).
    `algo` forces a kernel of the platform's registry (see :func:`softmax_algorithms`)."""
    return _apply(x, axis, False, "softmax", algo)


def log_softmax(x, axis=-1, *, algo=None):
    """x - log(sum(exp(x))) along `axis`, computed stably (``x - max - log(sum(exp(x - max)))``).
    """
    return _apply(x, axis, True, "log_softmax", algo)
