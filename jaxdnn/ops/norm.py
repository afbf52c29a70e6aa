"""Normalisation: batch, layer, RMS and group norm (instance norm is ``groups=C``).

Every op is one canonical problem (``cc/norm/norm.h``), reached with free reshapes (the
primitives take every operand as a flat vector in this order)::

    x (P, A, C, K, T)     statistics per (p, c) over (a, k, t): mean, var (P, C)
    scale, bias (Q, C, K) element (p, a, c, k, t) uses affine row p // (P // Q)

    layer/RMS norm over trailing dims  (M, 1, 1, N, 1)
    batch norm, channel axis `axis`    (1, prod(before), C, 1, prod(after))
    group norm, channels-last          (N, H*W, G, C/G, 1)
    group norm, channels-first         (N, 1, G, C/G, H*W)

Statistics and affine parameters are float32 (float64 for float64 inputs); scale and bias are
cast to that dtype, so float32 parameters keep their precision with 16-bit activations.

Primitives (training and inference each a forward, a tangent and a backward)::

    norm_fwd_p(x, scale, bias, res)                  -> y, mean, var, workspace   [kernel]
        (a two-call algorithm runs it as two kernel calls, statistics and apply; see
        _fwd_lowering)
    norm_tangent_p(tx, tscale, tbias, tres; x, scale, mean, var, bias, res)
                                                     -> ty, tmean, tvar           [jnp]
    norm_bwd_p(dy, dmean, dvar; x, scale, mean, var, bias, res)
                                                     -> dx, dscale, dbias, dres, ws  [kernel]
        (dmean, dvar: the statistics' cotangents, or empty vectors where they are zero)
    norm_infer_p(x, scale, bias, mean, var, res)     -> y                         [kernel]
    norm_infer_tangent_p(tx, tscale, tbias, tmean, tvar, tres; x, scale, mean, var, bias, res)
                                                     -> ty                        [jnp]
    norm_infer_bwd_p(dy; x, scale, mean, var, bias, res)
                                     -> dx, dscale, dbias, dmean, dvar, dres, ws  [kernel]

Every primitive carries ``relu`` and a residual operand: the fused epilogue, y = relu(normalised
+ res) (cc/norm/norm.h Epilogue), res an empty vector where there is none. The backwards and
tangents keep bias and res to recompute the ReLU's mask (empty vectors without relu), and a
backward's dres is the masked cotangent (empty unless relu with a residual; without relu the
residual's cotangent is y's, which the transpose rule passes on).

A forward primitive's jvp is its tangent primitive, linear in the tangents and evaluated with
jnp on the saved statistics (forward mode is XLA's arithmetic). The tangent and backward
primitives are each other's transposes, so reverse mode (``jax.grad``) runs the backward
kernels, and their own jvps (the linear part through the primitive, the part through the saved
values in jnp) give every higher order. Batching folds the mapped axis into P (and Q), so each
mapped index keeps its own statistics. ``var`` is the biased variance (flax's BatchNorm
normalises with it too); for an unbiased running variance multiply by ``n / (n - 1)``.

Every primitive carries ``algo`` (an algorithm forced by the caller, or None) and ``policy``
(the jaxdnn.config policy at trace time); each kernel primitive's algorithm is chosen from the
platform's registry at lowering time (jaxdnn/selection, whose norm family is
``selection/norm.py``: heuristic, forced or benchmark) and named in the custom call, as for
convolutions and softmax. :func:`norm_algorithms` lists them: per
pass ("fwd" training forward, "infer" inference forward, "bwd" backward) the GPU registers the
row kernels, the column path's single-pass, three-pass and two-call forwards (each with the
tiled or, for 4- and 8-byte types, the flat apply) and the segment path's split, single-pass,
three-pass and two-call forwards; the CPU one algorithm per path. A forced ``algo=`` applies to
the forward pass; the backward takes the heuristic's (or the benchmark's) choice.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir, xla

from .. import _checks, _ffi, _partition
from .. import _config as config_lib
from ..selection import core

__all__ = ["batch_norm", "batch_norm_inference", "group_norm", "layer_norm", "rms_norm"]


def stat_dtype(dtype) -> np.dtype:
    """Statistics / affine dtype for inputs of `dtype`: float64 for float64, else float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


# ----------------------------------------------------------------------------------------------
# The canonical problem (cc/norm/norm.h)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NormShape:
    P: int
    A: int
    C: int
    K: int
    T: int
    Q: int = 1

    @property
    def x_shape(self):
        return (self.P, self.A, self.C, self.K, self.T)

    @property
    def stats_shape(self):
        return (self.P, self.C)

    @property
    def affine_shape(self):
        return (self.Q, self.C, self.K)

    @property
    def n(self) -> int:  # values per statistics group
        return self.A * self.K * self.T

    def workspace(self, direction: str, dtype) -> int:
        """Bytes of kernel scratch (cc/norm/norm.h, the one definition, via the CPU module)."""
        return _ffi._cpu.norm_workspace_bytes(
            direction, [self.P, self.A, self.C, self.K, self.T, self.Q], np.dtype(dtype).name)

    def fwd_workspace(self, dtype) -> int:
        return self.workspace("fwd", dtype)

    def bwd_workspace(self, dtype) -> int:
        return self.workspace("bwd", dtype)

    def batched(self, v: int) -> NormShape:
        return dataclasses.replace(self, P=v * self.P, Q=v * self.Q)


# ----------------------------------------------------------------------------------------------
# jnp references on canonical operands (the tangent primitives' implementation, and the part
# of every jvp that flows through saved values)
# ----------------------------------------------------------------------------------------------

