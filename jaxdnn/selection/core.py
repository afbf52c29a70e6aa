"""What selection shares across op families: the registry's answers, the choice and its
policy, find's timer, and the registry of families.

The algorithm registries live in C++ (e.g. ``cc/conv/cpu_algorithms.h`` for the CPU, the CUDA
module for the GPU): each algorithm answers ``supports(problem) -> (ok, reason)`` and
``workspace_bytes``, and declares whether it is deterministic and whether it uses tensor cores.
A family (``Family``) turns one call of its primitives into a problem, asks the compiled module
of a platform for its registry in preference order, and measures its algorithms; the lowering
rule of each primitive chooses one algorithm per (problem, platform) at lowering time
(``choose_for_call``), so the choice is a static attribute of the custom call, and
``jaxdnn.explain`` reports the same choice for every call of a traced function.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from typing import Any, Protocol

import jax
import numpy as np

from .. import _checks, _config, _version
from . import cache


@dataclasses.dataclass(frozen=True)
class AlgoInfo:
    """One algorithm's answer for one problem.

    `name` is what runs: for a conv algorithm with kernel variants, the concrete variant
    (``implicit_precomp_gemm.wgmma.im2col_tma.tma_b.128x128.ws``: its base name, then the options
    that pin each choice, cc/conv/variant.h), which a caller may pass as `algo`; `base` is the
    registered algorithm and `default` says whether this is the variant the base name runs."""

    name: str
    direction: str
    platform: str
    supported: bool
    reason: str
    workspace_bytes: int
    deterministic: bool
    tensor_cores: bool
    rank: int | None  # heuristic preference among the supported ones, 0 = first choice
    base: str = ""
    default: bool = True


def platform_name(platform: str | None) -> str:
    """The registry platform of a user's `platform` argument: None means jax's default
    backend, and jax's "gpu" is our "cuda"."""
    platform = platform or jax.default_backend()
    return {"gpu": "cuda"}.get(platform, platform)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The algorithm that runs for one (problem, direction, platform), and why."""

    name: str
    reason: str  # "forced", "heuristic", "benchmark (cached)" or "benchmark (measured)"
    workspace_bytes: int
    excluded: tuple[tuple[str, str], ...] = ()  # (algorithm, why) removed by the policy

    def describe(self) -> str:
        text = self.reason
        if self.excluded:
            text += "; excluded " + ", ".join(f"{n} ({why})" for n, why in self.excluded)
        return text


class Problem(Protocol):
    """What selection reads from every family's problem descriptor."""

    direction: str  # the kernel's direction, e.g. "fwd"
    forced_algo: str | None  # the algorithm forced by the caller; None: chosen by the library
    policy: tuple[bool, bool, int]  # (benchmark, deterministic, workspace_limit or -1)

    def describe(self) -> str:
        """One line for explain's table."""


class Family(Protocol):
    """One op family's side of selection."""

    name: str  # names the family in messages and its tuning-cache file
    primitives: tuple  # the primitives whose calls it describes

    def problem(self, primitive, avals, params) -> Problem:
        """The problem that one call of `primitive` (one of `primitives`) solves, from its
        operands' avals and its params: a jaxpr equation's or a lowering rule's."""

    def algorithms(self, problem, platform: str) -> list[AlgoInfo]:
        """The registry of `platform` for `problem`: every algorithm with applicability,
        supported ones first in preference order."""

    def key(self, problem) -> str:
        """The problem's key in the family's tuning cache."""

    def find(self, problem, platform: str) -> list[dict]:
        """Benchmark mode's measurements: every algorithm of the registry, run, checked and
        timed on the current device of `platform`, as the tuning cache stores them (dicts
        with a str "name", a bool "ok" and a float "time_s", and more)."""


_families: dict[str, Family] = {}
_by_primitive: dict[Any, Family] = {}


def register_family(family: Family) -> None:
    """Makes `family` the one that lowering rules and explain consult for its primitives."""
    if family.name in _families:
        raise ValueError(f"jaxdnn: a selection family named {family.name!r} is registered")
    _families[family.name] = family
    for prim in family.primitives:
        _by_primitive[prim] = family


