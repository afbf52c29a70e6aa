"""Algorithm registry mirror and selection for convolution.

The registries live in C++ (``cc/conv/cpu_algorithms.h`` for the CPU, the CUDA module for the
GPU): each algorithm answers ``supports(problem) -> (ok, reason)`` and ``workspace_bytes``, and
declares whether it is deterministic and whether it uses tensor cores. This module asks the
compiled module of a platform for that list and chooses one algorithm per (problem, direction,
platform) at lowering time, so the choice is a static attribute of the custom call.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import warnings

import jax
import numpy as np

from . import _checks, _ffi

DIRECTIONS = ("fwd", "bwd_data", "bwd_filter")


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


def _num_threads(platform: str) -> int:
    return (os.cpu_count() or 1) if platform == "cpu" else 1


def _raw_conv_algorithms(spec, direction: str, in_dtype, out_dtype, platform: str, *,
                         names=(), variants=False) -> list[dict]:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    return _ffi.module_for(platform).conv_algorithms(
        DIRECTIONS.index(direction), spec.encode(), np.dtype(in_dtype).name,
        np.dtype(out_dtype).name, _num_threads(platform), list(names), variants)


def _conv_infos(raw: list[dict], direction: str, platform: str,
                rank: dict[str, int]) -> list[AlgoInfo]:
    return [AlgoInfo(name=r["name"], direction=direction, platform=platform,
                     supported=r["supported"], reason=r["reason"],
                     workspace_bytes=int(r["workspace_bytes"]),
                     deterministic=r["deterministic"], tensor_cores=r["tensor_cores"],
                     rank=rank.get(r["name"]), base=r["base"], default=r["default"])
            for r in raw]


def conv_algorithms(spec, direction: str, in_dtype, out_dtype, platform: str, *,
                    variants: bool = True) -> list[AlgoInfo]:
    """Every registered algorithm of `platform` for one conv problem and direction, with
    applicability, reason and workspace, ordered by the heuristic (unsupported ones last): each
    algorithm's default variant, and with `variants` every other variant that can run (after
    the defaults) and the options that cannot, with the reason."""
    raw = _raw_conv_algorithms(spec, direction, in_dtype, out_dtype, platform, variants=variants)
    defaults = {r["base"]: r["name"] for r in raw if r["supported"] and r["default"]}
    order = [defaults[b] for b in _heuristic_order(platform, direction, spec,
                                                   np.dtype(in_dtype), defaults)]
    order += [r["name"] for r in raw if r["supported"] and r["name"] not in order]
    rank = {name: i for i, name in enumerate(order)}
    infos = _conv_infos(raw, direction, platform, rank)
    return sorted(infos, key=lambda a: (a.rank is None, a.rank or 0, a.name))


def _heuristic_order(platform: str, direction: str, spec, dtype: np.dtype,
                     defaults: dict[str, str]) -> list[str]:
    """Base names of the supported algorithms, best first (`defaults`: each one's default
    variant, whose options say which fast paths apply).

    CPU (benchmarks/results/conv_cpu-*.md): im2col + blocked GEMM runs at 0.7-6x XLA:CPU on
    every ResNet-50 layer, so it wins whenever there is a GEMM worth blocking. It loses where
    the GEMM degenerates: tiny problems, where packing costs more than it saves, and depthwise
    convolutions (one input channel per group: a K=R*S GEMM per group), where the direct loops
    are as fast (both ~0.3 GFLOP/s).

    GPU: see _cuda_preference.
    """
    names = list(defaults)
    depthwise = spec.rhs_shape[3] == 1 and spec.groups > 1
    if platform == "cpu":
        preference = ["im2col_gemm", "direct"]
        if spec.macs() < 32 * 1024 or depthwise:
            preference = ["direct", "im2col_gemm"]
    else:
        preference = _cuda_preference(direction, spec, dtype, depthwise, defaults)
    ordered = [n for n in dict.fromkeys(preference) if n in names]  # first mention wins
    return ordered + sorted(n for n in names if n not in ordered)


def _cuda_preference(direction: str, spec, dtype: np.dtype, depthwise: bool,
                     defaults: dict[str, str]) -> list[str]:
    """GPU order, from benchmarks/results/conv_gpu-*.md (H200, ResNet-50 layers, N=64):
    - depthwise problems are memory-bound gathers: the register-tiled 3x3 stride-1 kernel
      where it applies, else the general depthwise kernel (1.1-24x XLA on the 7x7 layer);
    - float32 3x3 stride-1 layers without TF32 (precision HIGHEST): winograd_nonfused, whose
      F(4x4,3x3) does 4x fewer multiplies on the SIMT units, runs 37-68 TFLOP/s against 17-31
      for 3xTF32 on tensor cores (3 mmas per product); with TF32 allowed it still wins
      bwd_filter once the layer has 128+ channels (the GEMM's bwd_filter reads x^T mn-major,
      so it stays on mma.sync), but no longer fwd or bwd_data, which run TF32 on Hopper's
      wgmma at 72-123 TFLOP/s against winograd_nonfused's 48-76;
    - 7x7 stride-1 filters (5x5 in exact float32): the FFT, whose cost does not grow with the
      filter: 118-191 TFLOP/s-equivalent against 20-185 for the table-gather GEMMs (it
      computes in float32, so 16-bit inputs lose nothing); except where implicit_precomp_gemm
      reads A through TMA's im2col mode (its default variant has the im2col_tma option: a
      Hopper GPU, one group, a 2-D filter, 16-bit channels a multiple of 64 or TF32 fwd and
      bwd_data with a multiple of 32): there it runs 206-464 TFLOP/s in
      16 bits and 170-248 in TF32 against the FFT's 138-219;
    - otherwise the tensor-core implicit GEMM with precomputed offsets (fwd, bwd_data, and
      bwd_filter with its ordered split-K): the table lookup beats per-chunk index arithmetic
      by 10-35% on the 3x3 layers, and the split reduction fills the GPU for bwd_filter.
      On Hopper its A comes through TMA's im2col mode (16-bit and TF32 fwd and stride-1
      bwd_data): 188-206 TFLOP/s on l1's 3x3 against implicit_gemm's halo path's 159-176,
      so the halo path no longer leads fwd or bwd_data anywhere;
    - channels per group not a multiple of 8 (the 3-channel stem): implicit_gemm, which
      pads them to 8 in its workspace (fwd; bwd_filter with split-K, the filter being only a
      few output tiles), ahead of im2col_gemm's patch matrix; for bwd_data im2col_gemm, whose
      GEMM + col2im has T*R*S*Cg on the GEMM's N side (the implicit forms need Cg % 8);
    - 16-bit 3x3 stride-1 bwd_filter on 16x8-pixel tiles, any multiple of 64 channels:
      implicit_gemm_splitk, whose halo path (its default variant has the halo option: a
      Hopper GPU, 16-bit, one group, a 3x3 stride-1 2-D filter, both channel counts multiples
      of 64, 16x8 tiles at least 70% inside the image) keeps all nine taps' accumulators over
      one x halo and one dy tile, at 276-323 TFLOP/s against the tables' 126-209 (l1-l3);
    - the direct kernel last: no reuse.
    """
    if depthwise:
        return ["depthwise_3x3", "depthwise", "direct"]
    t, r, s, cg, _ = spec.rhs_shape
    stride1 = spec.stride == (1, 1, 1) and spec.rhs_dilation == (1, 1, 1) and \
        spec.lhs_dilation == (1, 1, 1)
    exact_f32 = dtype == np.float32 and not spec.tf32
    first = []
    wide_filter = direction == "bwd_filter" and cg >= 128
    if dtype == np.float32 and stride1 and (t, r, s) == (1, 3, 3) and (exact_f32 or wide_filter):
        first = ["winograd_nonfused"]
    elif stride1 and t == 1 and (min(r, s) >= 7 or (exact_f32 and min(r, s) >= 5)) and \
            not _has_option(defaults.get("implicit_precomp_gemm"), "im2col_tma"):
        first = ["fft", "fft_tiling"]
    elif direction == "bwd_filter" and _has_option(defaults.get("implicit_gemm_splitk"), "halo"):
        first = ["implicit_gemm_splitk"]
    elif cg % 8 != 0:
        first = {"fwd": ["implicit_gemm"], "bwd_data": ["im2col_gemm"],
                 "bwd_filter": ["implicit_gemm_splitk"]}[direction]
    return first + ["implicit_precomp_gemm", "implicit_gemm", "implicit_gemm_splitk",
                    "im2col_gemm", "winograd_nonfused", "winograd", "fft_tiling", "fft",
                    "implicit_gemm_splitk_atomic", "direct"]


def _has_option(name: str | None, option: str) -> bool:
    """Whether a concrete algorithm name (cc/conv/variant.h) carries `option`."""
    return name is not None and option in name.split(".")[1:]


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


def problem_key(spec, direction: str, in_dtype, out_dtype) -> str:
    return (f"{direction}|{np.dtype(in_dtype).name}|{np.dtype(out_dtype).name}|"
            + ",".join(str(v) for v in spec.encode()))


def _policy_exclusions(info: AlgoInfo, deterministic: bool, workspace_limit: int):
    if deterministic and not info.deterministic:
        return "not deterministic"
    if workspace_limit >= 0 and info.workspace_bytes > workspace_limit:
        return f"needs {info.workspace_bytes} workspace bytes > limit {workspace_limit}"
    return None


def select_conv_algorithm(spec, direction: str, in_dtype, out_dtype, platform: str,
                          forced: str | None, policy=(False, False, -1), finder=None) -> Choice:
    """The conv algorithm that runs (see select_algorithm): the concrete variant (every variant
    that can run when benchmark mode times them, else each algorithm's default; a forced name
    the listing lacks is described on its own)."""
    infos = conv_algorithms(spec, direction, in_dtype, out_dtype, platform, variants=policy[0])
    if forced is not None and not any(forced in (a.name, a.base) for a in infos):
        raw = _raw_conv_algorithms(spec, direction, in_dtype, out_dtype, platform, names=[forced])
        infos += _conv_infos(raw, direction, platform, {})
    return select_algorithm(
        "conv", direction, infos, platform, forced, policy,
        problem_key(spec, direction, in_dtype, out_dtype),
        None if finder is None else (lambda: finder(spec, direction, in_dtype, out_dtype,
                                                    platform)))


def select_algorithm(op: str, direction: str, infos: list[AlgoInfo], platform: str,
                     forced: str | None, policy=(False, False, -1), key: str | None = None,
                     find=None) -> Choice:
    """The algorithm that runs, for any op with a registry (`infos`: the registry's answers
    for the problem, supported ones first in heuristic order).

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
        from . import _config, _version, tuning

        cache = tuning.cache_for(_config.settings().cache_dir, platform, _version.__version__)
        results, reason = cache.get(key), "benchmark (cached)"
        if results is not None and not _valid_results(results):
            warnings.warn(f"jaxdnn: tuning cache {cache.path} has a malformed entry for {key!r}; "
                          "measuring again", RuntimeWarning, stacklevel=2)
            results = None
        if results is None:
            results, reason = find(), "benchmark (measured)"
            cache.put(key, results)
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
    repeats = _checks.positive_int(repeats, "repeats", "jaxdnn.algo.time_jitted")
    many = jax.jit(lambda ins: [fn(*i) for i in ins])
    jax.block_until_ready(many(inputs))
    times = []
    for _ in range(repeats):
        t0 = clock()
        jax.block_until_ready(many(inputs))
        times.append((clock() - t0) / len(inputs))
    return float(np.median(times))


def registry_infos(raw: list[dict], direction: str, platform: str) -> list[AlgoInfo]:
    """AlgoInfo from a C++ registry's dicts that are already in preference order."""
    supported = [r for r in raw if r["supported"]]
    rank = {r["name"]: i for i, r in enumerate(supported)}
    infos = [AlgoInfo(name=r["name"], direction=direction, platform=platform,
                      supported=r["supported"], reason=r["reason"],
                      workspace_bytes=int(r["workspace_bytes"]),
                      deterministic=r["deterministic"], tensor_cores=r["tensor_cores"],
                      rank=rank.get(r["name"]), base=r["name"]) for r in raw]
    return sorted(infos, key=lambda a: (a.rank is None, a.rank or 0))
