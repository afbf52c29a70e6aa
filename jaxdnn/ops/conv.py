"""Convolution: public API, primitives, autodiff and batching rules.

Three primitives, one per direction, all on canonical rank-5 channels-last operands
(``cc/conv/conv.h``)::

    conv_fwd_p(x, w)         -> y     x (N, D, H, W, C), w (T, R, S, Cg, K), y (N, Z, P, Q, K)
    conv_bwd_data_p(dy, w)   -> dx
    conv_bwd_filter_p(x, dy) -> dw

Each is bilinear and its transposes are the other two, so ``grad``, ``jvp``, ``jacfwd``,
``hessian`` and ``vmap(grad)`` all follow from three transpose rules, as in
``jax/_src/lax/convolution.py``. The public functions turn any layout, 1-D/2-D/3-D problem,
``batch_group_count`` and ``preferred_element_type`` into this form with transposes and
reshapes (free when the caller already uses channels-last), and check every argument at trace
time so bad input raises a ``ValueError``/``TypeError`` naming the argument.

Each primitive carries ``algo`` (the algorithms forced by the caller, per direction) and
``policy`` (the jaxdnn.config policy at trace time); its lowering rule chooses the algorithm
(jaxdnn/selection: the conv family in ``selection/conv.py``) and names it in the custom call.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import ShapedArray
from jax.interpreters import ad, batching
from jax.sharding import NamedSharding, PartitionSpec

from .. import _checks, _ffi, _partition
from .. import _config as config_lib
from .activation import _OPS, _SQRT_2_OVER_PI
from ..selection import core

DIRECTIONS = ("fwd", "bwd_data", "bwd_filter")

_CHANNELS_LAST = {1: "NWC", 2: "NHWC", 3: "NDHWC"}
_CHANNELS_FIRST = {1: "NCW", 2: "NCHW", 3: "NCDHW"}


# ----------------------------------------------------------------------------------------------
# The problem descriptor
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ConvSpec:
    """A canonical 3-D convolution problem (shapes of x and w plus the window)."""

    lhs_shape: tuple[int, int, int, int, int]  # (N, D, H, W, C)
    rhs_shape: tuple[int, int, int, int, int]  # (T, R, S, Cg, K)
    stride: tuple[int, int, int]
    padding: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
    lhs_dilation: tuple[int, int, int]
    rhs_dilation: tuple[int, int, int]
    groups: int
    tf32: bool = False  # float32 operands may be rounded to TF32 (lax's default precision)

    @property
    def out_shape(self) -> tuple[int, ...]:
        n, *spatial, _ = self.lhs_shape
        out = []
        for i, f, s, (lo, hi), ld, rd in zip(spatial, self.rhs_shape[:3], self.stride,
                                               self.padding, self.lhs_dilation,
                                               self.rhs_dilation):
            in_d = 0 if i == 0 else (i - 1) * ld + 1
            f_d = 0 if f == 0 else (f - 1) * rd + 1
            span = in_d + lo + hi - f_d
            out.append(0 if span < 0 else span // s + 1)
        return (n, *out, self.rhs_shape[4])

    def macs(self) -> int:
        t, r, s, cg, _ = self.rhs_shape
        return int(np.prod(self.out_shape)) * t * r * s * cg

    def encode(self) -> list[int]:
        """The 29-int form the C++ modules decode (cc/ffi/conv_common.h: decode_problem)."""
        n, d, h, w, c = self.lhs_shape
        t, r, s, _, k = self.rhs_shape
        return [n, c, k, self.groups, d, h, w, t, r, s, *self.out_shape[1:4], *self.stride,
                *(lo for lo, _ in self.padding), *(hi for _, hi in self.padding),
                *self.lhs_dilation, *self.rhs_dilation, int(self.tf32)]

    def replace(self, **changes) -> ConvSpec:
        return dataclasses.replace(self, **changes)


# ----------------------------------------------------------------------------------------------
# Primitives
# ----------------------------------------------------------------------------------------------

def _shapes(direction: str, spec: ConvSpec):
    """(a shape, b shape, result shape) of a direction's operands."""
    x, w, y = spec.lhs_shape, spec.rhs_shape, spec.out_shape
    return {"fwd": (x, w, y), "bwd_data": (y, w, x), "bwd_filter": (x, y, w)}[direction]


def _abstract_eval(direction, a, b, *, spec, algo, out_dtype, policy):
    want_a, want_b, result = _shapes(direction, spec)
    if tuple(a.shape) != want_a or tuple(b.shape) != want_b or a.dtype != b.dtype:
        raise TypeError(f"jaxdnn conv {direction}: operands {a.str_short()}, {b.str_short()} do "
                        f"not match the problem {spec}")
    return ShapedArray(result, out_dtype)


def _conv_attrs(direction):
    def attrs(platform, ctx, **params):
        choice = core.choose_for_call(_PRIMS[direction], ctx.avals_in, params, platform)
        spec = params["spec"]
        return dict(stride=spec.stride, pad_lo=[lo for lo, _ in spec.padding],
                    pad_hi=[hi for _, hi in spec.padding], lhs_dilation=spec.lhs_dilation,
                    rhs_dilation=spec.rhs_dilation, groups=spec.groups, tf32=spec.tf32,
                    algo=choice.name, **{_ffi.WORKSPACE: choice.workspace_bytes})
    return attrs


_PRIMS = {d: _ffi.define_primitive(f"jaxdnn_conv_{d}", partial(_abstract_eval, d),
                                   attrs=_conv_attrs(d)) for d in DIRECTIONS}
conv_fwd_p, conv_bwd_data_p, conv_bwd_filter_p = (_PRIMS[d] for d in DIRECTIONS)


def _bind(direction, a, b, *, spec, algo, out_dtype, policy):
    return _PRIMS[direction].bind(a, b, spec=spec, algo=algo, out_dtype=np.dtype(out_dtype),
                                  policy=policy)


# Transposes. With <.,.> the elementwise inner product:
#   <ct, fwd(x, w)>        = <bwd_data(ct, w), x>   = <bwd_filter(x, ct), w>
#   <ct, bwd_data(dy, w)>  = <fwd(ct, w), dy>       = <bwd_filter(ct, dy), w>
#   <ct, bwd_filter(x, dy)> = <bwd_data(dy, ct), x> = <fwd(x, ct), dy>
# A cotangent wider than the operands (bf16 in, f32 out: a float32 cotangent) is not rounded to
# their dtype: as in lax, the known operand is widened to the cotangent's dtype, the transpose
# computes and accumulates in it, and only its result is rounded to the operands' dtype. The
# widened problem keeps the spec's TF32 flag, which is False for 16-bit operands, so float32
# tensor-core kernels keep float32 accuracy (3xTF32).