def _stat_b(shape: NormShape, v):
    """(P*C,) -> (P, 1, C, 1, 1)."""
    return v.reshape(shape.P, 1, shape.C, 1, 1)


def _affine_b(shape: NormShape, a):
    """(Q*C*K,) -> (P, 1, C, K, 1): row p uses affine row p // (P // Q)."""
    q, pq = shape.Q, shape.P // shape.Q
    a = jnp.broadcast_to(a.reshape(q, 1, 1, shape.C, shape.K, 1), (q, pq, 1, shape.C, shape.K, 1))
    return a.reshape(shape.P, 1, shape.C, shape.K, 1)


def _group_sum(v):
    """(P, A, C, K, T) -> (P*C,)."""
    return v.sum(axis=(1, 3, 4)).reshape(-1)


def _affine_sum(shape: NormShape, v):
    """(P, A, C, K, T) -> (Q*C*K,), summing the rows of each affine row."""
    v = v.reshape(shape.Q, shape.P // shape.Q, shape.A, shape.C, shape.K, shape.T)
    return v.sum(axis=(1, 2, 5)).reshape(-1)


def _x5(shape: NormShape, v, dtype):
    """A flat x-like operand as (P, A, C, K, T) in `dtype`."""
    return v.reshape(shape.x_shape).astype(dtype)


def _normalised(shape, x, mean, var, eps):
    """(x - mean, rstd (P*C,), xhat), 5-D in the statistics dtype."""
    r = lax.rsqrt(var + jnp.asarray(eps, var.dtype))
    xc = _x5(shape, x, var.dtype) - _stat_b(shape, mean)
    return xc, r, xc * _stat_b(shape, r)


# The fused epilogue (cc/norm/norm.h Epilogue): z = norm(x) [+ residual], y = relu(z) with
# relu; the backwards mask the cotangent where z <= 0. The saved `bias` and `res` that recompute
# z are empty vectors unless relu (and res unless there is a residual too); a residual tangent
# `tr` is empty where there is no residual.
def _relu_mask(shape, xhat, scale, bias, res, v):
    """v where z = xhat*scale + bias (+ res) > 0, else 0 (5-D, statistics dtype)."""
    z = xhat * _affine_b(shape, scale) + _affine_b(shape, bias)
    if res.size:
        z = z + _x5(shape, res, z.dtype)
    return jnp.where(z > 0, v, jnp.zeros_like(v))


def _epilogue_tangent(shape, ty, tr, xhat, scale, bias, res, relu):
    if tr.size:
        ty = ty + _x5(shape, tr, ty.dtype)
    return _relu_mask(shape, xhat, scale, bias, res, ty) if relu else ty


def _epilogue_cotangent(shape, dy, xhat, scale, bias, res, relu, x_dtype):
    """(dz, d(residual)): the cotangent through the ReLU, and the residual's (empty unless the
    kernels write it: relu with a residual)."""
    dz = _relu_mask(shape, xhat, scale, bias, res, dy) if relu else dy
    dres = dz.reshape(-1).astype(x_dtype) if relu and res.size else jnp.zeros((0,), x_dtype)
    return dz, dres


# (The references take the kernel primitives' selection parameters, algo and policy, and ignore
# them.)
def _tangent_ref(tx, ts, tb, tr, x, scale, mean, var, bias, res, *, shape, eps, centered,
                 relu=False, **_):
    xc, r, xhat = _normalised(shape, x, mean, var, eps)
    tx = _x5(shape, tx, var.dtype)
    tmean = _group_sum(tx) / shape.n if centered else jnp.zeros_like(mean)
    tvar = 2 * _group_sum(xc * tx) / shape.n
    txhat = (_stat_b(shape, r) * (tx - _stat_b(shape, tmean))
             - 0.5 * xhat * _stat_b(shape, r * r * tvar))
    ty = _affine_b(shape, scale) * txhat + xhat * _affine_b(shape, ts) + _affine_b(shape, tb)
    ty = _epilogue_tangent(shape, ty, tr, xhat, scale, bias, res, relu)
    return [ty.reshape(-1).astype(x.dtype), tmean, tvar]


def _bwd_ref(dy, dmean, dvar, x, scale, mean, var, bias, res, *, shape, eps, centered,
             relu=False, total=None, shards=1, **_):
    """(total, shards: a shard's backward of a synchronised batch norm, see _synced_bwd.)"""
    dmean, dvar = (c if c.shape == mean.shape else 0 for c in (dmean, dvar))  # empty: zero
    xc, r, xhat = _normalised(shape, x, mean, var, eps)
    dy, dres = _epilogue_cotangent(shape, _x5(shape, dy, var.dtype), xhat, scale, bias, res,
                                   relu, x.dtype)
    g = dy * _affine_b(shape, scale)
    sums = [_group_sum(g * xhat), _group_sum(g), _affine_sum(shape, dy * xhat),
            _affine_sum(shape, dy)]
    sg_xhat, sg, dscale, dbias = total(sums) if total else sums
    n = shape.n * shards
    c1 = (2 * dvar - r * r * sg_xhat) / n
    c2 = (dmean - r * sg) / n if centered else jnp.zeros_like(mean)
    dx = g * _stat_b(shape, r) + xc * _stat_b(shape, c1) + _stat_b(shape, c2)
    return [dx.reshape(-1).astype(x.dtype), dscale, dbias, dres]


def _infer_tangent_ref(tx, ts, tb, tmean, tvar, tr, x, scale, mean, var, bias, res, *, shape,
                       eps, relu=False, **_):
    _, r, xhat = _normalised(shape, x, mean, var, eps)
    tx = _x5(shape, tx, var.dtype)
    txhat = (_stat_b(shape, r) * (tx - _stat_b(shape, tmean))
             - 0.5 * xhat * _stat_b(shape, r * r * tvar))
    ty = _affine_b(shape, scale) * txhat + xhat * _affine_b(shape, ts) + _affine_b(shape, tb)
    ty = _epilogue_tangent(shape, ty, tr, xhat, scale, bias, res, relu)
    return ty.reshape(-1).astype(x.dtype)


def _infer_bwd_ref(dy, x, scale, mean, var, bias, res, *, shape, eps, relu=False, **_):
    _, r, xhat = _normalised(shape, x, mean, var, eps)
    dy, dres = _epilogue_cotangent(shape, _x5(shape, dy, var.dtype), xhat, scale, bias, res,
                                   relu, x.dtype)
    g = dy * _affine_b(shape, scale)
    return [(g * _stat_b(shape, r)).reshape(-1).astype(x.dtype), _affine_sum(shape, dy * xhat),
            _affine_sum(shape, dy), -r * _group_sum(g), -0.5 * r * r * _group_sum(g * xhat),
            dres]


# ----------------------------------------------------------------------------------------------
# Primitives
# ----------------------------------------------------------------------------------------------

# Operand kinds: x-like (P, A, C, K, T), statistics (P, C), affine (Q, C, K), workspace, and
# the statistics' cotangents (P, C) in norm_bwd, or an empty vector for zero ones: layer norm's
# mean and var are never outputs, and zeros of their shape would cost a fill kernel in every
# backward. The epilogue's operands (cc/norm/norm.h Epilogue): the residual and its tangent or
# cotangent (x-like, or empty for none), and the bias the backwards recompute z with (affine, or
# empty without relu).
X, S, AFF, WS, DS = "x", "stats", "affine", "workspace", "stats cotangent"
RE, AE = "residual", "epilogue bias"
_MAY_BE_EMPTY = (DS, RE, AE)


def _size(kind, shape: NormShape, ws=0) -> int:
    return {X: math.prod(shape.x_shape), S: math.prod(shape.stats_shape),
            DS: math.prod(shape.stats_shape), AFF: math.prod(shape.affine_shape), WS: ws,
            RE: math.prod(shape.x_shape), AE: math.prod(shape.affine_shape)}[kind]


def _aval(kind, shape: NormShape, x_dtype, ws=0, empty=False):
    """Operands are flat vectors (a reshape to 1-D is free for XLA, a reshape to the 5-D
    canonical shape with its unit dims can cost a relayout copy). The workspace is bytes."""
    dtype = {X: x_dtype, RE: x_dtype, WS: np.dtype(np.uint8)}.get(kind, stat_dtype(x_dtype))
    return ShapedArray((0 if empty else _size(kind, shape, ws),), dtype)


def _check(name, kinds, avals, shape: NormShape):
    x_dtype = next(a.dtype for a, k in zip(avals, kinds) if k == X)
    for i, (a, k) in enumerate(zip(avals, kinds)):
        want = _aval(k, shape, x_dtype)
        shapes = (want.shape, (0,)) if k in _MAY_BE_EMPTY else (want.shape,)
        if tuple(a.shape) not in shapes or a.dtype != want.dtype:
            raise TypeError(f"jaxdnn {name}: operand {i} is {a.str_short()}, expected "
                            f"{want.str_short()} for {shape}")
    return x_dtype


# name -> (operand kinds, result kinds, workspace bytes fn or None, linear operand count). The
# linear operands lead; the rest are saved values.
# The saved operands of the backwards and tangents are (x, scale, mean, var, bias, residual); a
# backward's d(residual) output is x-like exactly when its saved residual is (relu and a
# residual), else empty.
_SPECS = {
    "norm_fwd": ((X, AFF, AFF, RE), (X, S, S, WS), NormShape.fwd_workspace, 0),
    "norm_bwd": ((X, DS, DS, X, AFF, S, S, AE, RE), (X, AFF, AFF, RE, WS),
                 NormShape.bwd_workspace, 3),
    "norm_tangent": ((X, AFF, AFF, RE, X, AFF, S, S, AE, RE), (X, S, S), None, 4),
    "norm_infer": ((X, AFF, AFF, S, S, RE), (X,), None, 0),
    "norm_infer_bwd": ((X, X, AFF, S, S, AE, RE), (X, AFF, AFF, S, S, RE, WS),
                       NormShape.bwd_workspace, 1),
    "norm_infer_tangent": ((X, AFF, AFF, S, S, RE, X, AFF, S, S, AE, RE), (X,), None, 6),
}


def _abstract_eval(name, *avals, shape, eps, centered=True, relu=False, algo=None, policy=None):
    kinds, outs, ws_fn, _ = _SPECS[name]
    x_dtype = _check(name, kinds, avals, shape)
    empty_dres = avals[-1].shape[0] == 0  # (the saved residual: the last operand)
    res = [_aval(k, shape, x_dtype, ws_fn(shape, x_dtype) if k == WS else 0,
                 empty=k == RE and empty_dres) for k in outs]
    return res if len(res) > 1 else res[0]


def _call_attrs(shape, eps, centered, name, relu=None):
    """A kernel call's attributes (relu None: a target without the epilogue, fwd_stats)."""
    attrs = dict(shape=[shape.P, shape.A, shape.C, shape.K, shape.T, shape.Q], eps=eps, algo=name)
    if relu is not None:
        attrs["relu"] = bool(relu)
    return attrs if centered is None else dict(attrs, centered=bool(centered))


def _kernel_attrs(name, platform, ctx, **params):
    choice = core.choose_for_call(_PRIMS[name], ctx.avals_in, params, platform)
    return _call_attrs(params["shape"], params["eps"], params.get("centered"), choice.name,
                       params["relu"])


def _kernel_primitive(name):
    return _ffi.define_primitive(f"jaxdnn_{name}", partial(_abstract_eval, name),
                                 attrs=partial(_kernel_attrs, name),
                                 multiple_results=len(_SPECS[name][1]) > 1)


def _jnp_primitive(name, impl):
    """A primitive evaluated by `impl` (jnp), so that it can carry transpose and batching
    rules of its own."""
    prim = Primitive(f"jaxdnn_{name}")
    prim.multiple_results = len(_SPECS[name][1]) > 1
    prim.def_impl(partial(xla.apply_primitive, prim))
    prim.def_abstract_eval(_ffi.sized_abstract_eval(prim.name, partial(_abstract_eval, name)))
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=prim.multiple_results))
    return prim


