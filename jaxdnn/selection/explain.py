"""What runs: the jaxdnn calls of a traced function, each with the algorithm it lowers to.

The walk covers every registered family (core.register_family) and descends into nested
jaxprs (pjit, custom_jvp / custom_vjp, scan, while, cond, remat, ...): any equation parameter
that is a jaxpr or a closed jaxpr, or a sequence of them.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax

from . import core


def problem_from_eqn(eqn):
    """The problem of a jaxpr equation that calls a registered family's primitive, or None
    for any other equation."""
    family = core.family_of(eqn.primitive)
    if family is None:
        return None
    return family.problem(eqn.primitive, [v.aval for v in eqn.invars], eqn.params)


def _walk_jaxpr(jaxpr, found: list):
    for eqn in jaxpr.eqns:
        problem = problem_from_eqn(eqn)
        if problem is not None:
            found.append((core.family_of(eqn.primitive), problem))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):  # ClosedJaxpr
                    _walk_jaxpr(sub.jaxpr, found)
                elif hasattr(sub, "eqns"):  # Jaxpr
                    _walk_jaxpr(sub, found)


def traced_problems(fn, args, kwargs) -> list[tuple[core.Family, core.Problem]]:
    """(family, problem) of every call of a registered family's primitive in
    ``fn(*args, **kwargs)``, in program order, found by tracing it."""
    found: list = []
    _walk_jaxpr(jax.make_jaxpr(partial(fn, **kwargs))(*args).jaxpr, found)
    return found


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What one jaxdnn kernel call (e.g. a convolution direction or a softmax) in a traced
    function runs, and why."""

    direction: str
    problem: object  # the family's problem, e.g. a ConvProblem or a NormProblem
    algo: str
    reason: str
    workspace_bytes: int

    def summary(self) -> str:
        return self.problem.describe()


class Explained(list):
    """A list of Explanation with a readable table as its str()."""

    def __str__(self) -> str:
        lines = [f"{'algorithm':22s} {'workspace':>10s}  problem / reason"]
        for e in self:
            lines.append(f"{e.algo:22s} {e.workspace_bytes:10d}  {e.summary()}\n"
                         f"{'':34s}{e.reason}")
        return "\n".join(lines)


def explain(fn, *args, platform: str | None = None, **kwargs) -> Explained:
    """Lists every jaxdnn kernel call in ``fn(*args, **kwargs)`` (traced as ``jax.jit``
    would): convolutions, softmax, norms and pooling, with the algorithm that runs on
    `platform`, why (heuristic, cached or measured benchmark, forced, and what the
    deterministic / workspace policy excluded) and its workspace."""
    plat = core.platform_name(platform)
    out = Explained()
    for family, p in traced_problems(fn, args, kwargs):
        choice = core.choose(family, p, plat)
        out.append(Explanation(p.direction, p, choice.name, choice.describe(),
                               choice.workspace_bytes))
    return out
