"""Algorithm registry mirror and selection for convolution.

The registries live in C++ (``cc/conv/cpu_algorithms.h`` for the CPU, the CUDA module for the
GPU): each algorithm answers ``supports(problem) -> (ok, reason)`` and ``workspace_bytes``, and
declares whether it is deterministic and whether it uses tensor cores. This module asks the
compiled module of a platform for that list and chooses one algorithm per (problem, direction,
platform) at lowering time, so the choice is a static attribute of the custom call.
"""

from __future__ import annotations

import dataclasses
import os

from . import _ffi

DIRECTIONS = ("fwd", "bwd_data", "bwd_filter")


@dataclasses.dataclass(frozen=True)
class AlgoInfo:
    """One algorithm's answer for one problem."""

    name: str
    direction: str
    platform: str
    supported: bool
    reason: str
    workspace_bytes: int
    deterministic: bool
    tensor_cores: bool
    rank: int | None  # heuristic preference among the supported ones, 0 = first choice


def _num_threads(platform: str) -> int:
    return (os.cpu_count() or 1) if platform == "cpu" else 1


def conv_algorithms(spec, direction: str, in_dtype, out_dtype, platform: str) -> list[AlgoInfo]:
    """Every registered algorithm of `platform` for one conv problem and direction, with
    applicability, reason and workspace, ordered by the heuristic (unsupported ones last)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    module = _ffi.module_for(platform)
    raw = module.conv_algorithms(DIRECTIONS.index(direction), spec.encode(), str(in_dtype),
                                 str(out_dtype), _num_threads(platform))
    order = _heuristic_order(platform, direction, spec, [r for r in raw if r["supported"]])
    rank = {name: i for i, name in enumerate(order)}
    infos = [AlgoInfo(name=r["name"], direction=direction, platform=platform,
                      supported=r["supported"], reason=r["reason"],
                      workspace_bytes=int(r["workspace_bytes"]),
                      deterministic=r["deterministic"], tensor_cores=r["tensor_cores"],
                      rank=rank.get(r["name"])) for r in raw]
    return sorted(infos, key=lambda a: (a.rank is None, a.rank or 0, a.name))


def _heuristic_order(platform: str, direction: str, spec, supported: list[dict]) -> list[str]:
    """Names of the supported algorithms, best first.

    CPU: im2col + blocked GEMM wins as soon as there is a GEMM worth blocking; the direct loops
    only win on tiny problems, where packing costs more than it saves. GPU: the direct kernel is
    the only one until the fast algorithms land.
    """
    names = [r["name"] for r in supported]
    preference = {"cpu": ["im2col_gemm", "direct"], "cuda": ["direct"]}[platform]
    if platform == "cpu" and spec.macs() < 32 * 1024:
        preference = ["direct", "im2col_gemm"]
    ordered = [n for n in preference if n in names]
    return ordered + sorted(n for n in names if n not in ordered)


def select_conv_algorithm(spec, direction: str, in_dtype, out_dtype, platform: str,
                          forced: str | None) -> str:
    """The algorithm that runs: `forced` if given (an error if it cannot run the problem),
    otherwise the heuristic's first choice."""
    infos = conv_algorithms(spec, direction, in_dtype, out_dtype, platform)
    usable = [a.name for a in infos if a.supported]
    if forced is None:
        if not usable:  # every registry has an always-correct algorithm; this is a bug
            raise RuntimeError(f"no {platform} conv algorithm supports this {direction} problem")
        return usable[0]
    match = [a for a in infos if a.name == forced]
    if not match:
        raise ValueError(
            f"jaxdnn: unknown conv algorithm {forced!r} for {direction} on {platform}; "
            f"registered: {', '.join(a.name for a in infos)}")
    if not match[0].supported:
        raise ValueError(
            f"jaxdnn: conv algorithm {forced!r} cannot run this {direction} problem on "
            f"{platform}: {match[0].reason}. Algorithms that can: {', '.join(usable)}")
    return forced