norm_fwd_p = _kernel_primitive("norm_fwd")


def _fwd_lowering(platform):
    """The training forward's lowering: one custom call, or, for a two-call algorithm (GPU),
    two: the statistics (mean, var and the workspace's partials or coefficient table) and then
    the apply, so that XLA schedules them as it schedules its own reductions and elementwise
    passes: a read right after a write pays for the write-back of the L2's dirty lines (H200:
    a flat read of 205 MB, 46.8 us alone, 56.3 right after a write), and XLA runs independent
    reductions one after another."""
    one, stats, apply = (_ffi.lowering(f"jaxdnn_norm_{t}", lambda _, ctx, **attrs: attrs)(platform)
                         for t in ("fwd", "fwd_stats", "fwd_apply"))

    def rule(ctx, x, scale, bias, res, **params):
        family = core.family_of(norm_fwd_p)
        problem = family.problem(norm_fwd_p, ctx.avals_in, params)
        name = core.choose(family, problem, platform).name
        attrs = _call_attrs(params["shape"], params["eps"], params["centered"], name,
                            params["relu"])
        if not family.two_calls(problem, platform, name):
            return one(ctx, x, scale, bias, res, **attrs)
        y_aval, mean_aval, var_aval, ws_aval = ctx.avals_out
        x_aval, scale_aval, bias_aval, res_aval = ctx.avals_in
        stats_attrs = {k: v for k, v in attrs.items() if k != "relu"}
        mean, var, ws = stats(ctx.replace(avals_in=[x_aval, scale_aval, bias_aval],
                                          avals_out=[mean_aval, var_aval, ws_aval]),
                              x, scale, bias, **stats_attrs)
        apply_ctx = ctx.replace(avals_in=[x_aval, scale_aval, bias_aval, mean_aval, var_aval,
                                          ws_aval, res_aval], avals_out=[y_aval])
        (y,) = apply(apply_ctx, x, scale, bias, mean, var, ws, res, **attrs)
        return [y, mean, var, ws]

    return rule