def family_of(primitive) -> Family | None:
    """The registered family of `primitive`, or None for a primitive no family describes."""
    return _by_primitive.get(primitive)


def choose(family: Family, problem: Problem, platform: str) -> Choice:
    """The algorithm that runs for `problem` of `family` on `platform`, and why."""
    return select_algorithm(family.name, problem.direction, family.algorithms(problem, platform),
                            platform, problem.forced_algo, problem.policy, family.key(problem),
                            lambda: family.find(problem, platform))


def choose_for_call(primitive, avals, params, platform: str) -> Choice:
    """The algorithm of one call of a registered family's primitive, for its lowering rule:
    the problem is read as explain reads it, so explain names what lowers."""
    family = _by_primitive[primitive]
    return choose(family, family.problem(primitive, avals, params), platform)


def _policy_exclusions(info: AlgoInfo, deterministic: bool, workspace_limit: int):
    if deterministic and not info.deterministic:
        return "not deterministic"
    if workspace_limit >= 0 and info.workspace_bytes > workspace_limit:
        return f"needs {info.workspace_bytes} workspace bytes > limit {workspace_limit}"
    return None


def select_algorithm(op: str, direction: str, infos: list[AlgoInfo], platform: str,
                     forced: str | None, policy=(False, False, -1), key: str | None = None,
                     find=None) -> Choice:
    """The algorithm that runs, for any op with a registry (`infos`: the registry's answers
    for the problem, supported ones first in heuristic order). `op` names the family in
    messages and its tuning-cache file.

    `policy` is (benchmark, deterministic, workspace_limit or -1) from jaxdnn.config at trace
    time. A forced algorithm must support the problem and satisfy the policy. Otherwise the
    policy filters the supported algorithms, and the choice is the fastest measured one in
    benchmark mode (``find()`` times them; results are cached on disk under `key`) or the
    heuristic's best.
    """
    benchmark, deterministic, workspace_limit = policy
    usable = [a for a in infos if a.supported]
    if forced is not None:  # a name, or the base name of a default variant
        match = [a for a in infos if a.name == forced] or \
            [a for a in infos if a.base == forced and a.default]
        if not match or not match[0].base:
            known = ", ".join(dict.fromkeys(a.base for a in infos if a.base))
            detail = f" ({match[0].reason})" if match else ""
            raise ValueError(
                f"jaxdnn: unknown {op} algorithm {forced!r} for {direction} on {platform}"
                f"{detail}; registered: {known}")
        if not match[0].supported:
            raise ValueError(
                f"jaxdnn: {op} algorithm {forced!r} cannot run this {direction} problem on "
                f"{platform}: {match[0].reason}. Algorithms that can: "
                f"{', '.join(a.name for a in usable)}")
        why = _policy_exclusions(match[0], deterministic, workspace_limit)
        if why:
            raise ValueError(f"jaxdnn: {op} algorithm {forced!r} is excluded by "
                             f"jaxdnn.config: {why}")
        return Choice(match[0].name, "forced", match[0].workspace_bytes)

    excluded, candidates = [], []
    for a in usable:
        why = _policy_exclusions(a, deterministic, workspace_limit)
        (excluded.append((a.name, why)) if why else candidates.append(a))
    if not candidates:  # every registry has a deterministic, workspace-free fallback
        raise RuntimeError(f"no {platform} {op} algorithm satisfies the policy for this "
                           f"{direction} problem (excluded: {excluded})")
    if benchmark and find is not None and key is not None and len(candidates) > 1:
        tuning = cache.cache_for(_config.settings().cache_dir, op, platform, _version.__version__)
        results, reason = tuning.get(key), "benchmark (cached)"
        if results is not None and not _valid_results(results):
            warnings.warn(f"jaxdnn: tuning cache {tuning.path} has a malformed entry for "
                          f"{key!r}; measuring again", RuntimeWarning, stacklevel=2)
            results = None
        if results is None:
            results, reason = find(), "benchmark (measured)"
            tuning.put(key, results)
        allowed = {a.name: a for a in candidates}
        timed = sorted((r for r in results if r["ok"] and r["name"] in allowed),
                       key=lambda r: r["time_s"])
        if timed:
            best = allowed[timed[0]["name"]]
            return Choice(best.name, reason, best.workspace_bytes, tuple(excluded))
    best = candidates[0]  # infos list supported algorithms in heuristic order
    return Choice(best.name, "heuristic", best.workspace_bytes, tuple(excluded))


