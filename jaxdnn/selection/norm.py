"""The norm family of selection: problems, the registry and find.

The primitives are ``jaxdnn.ops.norm``'s kernel primitives (training forward, inference
forward and the two backwards); their lowering rules choose through ``core.choose_for_call``,
which reads a call's problem with ``NormFamily.problem``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .. import _ffi
from ..ops.norm import (AFF, S, X, NormShape, _affine_b, _bwd_ref, _normalised, _relu_mask,
                        _size, _stat_b, _x5, norm_bwd_p, norm_fwd_p, norm_infer_bwd_p,
                        norm_infer_p, stat_dtype)
from . import core


@dataclasses.dataclass(frozen=True)
class NormProblem:
    """One norm kernel call: `direction` "fwd" (training forward), "infer" (inference forward)
    or "bwd" (backward, training or inference) on the canonical `shape`, x of `dtype`; `relu`
    and `residual` are its fused epilogue (cc/norm/norm.h Epilogue; for "bwd", `residual`
    means the call keeps one for relu's mask)."""

    direction: str
    shape: NormShape
    dtype: np.dtype
    centered: bool = True
    forced_algo: str | None = None
    policy: tuple[bool, bool, int] = (False, False, -1)
    relu: bool = False
    residual: bool = False

    @property
    def dims(self) -> list[int]:
        s = self.shape
        return [s.P, s.A, s.C, s.K, s.T, s.Q]

    def describe(self) -> str:
        return (f"norm {self.direction:5s} {'x'.join(map(str, self.dims))} {self.dtype.name}"
                + ("" if self.centered else " rms") + (" +residual" if self.residual else "")
                + (" +relu" if self.relu else ""))

    def choose(self, platform: str) -> core.Choice:
        return core.choose(FAMILY, self, platform)


def _registry(problem: NormProblem, platform: str) -> list[dict]:
    return _ffi.module_for(platform).norm_algorithms(problem.direction, problem.dims,
                                                     problem.dtype.name, problem.centered,
                                                     problem.relu, problem.residual)


def norm_algorithms(problem: NormProblem, platform: str | None = None):
    """"Get" for norm: the registry of `platform` with applicability, in preference order."""
    platform = core.platform_name(platform)
    return core.registry_infos(_registry(problem, platform), problem.direction, platform)


# Relative L2 error find allows against the jnp reference, by dtype; find's eps.
_FIND_TOL = {np.dtype(jnp.float64): 1e-9, np.dtype(jnp.float32): 1e-4,
             np.dtype(jnp.float16): 2e-2, np.dtype(jnp.bfloat16): 2e-2}
_FIND_EPS = 1e-5


def _find_inputs(p: NormProblem, rng, dev):
    """Operands of the problem's primitive (find's): fwd x, scale, bias, residual; infer x,
    scale, bias, mean, var, residual; bwd dy, the (zero) statistics cotangents, x, scale, mean,
    var, bias, residual (the epilogue's operands empty where the problem has none)."""
    s, sd = p.shape, stat_dtype(p.dtype)
    n_x, n_s, n_a = _size(X, s), _size(S, s), _size(AFF, s)
    x = rng.standard_normal(n_x).astype(p.dtype)
    scale, bias = (rng.standard_normal(n_a).astype(sd) for _ in range(2))
    mean = rng.standard_normal(n_s).astype(sd) * 0.1
    var = rng.uniform(0.5, 2.0, n_s).astype(sd)
    res = (rng.standard_normal(n_x) if p.residual else np.zeros((0,))).astype(p.dtype)
    empty = np.zeros((0,), sd)
    if p.direction == "fwd":
        ops = (x, scale, bias, res)
    elif p.direction == "infer":
        ops = (x, scale, bias, mean, var, res)
    else:
        ops = (rng.standard_normal(n_x).astype(p.dtype), empty, empty, x, scale, mean, var,
               bias if p.relu else empty, res)
    return tuple(jax.device_put(o, dev) for o in ops)


def _find_call(p: NormProblem, name: str):
    """The problem's kernel primitive with algorithm `name`, returning its first result."""
    params = dict(shape=p.shape, eps=_FIND_EPS, relu=p.relu, algo=name,
                  policy=(False, False, -1))
    if p.direction == "infer":
        return lambda *ops: norm_infer_p.bind(*ops, **params)
    prim = norm_fwd_p if p.direction == "fwd" else norm_bwd_p
    return lambda *ops: prim.bind(*ops, centered=p.centered, **params)[0]


def _find_reference(p: NormProblem, ops):
    """y (fwd, infer) or dx (bwd) by the jnp references, in the statistics dtype."""
    s = p.shape
    if p.direction == "bwd":
        return _bwd_ref(*ops, shape=s, eps=_FIND_EPS, centered=p.centered, relu=p.relu)[0]
    x, scale, bias = ops[:3]
    res = ops[-1]
    if p.direction == "infer":
        mean, var = ops[3:5]
    else:
        x5 = _x5(s, x, stat_dtype(p.dtype))
        mean = (x5.mean(axis=(1, 3, 4)).reshape(-1) if p.centered
                else jnp.zeros(_size(S, s), x5.dtype))
        var = ((x5 - _stat_b(s, mean)) ** 2).mean(axis=(1, 3, 4)).reshape(-1)
    _, _, xhat = _normalised(s, x, mean, var, _FIND_EPS)
    z = xhat * _affine_b(s, scale) + _affine_b(s, bias)
    if res.size:
        z = z + _x5(s, res, z.dtype)
    return (_relu_mask(s, xhat, scale, bias, res, z) if p.relu else z).reshape(-1)


def _find(p: NormProblem, platform: str, repeats: int = 5) -> list[dict]:
    """Times every supported algorithm for `p` (wall clock over rotating inputs) after checking
    it against the jnp reference; plain dicts as the tuning cache stores them."""
    dev = core.find_device(platform)
    rng = np.random.default_rng(0)
    inputs = [_find_inputs(p, rng, dev) for _ in range(4)]
    return core.find_checked(norm_algorithms(p, platform), lambda name: _find_call(p, name),
                             inputs, _find_reference(p, inputs[0]), _FIND_TOL[p.dtype], repeats)


# The registry pass of each kernel primitive.
_PASS = {norm_fwd_p: "fwd", norm_infer_p: "infer", norm_bwd_p: "bwd", norm_infer_bwd_p: "bwd"}


class NormFamily:
    """Norm's side of selection (core.Family): one problem per kernel call, on the canonical
    shape the call carries; the inference primitives are always centered."""

    name = "norm"
    primitives = tuple(_PASS)

    def problem(self, primitive, avals, params) -> NormProblem:
        # (every kernel primitive's last operand is its residual, or the saved one: empty for
        # none)
        return NormProblem(_PASS[primitive], params["shape"], np.dtype(avals[0].dtype),
                           params.get("centered", True), params["algo"], params["policy"],
                           params["relu"], avals[-1].shape[0] > 0)

    def algorithms(self, problem: NormProblem, platform: str) -> list[core.AlgoInfo]:
        return norm_algorithms(problem, platform)

    def key(self, problem: NormProblem) -> str:
        return (f"norm|{problem.direction}|{','.join(map(str, problem.dims))}|"
                f"{problem.dtype.name}|{int(problem.centered)}"
                + (f"|epi{int(problem.relu)}{int(problem.residual)}"
                   if problem.relu or problem.residual else ""))

    def find(self, problem: NormProblem, platform: str) -> list[dict]:
        return _find(problem, platform)

    def two_calls(self, problem: NormProblem, platform: str, name: str) -> bool:
        """Whether training forward algorithm `name` runs as two calls (statistics, apply)."""
        return next(r["two_calls"] for r in _registry(problem, platform) if r["name"] == name)


FAMILY = NormFamily()
core.register_family(FAMILY)