_ffi.register_lowerings(norm_fwd_p, _fwd_lowering)

norm_bwd_p = _kernel_primitive("norm_bwd")
norm_infer_p = _kernel_primitive("norm_infer")
norm_infer_bwd_p = _kernel_primitive("norm_infer_bwd")
norm_tangent_p = _jnp_primitive("norm_tangent", _tangent_ref)
norm_infer_tangent_p = _jnp_primitive("norm_infer_tangent", _infer_tangent_ref)

_PRIMS = {"norm_fwd": norm_fwd_p, "norm_bwd": norm_bwd_p, "norm_tangent": norm_tangent_p,
          "norm_infer": norm_infer_p, "norm_infer_bwd": norm_infer_bwd_p,
          "norm_infer_tangent": norm_infer_tangent_p}
_REFS = {"norm_bwd": _bwd_ref, "norm_tangent": _tangent_ref,
         "norm_infer_bwd": _infer_bwd_ref, "norm_infer_tangent": _infer_tangent_ref}


def _as_list(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _zero_of(v):
    return ad.Zero(ShapedArray(v.shape, v.dtype).to_tangent_aval())


def _instantiate(ts, kinds):
    """(Co)tangents as arrays for the linear operands of a primitive: symbolic zeros become
    zeros, or an empty vector where the operand may be empty (a statistics cotangent, a
    residual's tangent or cotangent)."""
    return [jnp.zeros((0,), t.aval.dtype) if type(t) is ad.Zero and k in _MAY_BE_EMPTY
            else ad.instantiate_zeros(t) for t, k in zip(ts, kinds)]


def _saved_epilogue(bias, res, relu):
    """The (bias, residual) a backward or tangent keeps to recompute z: empty unless relu."""
    if relu:
        return bias, res
    return jnp.zeros((0,), bias.dtype), jnp.zeros((0,), res.dtype)


# ---- jvp of the forward primitives: their tangent primitives --------------------------------

# A forced algorithm is the forward's; the tangent (and its transpose, the backward) chooses its
# own under the same policy.
def _fwd_jvp(primals, tangents, *, shape, eps, centered, relu, algo, policy):
    x, scale, bias, res = primals
    y, mean, var, ws = norm_fwd_p.bind(x, scale, bias, res, shape=shape, eps=eps,
                                       centered=centered, relu=relu, algo=algo, policy=policy)
    t = [ad.instantiate_zeros(t) for t in tangents]
    ty, tmean, tvar = norm_tangent_p.bind(*t, x, scale, mean, var,
                                          *_saved_epilogue(bias, res, relu), shape=shape,
                                          eps=eps, centered=centered, relu=relu, algo=None,
                                          policy=policy)
    return (y, mean, var, ws), (ty, tmean, tvar, _zero_of(ws))


def _infer_jvp(primals, tangents, *, shape, eps, relu, algo, policy):
    x, scale, bias, mean, var, res = primals
    y = norm_infer_p.bind(*primals, shape=shape, eps=eps, relu=relu, algo=algo, policy=policy)
    t = [ad.instantiate_zeros(t) for t in tangents]
    return y, norm_infer_tangent_p.bind(*t, x, scale, mean, var,
                                        *_saved_epilogue(bias, res, relu), shape=shape, eps=eps,
                                        relu=relu, algo=None, policy=policy)


ad.primitive_jvps[norm_fwd_p] = _fwd_jvp
ad.primitive_jvps[norm_infer_p] = _infer_jvp


# ---- the linear primitives: jvp (linear part + saved-value part) and transposes -------------

def _linear_jvp(name):
    prim, ref = _PRIMS[name], _REFS[name]
    in_kinds, out_kinds, _, n_lin = _SPECS[name]

    def jvp(primals, tangents, **params):
        out = _as_list(prim.bind(*primals, **params))
        lin, res = primals[:n_lin], primals[n_lin:]
        parts = []
        if any(type(t) is not ad.Zero for t in tangents[:n_lin]):
            t_lin = _instantiate(tangents[:n_lin], in_kinds)
            parts.append(_as_list(prim.bind(*t_lin, *res, **params)))
        if any(type(t) is not ad.Zero for t in tangents[n_lin:]):
            t_res = [ad.instantiate_zeros(t) for t in tangents[n_lin:]]
            _, t = jax.jvp(lambda *r: _as_list(ref(*lin, *r, **params)), tuple(res), tuple(t_res))
            parts.append(t)
        t_out = []
        for i, (o, kind) in enumerate(zip(out, out_kinds)):
            terms = [p[i] for p in parts] if kind != WS else []  # no tangent for scratch
            t_out.append(sum(terms[1:], terms[0]) if terms else _zero_of(o))
        return (out, t_out) if prim.multiple_results else (out[0], t_out[0])

    return jvp


def _transposer(name, other):
    """Transpose of linear primitive `name` is primitive `other` (same residuals)."""
    kinds, _, _, n_lin = _SPECS[name]
    other_prim, other_kinds, n_in_other = _PRIMS[other], _SPECS[other][0], _SPECS[other][3]

    def transpose(cts, *args, **params):
        cts = _instantiate(_as_list(cts)[:n_in_other], other_kinds)
        res = args[n_lin:]
        if any(ad.is_undefined_primal(r) for r in res):
            raise NotImplementedError(f"jaxdnn {name}: transpose with respect to saved values")
        outs = _as_list(other_prim.bind(*cts, *res, **params))[:n_lin]
        out = []
        for o, a, k in zip(outs, args[:n_lin], kinds):
            if not ad.is_undefined_primal(a):
                out.append(None)
            elif a.aval.shape == o.shape:
                out.append(o)
            elif k == RE and a.aval.shape[0] and not params["relu"]:
                out.append(cts[0])  # a residual added without relu: its cotangent is y's
            else:
                out.append(None)  # an empty operand is no input: its cotangent is zero
        return out + [None] * len(res)

    return transpose


for _name in ("norm_bwd", "norm_tangent", "norm_infer_bwd", "norm_infer_tangent"):
    ad.primitive_jvps[_PRIMS[_name]] = _linear_jvp(_name)
ad.primitive_transposes[norm_tangent_p] = _transposer("norm_tangent", "norm_bwd")
ad.primitive_transposes[norm_bwd_p] = _transposer("norm_bwd", "norm_tangent")
ad.primitive_transposes[norm_infer_tangent_p] = _transposer("norm_infer_tangent", "norm_infer_bwd")
ad.primitive_transposes[norm_infer_bwd_p] = _transposer("norm_infer_bwd", "norm_infer_tangent")


# ---- batching: the mapped axis folds into P (and Q) -----------------------------------------

def _batch_rule(name):
    prim = _PRIMS[name]
    outs = _SPECS[name][1]

    def rule(args, dims, *, shape, **params):
        # Flat operands: (V, size) -> (V*size,) puts index v at P (or Q) rows v*P.. (v+1)*P-1.
        v = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        folded = []
        for a, d in zip(args, dims):
            a = jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (v, *a.shape))
            folded.append(a.reshape(-1))
        res = _as_list(prim.bind(*folded, shape=shape.batched(v), **params))
        out, out_dims = [], []
        for r, k in zip(res, outs):
            if k == WS or (k == RE and r.shape[0] == 0):  # scratch, an empty d(residual)
                out.append(r)
                out_dims.append(None)
            else:
                out.append(r.reshape(v, -1))
                out_dims.append(0)
        return (out, out_dims) if prim.multiple_results else (out[0], out_dims[0])

    return rule


