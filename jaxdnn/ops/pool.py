"""Pooling: public API, primitives, autodiff and batching rules.

Six primitives on channels-last operands of rank 3 to 5 (``cc/pool/pool.h``)::

    pool_max_fwd_p(x)              -> y            x (N, *spatial, C), y (N, *out_spatial, C)
    pool_max_fwd_index_p(x)        -> (y, idx)     idx: window index of the selected element
    pool_max_gather_p(t, idx)      -> y-shaped     t at each selected element   (linear in t)
    pool_max_scatter_p(dy, idx)    -> x-shaped     dy routed to the selected elements (linear)
    pool_avg_fwd_p(x)              -> y            (linear)
    pool_avg_bwd_p(dy)             -> x-shaped     (linear)

Max pooling follows lax's reduce_window_max / select_and_gather_add / select_and_scatter_add
family: the jvp of ``max_fwd`` computes the selection once (``max_fwd_index``) and gathers the
tangent there; gather and scatter transpose into each other, and their derivative with respect
to the selection is zero, so every order of ``grad``/``jvp`` runs our kernels. Average pooling
is linear: forward and backward are each other's transpose. Batching folds the mapped axis
into N.

Every primitive carries ``algo`` (an algorithm forced by the caller, or None) and ``policy``
(the jaxdnn.config policy at trace time); the algorithm is chosen from the platform's registry
at lowering time (jaxdnn/selection, whose pool family is ``selection/pool.py``: heuristic,
forced or benchmark) and named in the custom call, as for convolutions and softmax.
:func:`pool_algorithms` lists them: the GPU's forward "global", "tile", "strip" and "window"
kernels and backward "gather"; the CPU's "window" and "gather". A forced ``algo=`` applies to
the forward ops; derivatives that run the other direction choose their own.

The selected element of a window (where the gradient goes) is the first maximal one in window
order, padding counting as -inf: the rule of ``jax.grad`` of ``lax.reduce_window`` max. So a
window of -inf routes its gradient to its first tap, and drops it when that tap is padding.
NaN counts as larger than any number (a window with NaN outputs NaN and routes its gradient to
its first NaN). The jvp gathers the tangent at the same element: for a window of -inf that
is its first tap's tangent, where lax's jvp (select_and_gather_add) gives 0; gather and
scatter stay each other's transposes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import ShapedArray
from jax.interpreters import ad, batching

from .. import _checks, _ffi, _partition
from .. import _config as config_lib
from ..selection import core

__all__ = ["avg_pool", "global_avg_pool", "max_pool"]

_CHANNELS_LAST = {1: "NWC", 2: "NHWC", 3: "NDHWC"}
_CHANNELS_FIRST = {1: "NCW", 2: "NCHW", 3: "NCDHW"}
_MAX_U8_WINDOW = 254  # cc/pool/pool.h kMaxU8Window


# ----------------------------------------------------------------------------------------------
# The problem descriptor
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """A channels-last pooling problem over 1 to 3 spatial dims. The operands keep their
    natural rank (a reshape to rank 5 would make XLA copy them); the kernels see 3 spatial
    dims with leading size-1 ones (``attrs``)."""

    in_shape: tuple[int, ...]  # (N, *spatial, C)
    window: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]

    @property
    def out_shape(self) -> tuple[int, ...]:
        n, *spatial, c = self.in_shape
        out = [(i + lo + hi - w) // s + 1
               for i, w, s, (lo, hi) in zip(spatial, self.window, self.stride, self.padding)]
        return (n, *out, c)

    @property
    def index_dtype(self) -> np.dtype:
        """uint8 indices for windows of up to 254 elements, int32 beyond."""
        size = int(np.prod(self.window))
        return np.dtype(np.uint8 if size <= _MAX_U8_WINDOW else np.int32)

    def with_batch(self, n: int) -> PoolSpec:
        return dataclasses.replace(self, in_shape=(n, *self.in_shape[1:]))

    def attrs(self, count_include_pad: bool = True) -> dict:
        """The handler attributes: 3 entries each, leading spatial dims of size 1."""
        k = 3 - len(self.window)
        return dict(window=(1,) * k + self.window, stride=(1,) * k + self.stride,
                    pad_lo=(0,) * k + tuple(lo for lo, _ in self.padding),
                    pad_hi=(0,) * k + tuple(hi for _, hi in self.padding),
                    count_include_pad=bool(count_include_pad))


# ----------------------------------------------------------------------------------------------
# Primitives
# ----------------------------------------------------------------------------------------------

def _check(name, operand, shape, dtype=None):
    if tuple(operand.shape) != tuple(shape) or (dtype is not None and operand.dtype != dtype):
        raise TypeError(f"jaxdnn pool {name}: operand {operand.str_short()} does not match "
                        f"the expected {tuple(shape)}" + (f" {dtype}" if dtype else ""))


def _unary_abstract(name, *, reads_y):
    def rule(a, *, spec, count_include_pad=True, algo, policy):
        del count_include_pad, algo, policy
        _check(name, a, spec.out_shape if reads_y else spec.in_shape)
        return ShapedArray(spec.in_shape if reads_y else spec.out_shape, a.dtype)
    return rule


def _max_fwd_index_abstract(x, *, spec, algo, policy):
    _check("max_fwd_index", x, spec.in_shape)
    return (ShapedArray(spec.out_shape, x.dtype), ShapedArray(spec.out_shape, spec.index_dtype))


def _indexed_abstract(name, *, reads_y):
    def rule(a, idx, *, spec, algo, policy):
        _check(name, a, spec.out_shape if reads_y else spec.in_shape)
        _check(name, idx, spec.out_shape, spec.index_dtype)
        return ShapedArray(spec.in_shape if reads_y else spec.out_shape, a.dtype)
    return rule


def _attrs(op, platform, ctx, **params):
    choice = core.choose_for_call(_PRIMS[op], ctx.avals_in, params, platform)
    return dict(params["spec"].attrs(params.get("count_include_pad", True)), algo=choice.name)


def _define(name, abstract_eval, **kw):
    return _ffi.define_primitive(f"jaxdnn_pool_{name}", abstract_eval,
                                 attrs=functools.partial(_attrs, name), **kw)


pool_max_fwd_p = _define("max_fwd", _unary_abstract("max_fwd", reads_y=False))
pool_max_fwd_index_p = _define("max_fwd_index", _max_fwd_index_abstract, multiple_results=True)
pool_max_gather_p = _define("max_gather", _indexed_abstract("max_gather", reads_y=False))
pool_max_scatter_p = _define("max_scatter", _indexed_abstract("max_scatter", reads_y=True))
pool_avg_fwd_p = _define("avg_fwd", _unary_abstract("avg_fwd", reads_y=False))
pool_avg_bwd_p = _define("avg_bwd", _unary_abstract("avg_bwd", reads_y=True))
_PRIMS = {"max_fwd": pool_max_fwd_p, "max_fwd_index": pool_max_fwd_index_p,
          "max_gather": pool_max_gather_p, "max_scatter": pool_max_scatter_p,
          "avg_fwd": pool_avg_fwd_p, "avg_bwd": pool_avg_bwd_p}


# Autodiff. max_fwd's tangent is the tangent at the selected element; gather and scatter are
# linear in their first operand and constant in the (integer) selection.

def _zero_like(v):
    return ad.Zero(jax.typeof(v).to_tangent_aval())


def _max_fwd_jvp(primals, tangents, *, spec, algo, policy):
    (x,), (tx,) = primals, tangents
    if type(tx) is ad.Zero:
        y = pool_max_fwd_p.bind(x, spec=spec, algo=algo, policy=policy)
        return y, _zero_like(y)
    y, idx = pool_max_fwd_index_p.bind(x, spec=spec, algo=algo, policy=policy)
    return y, pool_max_gather_p.bind(tx, idx, spec=spec, algo=None, policy=policy)


def _max_fwd_index_jvp(primals, tangents, *, spec, algo, policy):
    (x,), (tx,) = primals, tangents
    y, idx = pool_max_fwd_index_p.bind(x, spec=spec, algo=algo, policy=policy)
    ty = (_zero_like(y) if type(tx) is ad.Zero else
          pool_max_gather_p.bind(tx, idx, spec=spec, algo=None, policy=policy))
    return (y, idx), (ty, _zero_like(idx))


def _indexed_jvp(prim):
    def rule(primals, tangents, **params):
        (a, idx), (ta, _) = primals, tangents
        out = prim.bind(a, idx, **params)
        if type(ta) is ad.Zero:
            return out, _zero_like(out)
        return out, prim.bind(ta, idx, **params)
    return rule


def _indexed_transpose(other):
    def rule(ct, a, idx, *, spec, algo, policy):
        assert ad.is_undefined_primal(a) and not ad.is_undefined_primal(idx)
        if type(ct) is ad.Zero:
            return [ad.Zero(a.aval.to_tangent_aval()), None]
        return [other.bind(ct, idx, spec=spec, algo=None, policy=policy), None]
    return rule


def _avg_transpose(other):
    def rule(ct, _, *, algo, **params):
        return [other.bind(ct, algo=None, **params)]
    return rule


ad.primitive_jvps[pool_max_fwd_p] = _max_fwd_jvp
ad.primitive_jvps[pool_max_fwd_index_p] = _max_fwd_index_jvp
ad.primitive_jvps[pool_max_gather_p] = _indexed_jvp(pool_max_gather_p)
ad.primitive_jvps[pool_max_scatter_p] = _indexed_jvp(pool_max_scatter_p)
ad.primitive_transposes[pool_max_gather_p] = _indexed_transpose(pool_max_scatter_p)
ad.primitive_transposes[pool_max_scatter_p] = _indexed_transpose(pool_max_gather_p)
ad.deflinear2(pool_avg_fwd_p, _avg_transpose(pool_avg_bwd_p))
ad.deflinear2(pool_avg_bwd_p, _avg_transpose(pool_avg_fwd_p))


# Batching: the mapped axis is folded into N (an unmapped operand of gather/scatter is
# broadcast first).

def _fold(a, dim, size):
    a = jnp.broadcast_to(a, (size, *a.shape)) if dim is None else jnp.moveaxis(a, dim, 0)
    return a.reshape(size * a.shape[1], *a.shape[2:])


def _batch_rule(prim):
    def rule(args, dims, *, spec, **params):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        n = spec.in_shape[0]
        out = prim.bind(*(_fold(a, d, size) for a, d in zip(args, dims)),
                        spec=spec.with_batch(size * n), **params)
        unfold = lambda o: o.reshape(size, n, *o.shape[1:])  # noqa: E731
        if prim.multiple_results:
            return [unfold(o) for o in out], [0] * len(out)
        return unfold(out), 0
    return rule


for _prim in _PRIMS.values():
    batching.primitive_batchers[_prim] = _batch_rule(_prim)


# Partitioning: batch and channels pass through, the spatial dims need replication (no halo
# exchange). Each operand and result is shaped as the input ("in") or the output ("out").
_SHAPED = {"max_fwd": ("in", "out"), "max_fwd_index": ("in", "out", "out"),
           "max_gather": ("in", "out", "out"), "max_scatter": ("out", "out", "in"),
           "avg_fwd": ("in", "out"), "avg_bwd": ("out", "in")}


def _partition_rule(op):
    def rule(*avals, spec, **params):
        nsp = len(spec.window)
        names = {k: ["n", *_partition.dims(k, nsp), "c"] for k in ("in", "out")}
        shaped = [names[k] for k in _SHAPED[op]]
        spatial = tuple(f for k in ("in", "out") for f in names[k][1:-1])
        return _partition.Rule(_partition.einsum(shaped[:len(avals)], shaped[len(avals):]),
                               need_replication=spatial)
    return rule


def _local_params(avals, *, spec, **params):
    n, c = avals[0].shape[0], avals[0].shape[-1]
    return dict(params, spec=dataclasses.replace(spec, in_shape=(n, *spec.in_shape[1:-1], c)))


for _op, _prim in _PRIMS.items():
    _partition.partitionable(_prim, _partition_rule(_op), _local_params)


# ----------------------------------------------------------------------------------------------
# Argument checking and canonicalisation
# ----------------------------------------------------------------------------------------------

def _int_tuple(value, nd: int, name: str, api: str, *, minimum: int):
    items = (value,) * nd if isinstance(value, (int, np.integer)) else value
    try:
        items = tuple(items)
    except TypeError:
        items = None
    if (items is None or len(items) != nd or
            any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum
                for v in items)):
        raise ValueError(f"{api}: `{name}` must be an int >= {minimum} or a sequence of {nd} "
                         f"such ints (one per spatial dimension), got {value!r}")
    return tuple(int(v) for v in items)


def _padding_pairs(padding, spatial, window, strides, api):
    nd = len(spatial)
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            raise ValueError(f"{api}: `padding` string must be 'SAME' or 'VALID', got "
                             f"{padding!r}")
        return tuple(lax.padtype_to_pads(spatial, window, strides, padding.upper()))
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        pairs = ((padding, padding),) * nd
    else:
        try:
            pairs = tuple(tuple(p) for p in padding)
        except TypeError:
            pairs = None
    if (pairs is None or len(pairs) != nd or
            any(len(p) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer))
                                   or v < 0 for v in p) for p in pairs)):
        raise ValueError(f"{api}: `padding` must be 'SAME', 'VALID', an int >= 0 or a sequence "
                         f"of {nd} (low, high) pairs of ints >= 0, got {padding!r}")
    return tuple((int(lo), int(hi)) for lo, hi in pairs)


def _canonical(x, window, strides, padding, layout, api):
    """Checks the arguments, moves x to channels-last and builds the PoolSpec. Returns
    (x, spec, finish) where finish(y) maps a channels-last result back to `layout`."""
    x = _checks.operand(x, "x", api)
    nd = x.ndim - 2
    if layout is None:
        if nd not in _CHANNELS_LAST:
            raise ValueError(f"{api}: `x` must have rank 3, 4 or 5 (1 to 3 spatial dims), got "
                             f"rank {x.ndim}")
        layout = _CHANNELS_LAST[nd]
    if layout not in (*_CHANNELS_LAST.values(), *_CHANNELS_FIRST.values()):
        raise ValueError(f"{api}: `layout` must be one of NWC NCW NHWC NCHW NDHWC NCDHW, got "
                         f"{layout!r}")
    if len(layout) != x.ndim:
        raise ValueError(f"{api}: `layout` {layout!r} does not match the rank {x.ndim} of `x`")
    channels_first = layout in _CHANNELS_FIRST.values()
    if channels_first:
        x = jnp.moveaxis(x, 1, -1)
    spatial = x.shape[1:-1]
    window = _int_tuple(window, nd, "window", api, minimum=1)
    strides = window if strides is None else _int_tuple(strides, nd, "strides", api, minimum=1)
    pads = _padding_pairs(padding, spatial, window, strides, api)
    for i, (n, w, (lo, hi)) in enumerate(zip(spatial, window, pads)):
        if n + lo + hi < w:
            raise ValueError(f"{api}: the window {window} is larger than the padded input along "
                             f"spatial dimension {i} ({n} + padding {lo} + {hi} < {w})")
    spec = PoolSpec(in_shape=tuple(x.shape), window=window, stride=strides, padding=pads)

    def finish(y):
        return jnp.moveaxis(y, -1, 1) if channels_first else y

    return x, spec, finish


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def _selection(algo, api):
    """The selection parameters of a call: a forced algorithm (checked to be a name) and the
    jaxdnn.config policy."""
    if algo is not None and not isinstance(algo, str):
        raise TypeError(f"{api}: `algo` must be None or an algorithm name, got {algo!r}")
    return dict(algo=algo, policy=config_lib.settings().policy())


def max_pool(x, window, strides=None, padding="VALID", layout: str | None = None, *,
             algo: str | None = None):
    """Max pooling over 1, 2 or 3 spatial dimensions.

    Matches ``lax.reduce_window(x, -inf, lax.max, ...)``: padding is -inf and NaN propagates.
    The gradient goes to the first maximal element of each window (jax.lax's tie rule) and is
    computed by a deterministic gather.

    Args:
      x: input, channels-last (``NWC``/``NHWC``/``NDHWC``) unless ``layout`` says otherwise.
      window: window size, an int or one int per spatial dimension.
      strides: an int or one int per spatial dimension; default ``window`` (as in Keras and
        PyTorch; note that flax's ``max_pool`` defaults to stride 1).
      padding: ``"VALID"``, ``"SAME"``, an int, or one ``(low, high)`` pair per spatial dim.
      layout: one of ``NWC NCW NHWC NCHW NDHWC NCDHW``; default: channels-last of x's rank.
      algo: None, or a forward algorithm of the platform's registry (see
        :func:`pool_algorithms`).
    """
    api = "jaxdnn.max_pool"
    x, spec, finish = _canonical(x, window, strides, padding, layout, api)
    return finish(pool_max_fwd_p.bind(x, spec=spec, **_selection(algo, api)))


def avg_pool(x, window, strides=None, padding="VALID", count_include_pad: bool = True,
             layout: str | None = None, *, algo: str | None = None):
    """Average pooling over 1, 2 or 3 spatial dimensions.

    The window sum (zero padding) is divided by the window size, or with
    ``count_include_pad=False`` by the number of elements that lie on the input, as in
    ``flax.linen.avg_pool`` (a window made only of padding then gives NaN). Other arguments as
    in :func:`max_pool` (``strides`` defaults to ``window``).
    """
    api = "jaxdnn.avg_pool"
    if not isinstance(count_include_pad, (bool, np.bool_)):
        raise TypeError(f"{api}: `count_include_pad` must be a bool, got {count_include_pad!r}")
    return _avg_pool(x, window, strides, padding, bool(count_include_pad), layout, api, algo)


def _avg_pool(x, window, strides, padding, count_include_pad, layout, api, algo):
    x, spec, finish = _canonical(x, window, strides, padding, layout, api)
    return finish(pool_avg_fwd_p.bind(x, spec=spec, count_include_pad=count_include_pad,
                                      **_selection(algo, api)))


def global_avg_pool(x, layout: str | None = None, keepdims: bool = False, *,
                    algo: str | None = None):
    """Mean over all spatial dimensions: ``(N, ..., C) -> (N, C)`` (or ``(N, 1, ..., 1, C)``
    in ``layout`` with ``keepdims=True``). `algo` as in :func:`avg_pool`."""
    api = "jaxdnn.global_avg_pool"
    x = _checks.operand(x, "x", api)
    if layout is None and x.ndim - 2 not in _CHANNELS_LAST:
        raise ValueError(f"{api}: `x` must have rank 3, 4 or 5 (1 to 3 spatial dims), got "
                         f"rank {x.ndim}")
    channels_first = layout in _CHANNELS_FIRST.values()
    spatial = x.shape[2:] if channels_first else x.shape[1:-1]
    if any(s == 0 for s in spatial):
        raise ValueError(f"{api}: `x` has an empty spatial dimension {tuple(x.shape)}")
    y = _avg_pool(x, tuple(spatial), None, "VALID", True, layout, api, algo)
    if keepdims:
        return y
    return y.reshape(y.shape[0], y.shape[1]) if channels_first else y.reshape(y.shape[0], -1)