def _valid_results(results) -> bool:
    """Whether a cached entry is a list of find results as selection reads them: dicts with a
    str "name", a bool "ok" and a real "time_s", finite where "ok" is true."""
    if not isinstance(results, list):
        return False
    for r in results:
        if not isinstance(r, dict):
            return False
        name, ok, t = r.get("name"), r.get("ok"), r.get("time_s")
        if (not isinstance(name, str) or not isinstance(ok, bool)
                or not isinstance(t, (int, float)) or isinstance(t, bool)
                or (ok and not math.isfinite(t))):
            return False
    return True


def time_jitted(fn, inputs, repeats: int, clock=time.perf_counter) -> float:
    """Median seconds per call of `fn` over the rotating `inputs` (back-to-back jitted calls,
    synchronised once per batch), by `clock`: wall time by default (the timer find uses off
    the GPU), or e.g. time.process_time for CPU time on a shared machine."""
    repeats = _checks.positive_int(repeats, "repeats", "jaxdnn.selection.core.time_jitted")
    many = jax.jit(lambda ins: [fn(*i) for i in ins])
    jax.block_until_ready(many(inputs))
    times = []
    for _ in range(repeats):
        t0 = clock()
        jax.block_until_ready(many(inputs))
        times.append((clock() - t0) / len(inputs))
    return float(np.median(times))


def find_device(platform: str):
    """The current device of registry platform `platform`, where find runs."""
    return jax.devices("gpu" if platform == "cuda" else "cpu")[0]


def find_checked(infos: list[AlgoInfo], call, inputs, ref, tol: float,
                 repeats: int) -> list[dict]:
    """Find for a family whose kernels are checked against a reference and timed by the wall
    clock: every algorithm of `infos` (the registry's listing), as the tuning cache stores it,
    the fastest first. A supported algorithm runs as ``call(name)(*inputs[0])``, must be within
    relative L2 error `tol` of `ref`, and is timed over the rotating `inputs` (time_jitted)."""
    ref = np.asarray(ref, np.float64)
    results = []
    for info in infos:
        base = dict(name=info.name, workspace_bytes=0, deterministic=info.deterministic)
        if not info.supported:
            results.append(dict(base, ok=False, time_s=float("inf"), error=float("nan"),
                                reason=info.reason))
            continue
        fn = call(info.name)
        out = np.asarray(jax.jit(fn)(*inputs[0]), np.float64)
        err = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))
        if not err <= tol:
            results.append(dict(base, ok=False, time_s=float("inf"), error=err,
                                reason=f"wrong result: relative error {err:.2e}"))
            continue
        results.append(dict(base, ok=True, time_s=time_jitted(fn, inputs, repeats), error=err,
                            reason=""))
    return sorted(results, key=lambda r: (not r["ok"], r["time_s"], r["name"]))


def infos_from_raw(raw: list[dict], direction: str, platform: str,
                   rank: dict[str, int]) -> list[AlgoInfo]:
    """AlgoInfo from a C++ registry's dicts, ranked by `rank` (name -> preference); a dict
    without "base"/"default" names an algorithm without variants."""
    return [AlgoInfo(name=r["name"], direction=direction, platform=platform,
                     supported=r["supported"], reason=r["reason"],
                     workspace_bytes=int(r["workspace_bytes"]),
                     deterministic=r["deterministic"], tensor_cores=r["tensor_cores"],
                     rank=rank.get(r["name"]), base=r.get("base", r["name"]),
                     default=r.get("default", True))
            for r in raw]


def registry_infos(raw: list[dict], direction: str, platform: str) -> list[AlgoInfo]:
    """AlgoInfo from a C++ registry's dicts that are already in preference order."""
    supported = [r for r in raw if r["supported"]]
    rank = {r["name"]: i for i, r in enumerate(supported)}
    infos = infos_from_raw(raw, direction, platform, rank)
    return sorted(infos, key=lambda a: (a.rank is None, a.rank or 0))