for _name, _prim in _PRIMS.items():
    batching.primitive_batchers[_prim] = _batch_rule(_name)


# ----------------------------------------------------------------------------------------------
# Argument checking
# ----------------------------------------------------------------------------------------------

def _check_eps(eps, api) -> float:
    try:
        e = float(eps)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{api}: `eps` must be a float, got {eps!r}") from err
    if not e >= 0 or not math.isfinite(e):
        raise ValueError(f"{api}: `eps` must be finite and >= 0, got {eps!r}")
    return float(np.float32(e))  # the kernels take it as float32; so does everything else


def _param(p, name, want_shape, dtype, fill, api):
    """scale/bias/mean/var as an array of `want_shape` in the statistics dtype (None -> fill)."""
    if p is None:
        return jnp.full(want_shape, fill, dtype)
    p = _checks.as_array(p, name, api)
    if not jnp.issubdtype(p.dtype, jnp.floating):
        raise TypeError(f"{api}: `{name}` must be a floating-point array, got dtype {p.dtype}")
    if tuple(p.shape) != tuple(want_shape):
        raise ValueError(f"{api}: `{name}` has shape {tuple(p.shape)}, expected "
                         f"{tuple(want_shape)}")
    return p.astype(dtype)


def _axis(axis, ndim, api, name="axis") -> int:
    try:
        a = operator.index(axis)
    except TypeError as err:
        raise TypeError(f"{api}: `{name}` must be an int, got {axis!r}") from err
    if not -ndim <= a < ndim:
        raise ValueError(f"{api}: `{name}`={axis} is out of range for `x` of rank {ndim}")
    return a % ndim