def _transpose_rule(direction, which):
    def rule(ct, a, b, *, spec, algo, out_dtype, policy):
        known = b if which == 0 else a
        dt = known.dtype  # the operands share one dtype
        wide = jnp.promote_types(ct.dtype, dt)
        ct, known = ct.astype(wide), known.astype(wide)
        kw = dict(spec=spec, algo=algo, out_dtype=wide, policy=policy)
        if direction == "fwd":  # a = x, b = w
            out = (_bind("bwd_data", ct, known, **kw) if which == 0 else
                   _bind("bwd_filter", known, ct, **kw))
        elif direction == "bwd_data":  # a = dy, b = w
            out = (_bind("fwd", ct, known, **kw) if which == 0 else
                   _bind("bwd_filter", ct, known, **kw))
        else:  # bwd_filter: a = x, b = dy
            out = (_bind("bwd_data", known, ct, **kw) if which == 0 else
                   _bind("fwd", known, ct, **kw))
        return out.astype(dt)
    return rule


for _dir, _prim in _PRIMS.items():
    ad.defbilinear(_prim, _transpose_rule(_dir, 0), _transpose_rule(_dir, 1))


# Batching. A mapped axis is folded into the problem, never looped over:
#   only the activation-like operand mapped (x of fwd, dy of bwd_data) -> into the batch N;
#   only the other operand mapped -> into the channels inside each group;
#   both mapped -> into the groups (groups *= B).

