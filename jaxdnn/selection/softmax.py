"""The softmax family of selection: problems, the registry and find.

The primitives are ``jaxdnn.ops.softmax``'s; their lowering rules choose through
``core.choose_for_call``, which reads a call's problem with ``SoftmaxFamily.problem``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .. import _ffi
from ..ops.softmax import _row_sum, softmax_bwd_p, softmax_fwd_p
from . import core


@dataclasses.dataclass(frozen=True)
class SoftmaxProblem:
    """One softmax kernel call: `direction` "fwd" (op "softmax" / "log_softmax") or "bwd" (op
    = the backward map), over `rows` rows of `cols` elements."""

    direction: str
    op: str
    rows: int
    cols: int
    dtype: np.dtype
    forced_algo: str | None = None
    policy: tuple[bool, bool, int] = (False, False, -1)

    def describe(self) -> str:
        return f"softmax {self.direction:4s} {self.op} {self.rows}x{self.cols} {self.dtype.name}"

    def choose(self, platform: str) -> core.Choice:
        return core.choose(FAMILY, self, platform)


def softmax_algorithms(problem: SoftmaxProblem, platform: str | None = None):
    """"Get" for softmax: the registry of `platform` with applicability, in preference order."""
    platform = core.platform_name(platform)
    raw = _ffi.module_for(platform).softmax_algorithms(problem.rows, problem.cols,
                                                        str(problem.dtype))
    return core.registry_infos(raw, problem.direction, platform)


# Relative L2 error find allows against XLA's formula, by dtype.
_FIND_TOL = {np.dtype(jnp.float64): 1e-9, np.dtype(jnp.float32): 1e-5,
             np.dtype(jnp.float16): 1e-2, np.dtype(jnp.bfloat16): 1e-2}


def _reference(p: SoftmaxProblem, a, b):
    """XLA's computation of what the kernel computes (find's oracle), in float32 or wider."""
    wide = jnp.promote_types(p.dtype, jnp.float32)
    a32, b32 = a.astype(wide), b.astype(wide)
    if p.op == "softmax" and p.direction == "fwd":
        return jax.nn.softmax(a32, axis=-1)
    if p.op == "log_softmax":
        return jax.nn.log_softmax(a32, axis=-1)
    if p.op == "softmax":
        return a32 * (b32 - _row_sum(a32 * b32))
    if p.op == "log_softmax_vjp":
        return b32 - jnp.exp(a32) * _row_sum(b32)
    return b32 - _row_sum(jnp.exp(a32) * b32)


def _find(p: SoftmaxProblem, platform: str, repeats: int = 5) -> list[dict]:
    """Times every supported algorithm for `p` (wall clock over rotating inputs) after checking
    it against XLA; plain dicts as the tuning cache stores them."""
    dev = core.find_device(platform)
    rng = np.random.default_rng(0)
    shape = (p.rows, p.cols)
    rotate = 4
    inputs = [tuple(jax.device_put(rng.standard_normal(shape).astype(p.dtype), dev)
                    for _ in range(2)) for _ in range(rotate)]
    if p.direction == "bwd" and p.op.startswith("log"):  # y is a log-probability there
        inputs = [(jax.nn.log_softmax(a.astype(jnp.promote_types(p.dtype, jnp.float32)))
                   .astype(p.dtype), b) for a, b in inputs]

    def call(name):
        if p.direction == "fwd":
            return lambda a, b: softmax_fwd_p.bind(a, log=p.op == "log_softmax", algo=name,
                                                   policy=(False, False, -1))
        return lambda a, b: softmax_bwd_p.bind(a, b, kind=p.op, algo=name,
                                               policy=(False, False, -1))

    return core.find_checked(softmax_algorithms(p, platform), call, inputs,
                             _reference(p, *inputs[0]), _FIND_TOL[p.dtype], repeats)


class SoftmaxFamily:
    """Softmax's side of selection (core.Family): one problem per kernel call, its rows being
    every dimension but the last."""

    name = "softmax"
    primitives = (softmax_fwd_p, softmax_bwd_p)

    def problem(self, primitive, avals, params) -> SoftmaxProblem:
        if primitive is softmax_fwd_p:
            direction, op = "fwd", "log_softmax" if params["log"] else "softmax"
        else:
            direction, op = "bwd", params["kind"]
        shape = avals[0].shape
        return SoftmaxProblem(direction, op, int(np.prod(shape[:-1])), shape[-1],
                              np.dtype(avals[0].dtype), params["algo"], params["policy"])

    def algorithms(self, problem: SoftmaxProblem, platform: str) -> list[core.AlgoInfo]:
        return softmax_algorithms(problem, platform)

    def key(self, problem: SoftmaxProblem) -> str:
        return (f"softmax|{problem.direction}|{problem.op}|{problem.rows}x{problem.cols}|"
                f"{problem.dtype.name}")

    def find(self, problem: SoftmaxProblem, platform: str) -> list[dict]:
        return _find(problem, platform)


FAMILY = SoftmaxFamily()
core.register_family(FAMILY)