def _axes(axis, ndim, api) -> tuple[int, ...]:
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    if not axes:
        raise ValueError(f"{api}: `axis` must name at least one axis")
    out = tuple(sorted(_axis(a, ndim, api) for a in axes))
    if len(set(out)) != len(out):
        raise ValueError(f"{api}: `axis` {axis!r} repeats an axis")
    return out


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def _selection(algo, api):
    """The selection parameters of a call: a forced algorithm (checked to be a name) and the
    jaxdnn.config policy."""
    if algo is not None and not isinstance(algo, str):
        raise TypeError(f"{api}: `algo` must be None or an algorithm name, got {algo!r}")
    return dict(algo=algo, policy=config_lib.settings().policy())


def _no_residual(x):
    return jnp.zeros((0,), x.dtype)


def _train(x, scale, bias, shape: NormShape, eps, centered, algo, api, residual=None,
           relu=False):
    res = _no_residual(x) if residual is None else residual.reshape(-1)
    y, mean, var, _ = norm_fwd_p.bind(x.reshape(-1), scale.reshape(-1), bias.reshape(-1), res,
                                      shape=shape, eps=eps, centered=centered, relu=relu,
                                      **_selection(algo, api))
    return y.reshape(x.shape), mean, var


_ACTIVATIONS = (None, "relu")