def _fold_in_groups(a, groups):
    """(B, *rest, G*X) -> (*rest, G*B*X), each group's B copies side by side."""
    b, *rest, gx = a.shape
    a = a.reshape(b, *rest, groups, gx // groups)
    a = jnp.moveaxis(a, 0, -2)
    return a.reshape(*rest, groups * b * (gx // groups))


def _unfold_in_groups(a, b, groups):
    """(*rest, G*B*X) -> (B, *rest, G*X); inverse of _fold_in_groups."""
    *rest, gbx = a.shape
    x = gbx // (groups * b)
    a = a.reshape(*rest, groups, b, x)
    a = jnp.moveaxis(a, -2, 0)
    return a.reshape(b, *rest, groups * x)


def _fold_batch(a):
    return a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])


def _filter_in_channels_fold(w):
    """(B, T, R, S, Cg, K) -> (T, R, S, B*Cg, K)."""
    b, t, r, s, cg, k = w.shape
    return jnp.moveaxis(w, 0, 3).reshape(t, r, s, b * cg, k)


def _filter_in_channels_unfold(w, b):
    """(T, R, S, B*Cg, K) -> (B, T, R, S, Cg, K)."""
    t, r, s, bcg, k = w.shape
    return jnp.moveaxis(w.reshape(t, r, s, b, bcg // b, k), 3, 0)


def _batch_rule(direction):
    def rule(args, dims, *, spec, algo, out_dtype, policy):
        a, b = (x if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims))
        size = a.shape[0] if dims[0] is not None else b.shape[0]
        g = spec.groups
        kw = dict(algo=algo, out_dtype=out_dtype, policy=policy)
        n, d, h, w_, c = spec.lhs_shape
        t, r, s, cg, k = spec.rhs_shape
        if dims[0] is not None and dims[1] is not None:  # both mapped: into the groups
            fa, fb = _fold_in_groups(a, 1), _fold_in_groups(b, 1)
            new = spec.replace(lhs_shape=(n, d, h, w_, size * c),
                               rhs_shape=(t, r, s, cg, size * k), groups=size * g)
            return _unfold_in_groups(_bind(direction, fa, fb, spec=new, **kw), size, 1), 0
        if direction == "fwd":
            if dims[1] is None:  # x mapped
                new = spec.replace(lhs_shape=(size * n, d, h, w_, c))
                out = _bind("fwd", _fold_batch(a), b, spec=new, **kw)
                return out.reshape(size, n, *out.shape[1:]), 0
            new = spec.replace(rhs_shape=(t, r, s, cg, size * k))  # w mapped
            return _unfold_in_groups(_bind("fwd", a, _fold_in_groups(b, g), spec=new, **kw),
                                     size, g), 0
        if direction == "bwd_data":
            if dims[1] is None:  # dy mapped
                new = spec.replace(lhs_shape=(size * n, d, h, w_, c))
                out = _bind("bwd_data", _fold_batch(a), b, spec=new, **kw)
                return out.reshape(size, n, *out.shape[1:]), 0
            new = spec.replace(lhs_shape=(n, d, h, w_, size * c),  # w mapped
                               rhs_shape=(t, r, s, size * cg, k))
            out = _bind("bwd_data", a, _filter_in_channels_fold(b), spec=new, **kw)
            return _unfold_in_groups(out, size, g), 0
        # bwd_filter
        if dims[1] is None:  # x mapped
            new = spec.replace(lhs_shape=(n, d, h, w_, size * c), rhs_shape=(t, r, s, size * cg, k))
            out = _bind("bwd_filter", _fold_in_groups(a, g), b, spec=new, **kw)
            return _filter_in_channels_unfold(out, size), 0
        new = spec.replace(rhs_shape=(t, r, s, cg, size * k))  # dy mapped
        out = _bind("bwd_filter", a, _fold_in_groups(b, g), spec=new, **kw)
        return _unfold_in_groups(out, size, g), 0
    return rule


for _dir, _prim in _PRIMS.items():
    batching.primitive_batchers[_prim] = _batch_rule(_dir)


# Partitioning. Batch passes through (the filter gradient sums it: a reduction, all-reduced);
# spatial dims need replication (no halo exchange). With one group, output channels (k) pass
# through with the filter and input channels (c) are a reduction of the forward (the
# backward-data is its transpose: c passes through, k reduces). With several groups the channel
# dims are compounds, group major: x's (g cg), the filter's and y's (g kg); the group factor g
# passes through (each shard convolves its own groups, no collective) and the in-group factors
# are replicated. That needs the groups to divide the device count's every factor: Shardy may
# otherwise split a mesh axis between g and an in-group factor, a sub-axis sharding that a
# PartitionSpec cannot name; then the channels are replicated.

def _channel_dim(*factors: tuple[str, int]) -> str:
    """A rule's dim made of (factor, size) pairs, major first, unit factors left out."""
    names = [f for f, n in factors if n != 1] or [factors[0][0]]
    return names[0] if len(names) == 1 else "(" + " ".join(names) + ")"


def _partition_rule(direction):
    def rule(a, b, *, spec, devices, **params):
        g = spec.groups
        cg, k = spec.rhs_shape[3], spec.rhs_shape[4]
        sizes = ()
        if g == 1:
            c_dim, k_dim, f_cg = "c", "k", "c"
        elif g % devices:  # channels replicated
            c_dim, k_dim, f_cg = "c", "k", "cg"
        else:
            c_dim = _channel_dim(("g", g), ("cg", cg))
            k_dim = _channel_dim(("g", g), ("kg", k // g))
            f_cg, sizes = "cg", (("g", g), ("cg", cg), ("kg", k // g))
        x = ["n", "d", "h", "w", c_dim]
        y = ["n", "z", "p", "q", k_dim]
        f = ["t", "r", "s", f_cg, k_dim]
        ops = {"fwd": ([x, f], y), "bwd_data": ([y, f], x), "bwd_filter": ([x, y], f)}
        operands, result = ops[direction]
        replicate = ["d", "h", "w", "z", "p", "q", "t", "r", "s"]
        reduce = {"fwd": ["c"], "bwd_data": ["k"], "bwd_filter": ["n"]}[direction]
        if g != 1:
            replicate += ["c", "k", "cg", "kg"]
            reduce = [r for r in reduce if r == "n"]
        return _partition.Rule(_partition.einsum(operands, [result]),
                               need_replication=tuple(replicate), reduction=tuple(reduce),
                               factor_sizes=sizes if "(" in c_dim + k_dim else ())
    return rule


def _local_params(direction):
    def local(avals, *, spec, **params):
        a, b = (v.shape for v in avals)
        n = a[0]
        k = a[4] if direction == "bwd_data" else b[4]
        # a shard's groups: of several, only the group factor of the channels is sharded
        groups = spec.groups * k // spec.rhs_shape[4] if spec.groups > 1 else 1
        if direction == "fwd":
            c, cg = a[4], b[3]
        elif direction == "bwd_data":
            cg = b[3]
            c = cg * groups
        else:
            c = a[4]
            cg = c // groups
        return dict(params, spec=spec.replace(lhs_shape=(n, *spec.lhs_shape[1:4], c),
                                              rhs_shape=(*spec.rhs_shape[:3], cg, k),
                                              groups=groups))
    return local


for _dir, _prim in _PRIMS.items():
    _partition.partitionable(_prim, _partition_rule(_dir), _local_params(_dir))


# ----------------------------------------------------------------------------------------------
# The fused forward: y = act(conv(x, w) + bias + residual) (cc/conv/epilogue.h)
# ----------------------------------------------------------------------------------------------
#
#   conv_fused_p(x, w, bias, residual) -> y, c
#
# bias is (K,) in the accumulator dtype (float32, float64 for float64 results), residual like y,
# each an empty vector when absent; c = conv(x, w) is the convolution's own result, written
# (else empty) when `save_c`: the jvp asks for it when the activation's derivative needs the
# pre-activation z = c + bias + residual (every activation but relu, whose mask is y > 0), and
# recomputes z inside the derivative's fusion (a read of the residual there, where saving z
# would cost the forward a write). The jvp is the bilinear convolution's tangent (conv_fwd_p,
# so reverse mode runs the backward kernels) plus the bias's and residual's, times the
# activation's derivative at z as jax.nn defines it (jnp: XLA fuses it with the bias
# gradient's sum). The kernel call runs the chosen forward algorithm with the epilogue: in the
# wgmma GEMMs' stores, or as a pass over the algorithm's result (cc/conv/epilogue.h).

def _gelu_tanh(z):
    """jax.nn.gelu(approximate=True) written as z * sigmoid(2u), u = sqrt(2/pi) (z + 0.044715
    z^3), the kernels' form (activation_math.h): the same function without the cancellation of
    1 + tanh(u) for z < 0, so that its derivative keeps its digits where jax's form loses them
    (float32 z < -6: 0 against 5e-6)."""
    u2 = (2 * _SQRT_2_OVER_PI) * (z + 0.044715 * z * z * z)
    return z * jax.nn.sigmoid(u2)


# activation= name -> (the kernels' op, alpha, the function it computes: jax.nn's, whose
# derivative the backward takes)
EPILOGUE_ACTIVATIONS = {
    "relu": ("relu", 0.0, jax.nn.relu), "relu6": ("relu6", 0.0, jax.nn.relu6),
    "leaky_relu": ("leaky_relu", 0.01, jax.nn.leaky_relu), "elu": ("elu", 1.0, jax.nn.elu),
    "sigmoid": ("sigmoid", 0.0, jax.nn.sigmoid), "tanh": ("tanh", 0.0, jnp.tanh),
    "gelu": ("gelu_tanh", 0.0, _gelu_tanh),
    "gelu_exact": ("gelu_erf", 0.0, partial(jax.nn.gelu, approximate=False)),
    "silu": ("silu", 0.0, jax.nn.silu), "softplus": ("softplus", 0.0, jax.nn.softplus)}


def _acc_dtype(out_dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(out_dtype) == np.float64 else np.dtype(np.float32)


def _fused_abstract_eval(x, w, bias, res, *, spec, algo, out_dtype, policy, act, save_c):
    y = _abstract_eval("fwd", x, w, spec=spec, algo=algo, out_dtype=out_dtype, policy=policy)
    k = spec.rhs_shape[4]
    for name, a, shape, dtype in (("bias", bias, (k,), _acc_dtype(out_dtype)),
                                  ("residual", res, y.shape, y.dtype)):
        if a.size and (tuple(a.shape) != shape or a.dtype != dtype):
            raise TypeError(f"jaxdnn conv fwd_fused: {name} {a.str_short()} does not match "
                            f"{dtype}{list(shape)}")
    return [y, ShapedArray(y.shape if save_c else (0,), y.dtype)]


def _fused_attrs(platform, ctx, *, act, save_c, **params):
    attrs = _conv_attrs("fwd")(platform, ctx, **params)
    op, alpha, _ = EPILOGUE_ACTIVATIONS[act] if act else (None, 0.0, None)
    return dict(attrs, act=_OPS.index(op) if op else -1,
                alpha=np.array([alpha], dtype=np.float64))


conv_fused_p = _ffi.define_primitive("jaxdnn_conv_fwd_fused", _fused_abstract_eval,
                                     attrs=_fused_attrs, multiple_results=True)


def _empty(dtype):
    return jnp.zeros((0,), dtype)


def _zero_like(v):
    """A symbolic zero tangent for primal `v`."""
    return ad.Zero(ShapedArray(v.shape, v.dtype).to_tangent_aval())


def _fused_jvp(primals, tangents, *, spec, algo, out_dtype, policy, act, save_c):
    x, w, bias, res = primals
    tx, tw, tb, tr = tangents
    kw = dict(spec=spec, algo=algo, out_dtype=out_dtype, policy=policy)
    need_c = save_c or act not in (None, "relu")
    y, c = conv_fused_p.bind(x, w, bias, res, act=act, save_c=need_c, **kw)
    conv_terms = []
    if type(tx) is not ad.Zero:
        conv_terms.append(_bind("fwd", tx, w, **kw))
    if type(tw) is not ad.Zero:
        conv_terms.append(_bind("fwd", x, tw, **kw))
    c_out = c if save_c else _empty(y.dtype)
    tc = sum(conv_terms[1:], conv_terms[0]) if save_c and conv_terms else _zero_like(c_out)
    # The tangent of z = c + bias + residual, and the activation's derivative, in the
    # accumulator dtype as the kernel computes z (so that the bias gradient, its transpose's
    # sum over every output position, accumulates in float32 for 16-bit results too).
    acc = _acc_dtype(out_dtype)
    terms = [t.astype(acc) for t in conv_terms]
    if type(tb) is not ad.Zero and bias.size:
        terms.append(jnp.broadcast_to(tb, y.shape))
    if type(tr) is not ad.Zero and res.size:
        terms.append(tr.astype(acc))
    if not terms:
        return (y, c_out), (_zero_like(y), tc)
    tz = sum(terms[1:], terms[0])
    if act is None:
        ty = tz
    elif act == "relu":
        ty = jnp.where(y > 0, tz, jnp.zeros_like(tz))
    else:
        z = c.astype(acc)
        if bias.size:
            z = z + bias
        if res.size:
            z = z + res.astype(acc)
        ty = jax.jvp(EPILOGUE_ACTIVATIONS[act][2], (z,), (tz,))[1]
    return (y, c_out), (ty.astype(y.dtype), tc)


ad.primitive_jvps[conv_fused_p] = _fused_jvp


def _fused_reference(x, w, bias, res, *, spec, algo, out_dtype, policy, act, save_c):
    """The fused forward as the unfused composition (conv_fwd_p, then jnp): the batching rule's
    form where the filter or the bias is mapped (the convolution's own batching folds those)."""
    c = _bind("fwd", x, w, spec=spec, algo=algo, out_dtype=out_dtype, policy=policy)
    z = c
    if bias.size:
        z = z + bias.astype(z.dtype)
    if res.size:
        z = z + res
    y = EPILOGUE_ACTIVATIONS[act][2](z) if act else z
    return [y, c if save_c else _empty(c.dtype)]


def _fused_batch(args, dims, *, spec, **params):
    x, w, bias, res = args
    bx, bw, bb, br = dims
    if bw is not None or bb is not None:
        return jax.vmap(partial(_fused_reference, spec=spec, **params), in_axes=dims)(*args), \
            (0, 0)
    size = (x.shape[bx] if bx is not None else res.shape[br])
    x = jnp.moveaxis(x, bx, 0) if bx is not None else jnp.broadcast_to(x, (size, *x.shape))
    if res.size:
        res = jnp.moveaxis(res, br, 0) if br is not None else jnp.broadcast_to(
            res, (size, *res.shape))
        res = _fold_batch(res)
    n, *rest = spec.lhs_shape
    new = spec.replace(lhs_shape=(size * n, *rest))
    y, c = conv_fused_p.bind(_fold_batch(x), w, bias, res, spec=new, **params)
    unfold = lambda a: a.reshape(size, n, *a.shape[1:]) if a.size else a  # noqa: E731
    return [unfold(y), unfold(c)], [0, 0 if c.size else None]


batching.primitive_batchers[conv_fused_p] = _fused_batch


def _fused_partition_rule(x, w, bias, res, *, spec, devices, save_c, **params):
    """The forward's rule with c replicated too (the epilogue is not linear, so the forward's
    sum over input channels cannot be split into partial sums); bias follows k, the residual
    and c follow y."""
    rule = _partition_rule("fwd")(x, w, spec=spec, devices=devices, **params)
    (y_dims,) = rule.dims_of(1)
    k_dim = "(" + " ".join(y_dims[-1]) + ")" if len(y_dims[-1]) > 1 else y_dims[-1][0]
    y_spec = rule.spec.split("->")[1].strip()
    bias_spec = k_dim if bias.size else "zb"
    res_spec = y_spec if res.size else "zr"
    c_spec = y_spec if save_c else "zc"
    operands = rule.spec.split("->")[0].strip()
    return dataclasses.replace(
        rule, spec=f"{operands}, {bias_spec}, {res_spec} -> {y_spec}, {c_spec}",
        need_replication=tuple(dict.fromkeys((*rule.need_replication, "c"))), reduction=())


def _fused_local_params(avals, **params):
    return _local_params("fwd")(avals[:2], **params)


_partition.partitionable(conv_fused_p, _fused_partition_rule, _fused_local_params)


# ----------------------------------------------------------------------------------------------
# Argument checking and canonicalisation
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Names:
    """How the calling API names its arguments, for error messages."""

    api: str
    lhs: str
    rhs: str
    stride: str
    padding: str
    lhs_dilation: str
    rhs_dilation: str
    groups: str


_LAX_NAMES = _Names("jaxdnn.conv_general_dilated", "lhs", "rhs", "window_strides", "padding",
                    "lhs_dilation", "rhs_dilation", "feature_group_count")
_CONV_NAMES = _Names("jaxdnn.conv", "x", "w", "stride", "padding", "lhs_dilation", "dilation",
                     "groups")


# Operand dtypes: the float ones of every op, and the integers, which lax convolves too (its
# boolean convolution is not offered).
_INT_DTYPES = tuple(np.dtype(d) for d in (jnp.int8, jnp.int16, jnp.int32, jnp.int64, jnp.uint8,
                                          jnp.uint16, jnp.uint32, jnp.uint64))
_DTYPES = _checks.SUPPORTED_DTYPES + _INT_DTYPES


def _operands(lhs, rhs, names: _Names):
    """The input and filter as arrays of one supported dtype."""
    lhs = _checks.operand(lhs, names.lhs, names.api, _DTYPES)
    rhs = _checks.operand(rhs, names.rhs, names.api, _DTYPES)
    if lhs.dtype != rhs.dtype:
        raise TypeError(f"{names.api}: `{names.lhs}` and `{names.rhs}` must have the same dtype, "
                        f"got {lhs.dtype} and {rhs.dtype}")
    return lhs, rhs


def _check_dimension_numbers(dnums, lhs, rhs, names: _Names):
    """Each of lhs_spec, rhs_spec and out_spec must be a permutation of range(rank): lax
    accepts any ConvDimensionNumbers and fails later, when it indexes the shapes."""
    rank = lhs.ndim
    if rhs.ndim != rank:
        raise ValueError(f"{names.api}: `{names.lhs}` has rank {rank} but `{names.rhs}` has rank "
                         f"{rhs.ndim}; they must match")
    for spec, what in zip(dnums, ("lhs_spec", "rhs_spec", "out_spec")):
        try:
            ok = sorted(operator.index(d) for d in spec) == list(range(rank))
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"{names.api}: `dimension_numbers` {what} must be a permutation of "
                             f"0..{rank - 1} for operands of rank {rank}, got {spec!r}")


def _check_filter_window(window, rhs_shape, names: _Names):
    """A filter needs at least one tap along every spatial dimension (lax rejects a window of
    size 0 when it lowers; the output size formula would give a meaningless result)."""
    if any(f == 0 for f in window):
        raise ValueError(f"{names.api}: `{names.rhs}` has shape {tuple(rhs_shape)}: its spatial "
                         "dimensions must not be empty")


def _int_tuple(value, nd, name, names: _Names, *, minimum):
    if value is None:
        value = 1
    if isinstance(value, (int, np.integer)):
        value = (value,) * nd
    try:
        if any(isinstance(v, (bool, np.bool_)) for v in value):
            raise TypeError("a bool is not a size")
        value = tuple(operator.index(v) for v in value)
    except TypeError as e:
        raise TypeError(f"{names.api}: `{name}` must be an int or a sequence of {nd} ints, "
                        f"got {value!r}") from e
    if len(value) != nd:
        raise ValueError(f"{names.api}: `{name}` must have {nd} entries (one per spatial "
                         f"dimension), got {value!r}")
    if any(v < minimum for v in value):
        raise ValueError(f"{names.api}: `{name}` entries must be >= {minimum}, got {value!r}")
    return value


def _padding_pairs(padding, nd, names: _Names, *, allow_negative: bool):
    if isinstance(padding, (int, np.integer)):
        padding = [(int(padding), int(padding))] * nd
    try:
        pairs = tuple((operator.index(lo), operator.index(hi)) for lo, hi in padding)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{names.api}: `{names.padding}` must be 'SAME', 'VALID', an int or a "
                         f"sequence of {nd} (low, high) pairs, got {padding!r}") from e
    if len(pairs) != nd:
        raise ValueError(f"{names.api}: `{names.padding}` must have {nd} (low, high) pairs, got "
                         f"{padding!r}")
    if not allow_negative and any(lo < 0 or hi < 0 for lo, hi in pairs):
        raise ValueError(f"{names.api}: `{names.padding}` must not be negative, got {padding!r}")
    return pairs


def _resolve_out_dtype(in_dtype, preferred, names: _Names):
    """(dtype the kernels read, dtype they write, dtype of the result) for
    `preferred_element_type`, with lax's rules: float inputs give a float result, integer
    inputs an integer one, signed for signed inputs (exact sums, wrapping modulo 2^bits of
    the result), or a float one (the operands converted to it); never a narrower one. 64-bit
    dtypes without jax_enable_x64 become 32-bit ones, as in lax."""
    in_dtype = np.dtype(in_dtype)
    pref = in_dtype if preferred is None else np.dtype(jax.dtypes.canonicalize_dtype(preferred))
    integer_in = np.issubdtype(in_dtype, np.integer)
    if pref not in _DTYPES or (np.issubdtype(pref, np.integer) and not integer_in):
        raise TypeError(f"{names.api}: `preferred_element_type` {pref} does not suit {in_dtype} "
                        "inputs: float inputs take a float dtype (float16/bfloat16/float32/"
                        "float64), integer inputs an integer or float one")
    if pref.itemsize < in_dtype.itemsize:
        raise TypeError(f"{names.api}: `preferred_element_type` {pref} is narrower than the "
                        f"input dtype {in_dtype}")
    if integer_in and np.issubdtype(pref, np.integer):
        if np.issubdtype(in_dtype, np.signedinteger) and np.issubdtype(pref, np.unsignedinteger):
            raise TypeError(f"{names.api}: `preferred_element_type` {pref} must be signed for "
                            f"the signed input dtype {in_dtype}")
        # The kernels sum int8 into int8 or int32, and int32 or int64 into themselves (each
        # modulo 2^bits); the low bits of a sum at least as wide as the result are the result.
        i32, i64 = np.dtype(np.int32), np.dtype(np.int64)
        if in_dtype == np.int8 and pref in (in_dtype, i32):
            return in_dtype, pref, pref
        if pref.itemsize <= 4:
            return (in_dtype if in_dtype == np.int8 else i32), i32, pref
        return i64, i64, pref
    if integer_in:
        return pref, pref, pref  # lax converts integer operands to the float result type
    if pref == in_dtype or (pref == np.float32 and in_dtype.itemsize == 2):
        return in_dtype, pref, pref  # same dtype, or 16-bit in / float32 out: native kernels
    if pref.itemsize >= 4:
        return pref, pref, pref  # wider result: compute in it
    raise TypeError(f"{names.api}: `preferred_element_type` {pref} is not supported for "
                    f"{in_dtype} inputs")


def _normalise_algo(algo):
    """`algo` is None, one name for every direction, or a dict direction -> name."""
    if algo is None:
        return (None, None, None)
    if isinstance(algo, str):
        return (algo, algo, algo)
    if isinstance(algo, dict):
        unknown = set(algo) - set(DIRECTIONS)
        if unknown:
            raise ValueError(f"jaxdnn: `algo` keys must be in {DIRECTIONS}, got {sorted(unknown)}")
        return tuple(algo.get(d) for d in DIRECTIONS)
    raise TypeError(f"jaxdnn: `algo` must be None, an algorithm name or a dict, got {algo!r}")


def _canonical_problem(lhs, rhs, dnums, window_strides, padding, lhs_dilation, rhs_dilation,
                       feature_group_count, batch_group_count, names: _Names, *,
                       allow_negative_padding: bool):
    """Transposes/reshapes lhs and rhs to canonical 5-D and builds the ConvSpec. Returns
    (x, w, spec, finish) where finish(y) maps the canonical result back to the caller's
    layout."""
    nd = lhs.ndim - 2
    if not 0 <= nd <= 3:
        raise ValueError(f"{names.api}: `{names.lhs}` must have 1 to 3 spatial dimensions "
                         f"(rank 3 to 5), got rank {lhs.ndim}")
    lhs_spec, rhs_spec, out_spec = dnums
    strides = _int_tuple(window_strides, nd, names.stride, names, minimum=1)
    lhs_dil = _int_tuple(lhs_dilation, nd, names.lhs_dilation, names, minimum=1)
    rhs_dil = _int_tuple(rhs_dilation, nd, names.rhs_dilation, names, minimum=1)
    feature_group_count = _checks.positive_int(feature_group_count, names.groups, names.api)
    batch_group_count = _checks.positive_int(batch_group_count, "batch_group_count", names.api)
    if feature_group_count > 1 and batch_group_count > 1:
        raise ValueError(f"{names.api}: at most one of `{names.groups}` and `batch_group_count` "
                         "may be > 1")

    x = jnp.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))  # (N, spatial..., C)
    w = jnp.transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))  # (spatial..., I, O)
    n, c = x.shape[0], x.shape[-1]
    cin, k = w.shape[-2], w.shape[-1]
    _check_filter_window(w.shape[:nd], rhs.shape, names)
    if isinstance(padding, str):
        if any(d != 1 for d in lhs_dil):
            raise ValueError(f"{names.api}: string padding is not supported with "
                             f"`{names.lhs_dilation}`; give explicit (low, high) pairs")
        eff = [(f - 1) * r + 1 if f else 0 for f, r in zip(w.shape[:nd], rhs_dil)]
        try:
            padding = lax.padtype_to_pads(x.shape[1:1 + nd], eff, strides, padding)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"{names.api}: `{names.padding}` string must be 'SAME', "
                             f"'SAME_LOWER' or 'VALID', got {padding!r}") from e
    pads = _padding_pairs(padding, nd, names, allow_negative=allow_negative_padding)
    for i, (size, ld, (lo, hi)) in enumerate(zip(x.shape[1:1 + nd], lhs_dil, pads)):
        dilated = (size - 1) * ld + 1 if size else 0
        if dilated + lo + hi < 0:  # as lax: negative padding may remove the whole input, no more
            raise ValueError(f"{names.api}: `{names.padding}` {pads[i]} removes more than the "
                             f"{dilated} elements of spatial dimension {i} of `{names.lhs}`"
                             + (f" (dilated by `{names.lhs_dilation}`)" if ld > 1 else ""))

    g, bg = int(feature_group_count), int(batch_group_count)
    if c % g:
        raise ValueError(f"{names.api}: `{names.groups}`={g} must divide the {c} input "
                         f"channels of `{names.lhs}`")
    if cin * g != c:
        raise ValueError(f"{names.api}: channel mismatch: `{names.lhs}` has {c} channels, so "
                         f"`{names.rhs}` needs {c // g} input channels with "
                         f"`{names.groups}`={g}, but it has {cin}")
    if k % (g * bg):
        what = names.groups if g > 1 else "batch_group_count"
        raise ValueError(f"{names.api}: `{what}`={g * bg} must divide the {k} output channels "
                         f"of `{names.rhs}`")
    if n % bg:
        raise ValueError(f"{names.api}: `batch_group_count`={bg} must divide the batch size "
                         f"{n} of `{names.lhs}`")

    pad3 = (1,) * (3 - nd)
    x = x.reshape(n, *pad3, *x.shape[1:])
    w = w.reshape(*pad3, *w.shape)
    groups = g
    if bg > 1:  # batch groups become feature groups: batch group i -> channel block i
        x = _fold_in_groups(x.reshape(bg, n // bg, *x.shape[1:]), 1)
        groups = bg
    spec = ConvSpec(lhs_shape=tuple(x.shape), rhs_shape=tuple(w.shape),
                    stride=(1,) * (3 - nd) + strides,
                    padding=((0, 0),) * (3 - nd) + pads,
                    lhs_dilation=(1,) * (3 - nd) + lhs_dil,
                    rhs_dilation=(1,) * (3 - nd) + rhs_dil, groups=groups)

    def finish(y):
        y = y.reshape(y.shape[0], *y.shape[4 - nd:4], y.shape[4])  # drop the padded dims
        perm = [0] * (nd + 2)
        perm[out_spec[0]], perm[out_spec[1]] = 0, nd + 1
        for i in range(nd):
            perm[out_spec[2 + i]] = 1 + i
        return jnp.transpose(y, perm)

    return x, w, spec, finish


def _as_data_gradient(spec: ConvSpec) -> ConvSpec | None:
    """The strided convolution whose data gradient is `spec`'s forward when `spec` is a
    transposed convolution in lax's form (input dilation s > 1, window stride 1), else None.

    Along an axis with filter size F, dilation d and padding (lo, hi), the forward is
    y[o] = sum_f x[(o - lo + f d) / s] w[f] over the f where s divides: the data gradient of the
    convolution with stride s, padding ((F-1) d - lo, (F-1) d - hi) and the filter flipped, each
    group's input and output channels swapped (_swap_filter). Run as that, the forward's GEMM
    reads x itself, not x with s - 1 zeros between its elements (s^nd times fewer multiply-adds
    for the nd dilated axes), and its gradients are that convolution's forward and filter
    gradient, zero-free too. Declines padding beyond (F-1) d (the strided form would need
    negative padding)."""
    if spec.stride != (1, 1, 1) or spec.lhs_dilation == (1, 1, 1):
        return None
    if 0 in (*spec.lhs_shape, *spec.rhs_shape, *spec.out_shape):
        return None
    t, r, s, cg, k = spec.rhs_shape
    pads = []
    for f, (lo, hi), d in zip((t, r, s), spec.padding, spec.rhs_dilation):
        span = (f - 1) * d
        if lo > span or hi > span:
            return None
        pads.append((span - lo, span - hi))
    g = spec.groups
    strided = ConvSpec(lhs_shape=spec.out_shape, rhs_shape=(t, r, s, k // g, g * cg),
                       stride=spec.lhs_dilation, padding=tuple(pads), lhs_dilation=(1, 1, 1),
                       rhs_dilation=spec.rhs_dilation, groups=g, tf32=spec.tf32)
    return strided if strided.out_shape == spec.lhs_shape else None


def _swap_filter(w, groups: int):
    """The (T, R, S, Cg, K) filter as _as_data_gradient's (T, R, S, Kg, G Cg): flipped in
    space, each group's input and output channels swapped."""
    t, r, s, cg, k = w.shape
    w = w[::-1, ::-1, ::-1].reshape(t, r, s, cg, groups, k // groups)
    return w.transpose(0, 1, 2, 5, 4, 3).reshape(t, r, s, k // groups, groups * cg)


def _conv_core(lhs, rhs, dnums, window_strides, padding, lhs_dilation, rhs_dilation,
               feature_group_count, batch_group_count, precision, preferred_element_type, algo,
               names: _Names, *, allow_negative_padding: bool, epilogue=None):
    lhs, rhs = _operands(lhs, rhs, names)
    try:
        dnums = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dnums)
    except TypeError as e:
        raise TypeError(f"{names.api}: {e}") from None
    _check_dimension_numbers(dnums, lhs, rhs, names)
    compute, out_dtype, result_dtype = _resolve_out_dtype(lhs.dtype, preferred_element_type,
                                                          names)
    x, w, spec, finish = _canonical_problem(
        lhs.astype(compute), rhs.astype(compute), dnums, window_strides, padding, lhs_dilation,
        rhs_dilation, feature_group_count, batch_group_count, names,
        allow_negative_padding=allow_negative_padding)
    spec = spec.replace(tf32=_allows_tf32(precision, compute))
    kw = dict(spec=spec, algo=_normalise_algo(algo), out_dtype=out_dtype,
              policy=config_lib.settings().policy())
    if epilogue is not None:
        bias, res, act = _check_epilogue(epilogue, spec, dnums, out_dtype, result_dtype, names)
        y, _ = conv_fused_p.bind(x, w, bias, res, act=act, save_c=False, **kw)
    elif (strided := _as_data_gradient(spec)) is not None:
        # A transposed convolution runs as a strided one's data gradient; a pinned algorithm
        # names the kernel by what it computes (`fwd` this forward, which the strided
        # convolution's bwd_data kernel runs; `bwd_data` the input gradient, its forward kernel).
        fwd, bwd_data, bwd_filter = kw["algo"]
        y = _bind("bwd_data", x, _swap_filter(w, spec.groups),
                  **dict(kw, spec=strided, algo=(bwd_data, fwd, bwd_filter)))
    else:
        y = _bind("fwd", x, w, **kw)
    return lax.convert_element_type(finish(y), result_dtype)


def _check_epilogue(epilogue, spec: ConvSpec, dnums, out_dtype, result_dtype, names: _Names):
    """(bias, canonical residual, activation) of a fused call, each argument checked."""
    bias, residual, activation = epilogue
    api = names.api
    if activation is not None and activation not in EPILOGUE_ACTIVATIONS:
        raise ValueError(f"{api}: `activation` must be None or one of "
                         f"{sorted(EPILOGUE_ACTIVATIONS)}, got {activation!r}")
    if jnp.issubdtype(out_dtype, jnp.integer):
        raise TypeError(f"{api}: `bias`, `activation` and `residual` need a floating-point "
                        f"result, not {np.dtype(out_dtype)}")
    k = spec.rhs_shape[4]
    if bias is None:
        bias = _empty(_acc_dtype(out_dtype))
    else:
        bias = _checks.as_array(bias, "bias", api)
        if tuple(bias.shape) != (k,) or not jnp.issubdtype(bias.dtype, jnp.floating):
            raise ValueError(f"{api}: `bias` must be a floating-point array of shape ({k},) "
                             f"(the output channels), got {bias.dtype}{list(bias.shape)}")
        bias = bias.astype(_acc_dtype(out_dtype))
    out_spec = dnums.out_spec
    user_shape = [0] * len(out_spec)  # the caller's layout of the canonical y
    canonical = spec.out_shape
    nd = len(out_spec) - 2
    user_shape[out_spec[0]], user_shape[out_spec[1]] = canonical[0], canonical[4]
    for i in range(nd):
        user_shape[out_spec[2 + i]] = canonical[4 - nd + i]
    if residual is None:
        res = _empty(out_dtype)
    else:
        residual = _checks.as_array(residual, "residual", api)
        if tuple(residual.shape) != tuple(user_shape) or residual.dtype != result_dtype:
            raise ValueError(f"{api}: `residual` must match the result, "
                             f"{np.dtype(result_dtype)}{user_shape}, got "
                             f"{residual.dtype}{list(residual.shape)}")
        res = jnp.transpose(residual, (out_spec[0], *out_spec[2:], out_spec[1]))
        res = res.astype(out_dtype).reshape(canonical)
    return bias, res, activation


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def _constrain_sharding(y, out_sharding, api: str):
    """`y` with the sharding `out_sharding` (None: unchanged), as lax's ``out_sharding``: a
    NamedSharding, or a PartitionSpec of the mesh in context (``jax.set_mesh``). A spec over
    Explicit mesh axes reshards (the sharding becomes part of the result's type, as in lax);
    over Auto axes, which lax rejects, it is a ``with_sharding_constraint``."""
    if out_sharding is None:
        return y
    if isinstance(out_sharding, NamedSharding):
        if out_sharding.mesh.empty:  # lax's canonicalize_sharding: no mesh, no constraint
            return y
        mesh = out_sharding.mesh
    elif isinstance(out_sharding, PartitionSpec):
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            raise ValueError(f"{api}: `out_sharding` {out_sharding} is a PartitionSpec, which "
                             "needs a mesh in context (jax.set_mesh); pass a NamedSharding "
                             "instead")
    else:
        raise TypeError(f"{api}: `out_sharding` must be None, a jax.sharding.NamedSharding or a "
                        f"PartitionSpec, got {out_sharding!r} of type {type(out_sharding)}")
    spec = out_sharding.spec if isinstance(out_sharding, NamedSharding) else out_sharding
    names = {n for entry in spec if entry is not None and entry is not PartitionSpec.UNCONSTRAINED
             for n in ((entry,) if isinstance(entry, str) else entry)}
    types = dict(zip(mesh.axis_names, mesh.axis_types))
    if any(types.get(n) == jax.sharding.AxisType.Explicit for n in names):
        return jax.sharding.reshard(y, out_sharding)
    return jax.lax.with_sharding_constraint(y, out_sharding)


def conv_general_dilated(lhs, rhs, window_strides: Sequence[int], padding,
                         lhs_dilation: Sequence[int] | None = None,
                         rhs_dilation: Sequence[int] | None = None, dimension_numbers=None,
                         feature_group_count: int = 1, batch_group_count: int = 1,
                         precision=None, preferred_element_type=None, out_sharding=None, *,
                         algo=None):
    """Drop-in for :func:`jax.lax.conv_general_dilated`, running jaxdnn's kernels.

    Every argument of lax's is accepted with lax's meaning (negative padding included); for
    float32, ``precision`` below HIGHEST lets tensor-core algorithms round operands to TF32, as
    XLA:GPU does. ``out_sharding`` (a NamedSharding, or a PartitionSpec of the mesh in
    context) gives the result that sharding; over Auto mesh axes, which lax rejects, it
    constrains the result like ``jax.lax.with_sharding_constraint``. ``algo`` (jaxdnn only)
    forces an algorithm: one name for all three directions, or a dict such as
    ``{"fwd": "direct"}``.
    """
    y = _conv_core(lhs, rhs, dimension_numbers, window_strides, padding, lhs_dilation,
                   rhs_dilation, feature_group_count, batch_group_count, precision,
                   preferred_element_type, algo, _LAX_NAMES, allow_negative_padding=True)
    return _constrain_sharding(y, out_sharding, _LAX_NAMES.api)


def _layouts(layout, ndim, api):
    if layout is None:
        if ndim - 2 not in _CHANNELS_LAST:
            raise ValueError(f"{api}: `x` must have rank 3, 4 or 5, got rank {ndim}")
        layout = _CHANNELS_LAST[ndim - 2]
    if layout in _CHANNELS_LAST.values():
        spatial = layout[1:-1]
        return layout, spatial + "IO"
    if layout in _CHANNELS_FIRST.values():
        return layout, "OI" + layout[2:]
    raise ValueError(f"{api}: `layout` must be one of "
                     f"{sorted([*_CHANNELS_LAST.values(), *_CHANNELS_FIRST.values()])}, got "
                     f"{layout!r}")


def _allows_tf32(precision, dtype) -> bool:
    """Whether a float32 convolution may round its operands to TF32, with lax's meaning of
    `precision`: XLA:GPU runs float32 convolutions in TF32 unless HIGHEST ("float32") is asked
    for, directly or through ``jax_default_matmul_precision``. Raises TypeError on a value lax
    would not accept."""
    if precision is None:
        precision = jax.config.jax_default_matmul_precision
    if isinstance(precision, (tuple, list)):
        if len(precision) != 2:
            raise TypeError(f"jaxdnn: `precision` pair must have 2 entries, got {precision!r}")
        return all(_allows_tf32(p, dtype) for p in precision)
    if isinstance(precision, str):
        try:
            precision = lax.Precision(precision)
        except ValueError:
            raise ValueError(f"jaxdnn: unknown `precision` {precision!r}; use one of "
                             "'default', 'high', 'highest' (or a jax.lax.Precision)") from None
    if precision is not None and not isinstance(precision, lax.Precision):
        raise TypeError(f"jaxdnn: `precision` must be None, a jax.lax.Precision, a string or a "
                        f"pair of them, got {precision!r}")
    return np.dtype(dtype) == np.float32 and precision != lax.Precision.HIGHEST


def conv(x, w, *, stride=1, padding=0, dilation=1, groups: int = 1, layout: str | None = None,
         algo=None, precision=None, preferred_element_type=None, bias=None, activation=None,
         residual=None):
    """N-D convolution (1-D, 2-D or 3-D), channels-last by default.

    Args:
      x: input, ``NWC``/``NHWC``/``NDHWC`` (or channels-first with ``layout=``).
      w: filter, ``W..IO`` (e.g. ``HWIO``) for channels-last layouts, ``OI..`` for
        channels-first; ``I`` is the number of input channels per group.
      stride, dilation: an int or one int per spatial dimension (``dilation`` dilates the
        filter).
      padding: ``"SAME"``, ``"VALID"``, an int, or one ``(low, high)`` pair per spatial dim.
      groups: feature groups; ``groups == C`` is a depthwise convolution.
      layout: one of ``NWC NCW NHWC NCHW NDHWC NCDHW``; default: channels-last of x's rank.
      algo: force an algorithm (see :func:`jaxdnn.conv_algorithms`).
      precision: as in ``jax.lax``: for float32, anything below ``HIGHEST`` (including the
        default) lets tensor-core algorithms round operands to TF32; ``"highest"`` keeps
        float32 accuracy (3xTF32 on tensor cores). The CPU always computes exactly.
      preferred_element_type: output dtype (e.g. float32 for bfloat16 inputs).
      bias, activation, residual: a fused epilogue, ``activation(conv + bias + residual)``
        in one call: `bias` per output channel (shape ``(O,)``), `residual` shaped and typed
        like the result, `activation` one of relu, relu6, leaky_relu, elu, sigmoid, tanh,
        gelu (tanh approximation, jax.nn.gelu's default), gelu_exact, silu, softplus (as
        jax.nn). The sum and the activation are computed in float32 (float64 for float64) and
        rounded once.
    """
    x, w = _operands(x, w, _CONV_NAMES)
    if x.ndim != w.ndim:
        raise ValueError(f"jaxdnn.conv: `x` has rank {x.ndim} but `w` has rank {w.ndim}; they "
                         "must match")
    lhs_layout, rhs_layout = _layouts(layout, x.ndim, "jaxdnn.conv")
    if len(lhs_layout) != x.ndim:
        raise ValueError(f"jaxdnn.conv: `layout` {lhs_layout!r} does not match the rank "
                         f"{x.ndim} of `x`")
    fused = bias is not None or activation is not None or residual is not None
    return _conv_core(x, w, (lhs_layout, rhs_layout, lhs_layout), stride, padding, None,
                      dilation, groups, 1, precision, preferred_element_type, algo, _CONV_NAMES,
                      allow_negative_padding=False,
                      epilogue=(bias, residual, activation) if fused else None)


def conv_transpose(x, w, *, stride=1, padding=0, output_padding=0, dilation=1, groups: int = 1,
                   layout: str | None = None, algo=None, precision=None,
                   preferred_element_type=None):
    """Transposed convolution: the gradient of :func:`conv` with respect to its input.

    ``w`` has the layout of the forward convolution whose input gradient this is (``HWIO`` for
    ``NHWC``): ``I`` is this op's output channels per group and ``O`` the channels of ``x``.
    The output size along each axis is ``(in - 1) * stride - pad_lo - pad_hi +
    dilation * (kernel - 1) + 1 + output_padding`` (PyTorch's ``ConvTranspose`` arithmetic);
    ``"SAME"`` gives ``in * stride`` and ``"VALID"`` no padding. Runs the backward-data kernels.
    """
    api = "jaxdnn.conv_transpose"
    names = dataclasses.replace(_CONV_NAMES, api=api)
    x, w = _operands(x, w, names)
    if x.ndim != w.ndim:
        raise ValueError(f"{api}: `x` has rank {x.ndim} but `w` has rank {w.ndim}; they must "
                         "match")
    lhs_layout, rhs_layout = _layouts(layout, x.ndim, api)
    if len(lhs_layout) != x.ndim:
        raise ValueError(f"{api}: `layout` {lhs_layout!r} does not match the rank {x.ndim} of `x`")
    nd = x.ndim - 2
    dnums = lax.conv_dimension_numbers(x.shape, w.shape, (lhs_layout, rhs_layout, lhs_layout))
    compute, out_dtype, result_dtype = _resolve_out_dtype(x.dtype, preferred_element_type,
                                                          names)
    strides = _int_tuple(stride, nd, "stride", names, minimum=1)
    dil = _int_tuple(dilation, nd, "dilation", names, minimum=1)
    out_pad = _int_tuple(output_padding, nd, "output_padding", names, minimum=0)
    if any(op >= s and op >= d for op, s, d in zip(out_pad, strides, dil)):
        raise ValueError(f"{api}: `output_padding` must be smaller than `stride` or `dilation`, "
                         f"got {out_pad}")
    # Canonical views: dy-like input (N, spatial..., K) and the forward filter (spatial.., I, O).
    lhs_spec, rhs_spec, _ = dnums
    xc = jnp.transpose(x, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1])).astype(compute)
    wc = jnp.transpose(w, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0])).astype(compute)
    in_sp, ksz = xc.shape[1:1 + nd], wc.shape[:nd]
    _check_filter_window(ksz, w.shape, names)
    eff = [(f - 1) * d + 1 for f, d in zip(ksz, dil)]
    if isinstance(padding, str):
        if padding.upper() == "VALID":
            pads = [(0, 0)] * nd
        elif padding.upper() == "SAME":  # output size in * stride
            pads = [((e - s) // 2, (e - s) - (e - s) // 2) if e >= s else (0, 0)
                    for s, e in zip(strides, eff)]
            out_pad = tuple(op + max(s - e, 0) for op, s, e in zip(out_pad, strides, eff))
        else:
            raise ValueError(f"{api}: `padding` string must be 'SAME' or 'VALID', got {padding!r}")
    else:
        pads = list(_padding_pairs(padding, nd, names, allow_negative=False))
    out_sp = [(i - 1) * s - lo - hi + e + op
              for i, s, (lo, hi), e, op in zip(in_sp, strides, pads, eff, out_pad)]
    if any(o < 0 for o in out_sp):
        raise ValueError(f"{api}: the padding {pads} leaves a negative output size {out_sp}")
    # The forward problem whose input gradient this is: input size out_sp, output size in_sp.
    # Its high padding absorbs output_padding so that the forward output size is exactly in_sp.
    fwd_pads = [(lo, hi - op) for (lo, hi), op in zip(pads, out_pad)]
    kch, cin_g = xc.shape[-1], wc.shape[-2]
    g = _checks.positive_int(groups, "groups", api)
    if wc.shape[-1] != kch:
        raise ValueError(f"{api}: channel mismatch: `x` has {kch} channels but `w` has "
                         f"{wc.shape[-1]} output (O) channels of the forward convolution")
    if kch % g:
        raise ValueError(f"{api}: `groups`={g} must divide the {kch} channels of `x`")
    pad3 = (1,) * (3 - nd)
    n = xc.shape[0]
    spec = ConvSpec(lhs_shape=(n, *pad3, *out_sp, cin_g * g),
                    rhs_shape=(*pad3, *wc.shape),
                    stride=pad3 + strides, padding=((0, 0),) * (3 - nd) + tuple(fwd_pads),
                    lhs_dilation=(1, 1, 1), rhs_dilation=pad3 + dil, groups=int(g),
                    tf32=_allows_tf32(precision, compute))
    if spec.out_shape[1:4] != (*pad3, *in_sp):
        raise ValueError(f"{api}: the padding {pads} and output_padding {out_pad} are "
                         f"inconsistent with the input size {tuple(in_sp)}")
    y = _bind("bwd_data", xc.reshape(n, *pad3, *xc.shape[1:]), wc.reshape(*pad3, *wc.shape),
              spec=spec, algo=_normalise_algo(algo), out_dtype=out_dtype,
              policy=config_lib.settings().policy())
    y = y.reshape(n, *out_sp, cin_g * g)
    perm = [0] * (nd + 2)
    perm[lhs_spec[0]], perm[lhs_spec[1]] = 0, nd + 1
    for i in range(nd):
        perm[lhs_spec[2 + i]] = 1 + i
    return lax.convert_element_type(jnp.transpose(y, perm), result_dtype)