def _epilogue(api, x, shape: NormShape, activation, residual):
    """Checked (residual or None, relu) of a batch norm's fused epilogue."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"{api}: `activation` must be one of {_ACTIVATIONS}, got {activation!r}")
    if residual is not None:
        residual = _checks.as_array(residual, "residual", api)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"{api}: `residual` must match `x` ({x.dtype}{list(x.shape)}), got "
                             f"{residual.dtype}{list(residual.shape)}")
    if (activation or residual is not None) and shape.A == 1 and shape.T == 1:
        raise ValueError(f"{api}: `activation` and `residual` fuse into a batch norm over more "
                         "than one value per channel; `x` has one (compose jaxdnn.relu and +)")
    return residual, activation == "relu"


def _row_norm(api, x, scale, bias, axis, eps, centered, algo):
    x = _checks.operand(x, "x", api)
    eps = _check_eps(eps, api)
    axes = _axes(axis, x.ndim, api)
    norm_shape = tuple(x.shape[a] for a in axes)
    sd = stat_dtype(x.dtype)
    scale = _param(scale, "scale", norm_shape, sd, 1, api)
    bias = _param(bias, "bias", norm_shape, sd, 0, api)
    trailing = tuple(range(x.ndim - len(axes), x.ndim))
    xt = jnp.moveaxis(x, axes, trailing) if axes != trailing else x
    k = math.prod(norm_shape)
    shape = NormShape(P=math.prod(xt.shape[:x.ndim - len(axes)]), A=1, C=1, K=k, T=1)
    y, _, _ = _train(xt, scale, bias, shape, eps, centered, algo, api)
    return jnp.moveaxis(y, trailing, axes) if axes != trailing else y


def layer_norm(x, scale, bias, *, axis=-1, eps: float = 1e-5, algo: str | None = None):
    """Layer normalisation: ``(x - mean) / sqrt(var + eps) * scale + bias`` with the mean and
    biased variance over `axis`.

    Args:
      x: input, float32/float64/float16/bfloat16.
      scale, bias: shaped like the normalised dims (``x.shape[a] for a in sorted axes``), or
        None for no scale (ones) / no bias (zeros), like flax's ``use_scale``/``use_bias``.
        Cast to float32 (float64 for float64 x); gradients come back in their own dtype.
      axis: an int or a tuple of ints (flax's ``reduction_axes``). Trailing axes are the fast
        path; other axes are moved to the end and back (XLA transposes).
      eps: added to the variance (used as float32).
      algo: None, or an algorithm of the platform's registry for the forward (see
        :func:`norm_algorithms`).
    """
    return _row_norm("jaxdnn.layer_norm", x, scale, bias, axis, eps, True, algo)


def rms_norm(x, scale, *, axis=-1, eps: float = 1e-5, algo: str | None = None):
    """RMS normalisation: ``x / sqrt(mean(x**2) + eps) * scale`` over `axis` (an int or a
    tuple). `scale` is shaped like the normalised dims, or None. `algo` forces the forward's
    algorithm (see :func:`norm_algorithms`)."""
    return _row_norm("jaxdnn.rms_norm", x, scale, None, axis, eps, False, algo)


def _per_channel(api, x, scale, bias, axis, eps):
    """Checked (x, eps, scale, bias) of a batch norm over channel `axis`, and its problem."""
    x = _checks.operand(x, "x", api)
    eps = _check_eps(eps, api)
    ax = _axis(axis, x.ndim, api)
    c = x.shape[ax]
    sd = stat_dtype(x.dtype)
    scale = _param(scale, "scale", (c,), sd, 1, api)
    bias = _param(bias, "bias", (c,), sd, 0, api)
    shape = NormShape(P=1, A=math.prod(x.shape[:ax]), C=c, K=1, T=math.prod(x.shape[ax + 1:]))
    return x, eps, scale, bias, shape


def batch_norm(x, scale, bias, *, axis: int = -1, eps: float = 1e-5, algo: str | None = None,
               activation: str | None = None, residual=None):
    """Batch normalisation in training mode.

    Statistics per channel (`axis`: -1 for channels-last, 1 for NCHW) over every other axis,
    computed in one pass over `x` with a stable parallel algorithm. Returns
    ``(y, batch_mean, batch_var)``; the statistics are float32 (float64 for float64 x) and
    `batch_var` is the biased variance that normalises `y` (multiply by ``n / (n - 1)`` for an
    unbiased running estimate). All three outputs are differentiable functions of `x`.
    scale/bias: shape ``(C,)`` or None. `algo` forces the forward's algorithm (see
    :func:`norm_algorithms`).

    Fused epilogue: ``y = activation(normalised + residual)`` in the same pass,
    as a ResNet block ends (``activation="relu"``, `residual` the shortcut, shaped and typed like
    `x`); its backward masks the gradient inside the batch-norm backward kernels and writes the
    residual's gradient on the way, so neither direction pays a separate pass for the add or
    the ReLU.
    """
    api = "jaxdnn.batch_norm"
    x, eps, scale, bias, shape = _per_channel(api, x, scale, bias, axis, eps)
    residual, relu = _epilogue(api, x, shape, activation, residual)
    c = shape.C
    y, mean, var = _train(x, scale, bias, shape, eps, True, algo, api, residual, relu)
    return y, mean.reshape(c), var.reshape(c)


def batch_norm_inference(x, scale, bias, mean, var, *, axis: int = -1, eps: float = 1e-5,
                         algo: str | None = None, activation: str | None = None, residual=None):
    """Batch normalisation with given statistics:
    ``(x - mean) / sqrt(var + eps) * scale + bias`` per channel `axis`. mean, var, scale and
    bias have shape ``(C,)`` (scale/bias may be None); all inputs are differentiable. `algo`
    forces the forward's algorithm (see :func:`norm_algorithms`). `activation` ("relu") and
    `residual` fuse as in :func:`batch_norm`."""
    api = "jaxdnn.batch_norm_inference"
    x, eps, scale, bias, shape = _per_channel(api, x, scale, bias, axis, eps)
    residual, relu = _epilogue(api, x, shape, activation, residual)
    c, sd = shape.C, stat_dtype(x.dtype)
    if mean is None or var is None:
        raise TypeError(f"{api}: `mean` and `var` are required")
    mean = _param(mean, "mean", (c,), sd, 0, api)
    var = _param(var, "var", (c,), sd, 0, api)
    res = _no_residual(x) if residual is None else residual.reshape(-1)
    y = norm_infer_p.bind(x.reshape(-1), scale, bias, mean, var, res, shape=shape, eps=eps,
                          relu=relu, **_selection(algo, api))
    return y.reshape(x.shape)


_GROUP_LAYOUTS = ("NC", "NWC", "NCW", "NHWC", "NCHW", "NDHWC", "NCDHW")


def group_norm(x, scale, bias, *, groups: int, eps: float = 1e-5, layout: str | None = None,
               algo: str | None = None):
    """Group normalisation: statistics per (sample, group) over the spatial dims and the
    group's ``C / groups`` channels; ``groups=C`` is instance norm, ``groups=1`` layer norm
    over everything but the batch.

    Args:
      x: ``(N, ..., C)`` (channels-last, the default for every rank) or channels-first.
      scale, bias: per channel, shape ``(C,)``, or None.
      groups: number of groups, must divide C.
      layout: None (channels-last), or one of NC, NWC, NCW, NHWC, NCHW, NDHWC, NCDHW.
      algo: None, or an algorithm of the platform's registry for the forward (see
        :func:`norm_algorithms`).
    """
    api = "jaxdnn.group_norm"
    x = _checks.operand(x, "x", api)
    eps = _check_eps(eps, api)
    if layout is None:
        if x.ndim < 2:
            raise ValueError(f"{api}: `x` must have rank >= 2 (batch and channels), got rank "
                             f"{x.ndim}")
        channels_first = False
    else:
        if layout not in _GROUP_LAYOUTS:
            raise ValueError(f"{api}: `layout` must be one of {_GROUP_LAYOUTS}, got {layout!r}")
        if len(layout) != x.ndim:
            raise ValueError(f"{api}: `layout` {layout!r} does not match the rank {x.ndim} of "
                             "`x`")
        channels_first = layout[1] == "C" and x.ndim > 2
    c = x.shape[1] if channels_first else x.shape[-1]
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{api}: `groups` must be a positive int, got {groups!r}")
    if c % groups:
        raise ValueError(f"{api}: `groups`={groups} must divide the {c} channels of `x`")
    sd = stat_dtype(x.dtype)
    scale = _param(scale, "scale", (c,), sd, 1, api)
    bias = _param(bias, "bias", (c,), sd, 0, api)
    spatial = math.prod(x.shape[2:] if channels_first else x.shape[1:-1])
    g, k = int(groups), c // int(groups)
    if channels_first:
        shape = NormShape(P=x.shape[0], A=1, C=g, K=k, T=spatial)
    else:
        shape = NormShape(P=x.shape[0], A=spatial, C=g, K=k, T=1)
    y, _, _ = _train(x, scale, bias, shape, eps, True, algo, api)
    return y


# ---- partitioning ----------------------------------------------------------------------------
# Operands are flat, so a dim of the rule is a compound of the canonical factors (p a c k t),
# unit ones left out: a shard of a flat operand is a contiguous block, so only the leading
# factor of x (p: rows/samples; where P is 1, as in batch norm, the leading other) is sharded.
# The training primitives' normalised factors (c k t) need replication and so does a (the
# batch of a batch norm) where P > 1. Where P is 1, a sharded a is a synchronised batch norm:
# each shard reduces its block to partial statistics (forward: per-channel mean and M2; backward:
# the per-channel sums of the gradient formula), one collective combines them, and each shard
# finishes with the global values (_synced_fwd, _synced_bwd). The inference primitives pass
# every factor through; the backward ones sum the affine (and statistics) gradients over the
# factors they lack. The workspace is scratch.


def _psum_parts(parts, axes):
    """psum of a list of vectors in one all-reduce."""
    sizes = [p.shape[0] for p in parts]
    total = lax.psum(jnp.concatenate(parts), axes)
    return jnp.split(total, np.cumsum(sizes)[:-1])


def _synced_fwd(axes, shards, *, shape, eps, centered, relu, policy, **_):
    """A shard's training forward of a batch norm whose batch (a) is sharded over `axes`: its
    block's per-channel mean and M2 (sum of squared deviations), all-gathered (one collective)
    and combined exactly (Chan et al.: M2 = sum M2_i + n sum (mean_i - mean)^2, equal n per
    shard), then the apply kernel with the global statistics."""

    def run(x, scale, bias, res):
        sd = stat_dtype(x.dtype)
        xs = _x5(shape, x, sd)
        mean_i = _group_sum(xs) / shape.n if centered else jnp.zeros(shape.P * shape.C, sd)
        m2_i = _group_sum(jnp.square(xs - _stat_b(shape, mean_i)))
        parts = lax.all_gather(jnp.stack([mean_i, m2_i]), axes)  # (shards, 2, P*C)
        mean = jnp.mean(parts[:, 0], axis=0)
        m2 = jnp.sum(parts[:, 1], axis=0) + shape.n * jnp.sum(jnp.square(parts[:, 0] - mean), 0)
        var = m2 / (shape.n * shards)
        y = norm_infer_p.bind(x, scale, bias, mean, var, res, shape=shape, eps=eps, relu=relu,
                              algo=None, policy=policy)
        return [y, mean, var, None]  # the workspace: scratch

    return run


def _synced_bwd(axes, shards, **params):
    """A shard's training backward of a synchronised batch norm: the reference formula with its
    four per-channel sums all-reduced in one psum."""
    return lambda *args: _bwd_ref(*args, **params, total=partial(_psum_parts, axes=axes),
                                  shards=shards) + [None]

_TRAINING = ("norm_fwd", "norm_bwd", "norm_tangent")
_KIND_FACTORS = {X: "packt", S: "pc", DS: "pc", AFF: "ck", RE: "packt", AE: "ck"}


def _partition_rule(name):
    kinds, outs, ws_fn, _ = _SPECS[name]

    synced = {"norm_fwd": _synced_fwd, "norm_bwd": _synced_bwd}.get(name)

    def rule(*avals, shape, **params):
        if shape.Q != 1 or (name in _TRAINING and shape.P == shape.A == 1):
            return None
        sizes = dict(p=shape.P, a=shape.A, c=shape.C, k=shape.K, t=shape.T)
        extra = iter(range(1000))

        def dim(kind, n):
            fs = [f for f in _KIND_FACTORS.get(kind, "") if sizes[f] != 1]
            if kind == WS or (kind in _MAY_BE_EMPTY and n == 0) or not fs:
                return None if fs or kind in (WS, *_MAY_BE_EMPTY) else "bad"
            return fs[0] if len(fs) == 1 else "(" + " ".join(fs) + ")"

        out_avals = _as_list(_abstract_eval(name, *avals, shape=shape, **{
            k: v for k, v in params.items() if k != "devices"}))
        ops = [dim(k, a.shape[0]) or f"z{next(extra)}" for k, a in zip(kinds, avals)]
        res = [dim(k, a.shape[0]) or f"z{next(extra)}" for k, a in zip(outs, out_avals)]
        if "bad" in ops + res:  # a whole operand of size 1: nothing to partition
            return None
        shard_fn = None
        if name not in _TRAINING:
            replicate, reduce = (), ("p", "a", "c", "k", "t")
        elif shape.P != 1:
            replicate, reduce = ("a", "c", "k", "t"), ("p",)
        else:
            replicate, reduce, shard_fn = ("c", "k", "t"), ("a",), synced
        return _partition.Rule(", ".join(ops) + " -> " + ", ".join(res),
                               need_replication=replicate, reduction=reduce,
                               factor_sizes=tuple((f, n) for f, n in sizes.items() if n != 1),
                               scratch=tuple(i for i, k in enumerate(outs) if k == WS),
                               shard_fn=shard_fn)

    return rule


def _local_params(avals, *, shape, **params):
    """The shard's NormShape: only the leading non-unit factor of x is sharded."""
    ratio = math.prod(shape.x_shape) // max(avals[0].shape[0], 1)
    if ratio == 1:
        return dict(params, shape=shape)
    lead = next(f for f in ("P", "A", "C", "K", "T") if getattr(shape, f) != 1)
    return dict(params, shape=dataclasses.replace(shape, **{lead: getattr(shape, lead) // ratio}))


for _name in ("norm_fwd", "norm_bwd", "norm_infer", "norm_infer_bwd"):  # the kernels
    _partition.partitionable(_PRIMS[_name], _partition_rule(_name), _local_params)
