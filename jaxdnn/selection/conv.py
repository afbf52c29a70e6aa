"""The convolution family of selection: problems, the registry with the heuristic order,
find, and the convolutions of a traced function.

The primitives are ``jaxdnn.ops.conv``'s; their lowering rules choose through
``core.choose_for_call``, which reads a call's problem with ``ConvFamily.problem``.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks, _ffi
from ..ops.conv import _PRIMS, DIRECTIONS, ConvSpec, _bind, _shapes, conv, conv_fused_p
from . import core, explain


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    """One convolution as the kernels see it: direction, canonical spec, dtypes, the algorithm
    forced by the caller (None: chosen by the library) and the jaxdnn.config policy in force
    when it was traced, as (benchmark, deterministic, workspace_limit or -1). `epilogue` names
    the fused forward's epilogue ("bias+gelu+residual"; empty for a plain call): it is what
    the call runs after the algorithm, not part of the choice (the tuning cache's key leaves it
    out)."""

    direction: str
    spec: ConvSpec
    dtype: np.dtype
    out_dtype: np.dtype
    forced_algo: str | None = None
    policy: tuple[bool, bool, int] = (False, False, -1)
    epilogue: str = ""

    def describe(self) -> str:
        s = self.spec
        return (f"conv {self.direction:10s} x{s.lhs_shape} w{s.rhs_shape} stride{s.stride} "
                f"groups={s.groups} {self.dtype.name}->{self.out_dtype.name}"
                + (" tf32" if s.tf32 else "") + (f" fused {self.epilogue}" if self.epilogue
                                                  else ""))

    def choose(self, platform: str) -> core.Choice:
        return core.choose(FAMILY, self, platform)


def conv_problems(fn, *args, **kwargs) -> list[ConvProblem]:
    """Every jaxdnn convolution that ``fn(*args, **kwargs)`` performs (forward and, if `fn`
    differentiates, backward directions), found by tracing it."""
    return [p for family, p in explain.traced_problems(fn, args, kwargs) if family is FAMILY]


def conv_problem(x, w, **conv_kwargs) -> ConvProblem:
    """The forward problem of ``jaxdnn.conv(x, w, **conv_kwargs)``; x and w may be arrays or
    ``jax.ShapeDtypeStruct``s."""
    (problem,) = conv_problems(functools.partial(conv, **conv_kwargs), x, w)
    return problem


def _num_threads(platform: str) -> int:
    return (os.cpu_count() or 1) if platform == "cpu" else 1


def _raw_algorithms(problem: ConvProblem, platform: str, *, names=(), variants=False):
    if problem.direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {problem.direction!r}")
    return _ffi.module_for(platform).conv_algorithms(
        DIRECTIONS.index(problem.direction), problem.spec.encode(), np.dtype(problem.dtype).name,
        np.dtype(problem.out_dtype).name, _num_threads(platform), list(names), variants)


def conv_algorithms(problem: ConvProblem, platform: str | None = None, *,
                    variants: bool = True) -> list[core.AlgoInfo]:
    """"Get": every registered algorithm for `problem` on `platform` ("cpu" or "cuda";
    default: the default backend), with applicability, reason, workspace, determinism,
    tensor-core use and the heuristic's rank (0 = the heuristic's choice). Each algorithm's
    default variant comes first, in the heuristic's order; with `variants`, then every other
    variant that can run (cc/conv/variant.h), and the options that cannot, with the reason.
    Unsupported names come last."""
    platform = core.platform_name(platform)
    raw = _raw_algorithms(problem, platform, variants=variants)
    defaults = {r["base"]: r["name"] for r in raw if r["supported"] and r["default"]}
    order = [defaults[b] for b in _heuristic_order(platform, problem.direction, problem.spec,
                                                   np.dtype(problem.dtype), defaults)]
    order += [r["name"] for r in raw if r["supported"] and r["name"] not in order]
    rank = {name: i for i, name in enumerate(order)}
    infos = core.infos_from_raw(raw, problem.direction, platform, rank)
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
class FindResult:
    """One algorithm's measurement by :func:`find_conv_algorithms`."""

    name: str
    time_s: float  # median seconds per call; inf when it did not run or was rejected
    ok: bool       # ran and agreed with the oracle
    error: float   # relative L2 error against the oracle (nan when it did not run)
    reason: str    # why it was rejected or not run
    workspace_bytes: int
    deterministic: bool
    timer: str = ""  # "cuda events" or "wall clock"; empty when it did not run


# Relative L2 error an algorithm may show against the direct oracle, by output dtype.
_FIND_TOL = {np.dtype(jnp.float64): 1e-9, np.dtype(jnp.float32): 1e-4,
             np.dtype(jnp.float16): 2e-2, np.dtype(jnp.bfloat16): 2e-2}
_FIND_TOL_TF32 = 5e-3  # float32 problems whose precision allows TF32


# Relative L2 error an algorithm may show against the direct oracle, by output dtype.
_FIND_TOL = {np.dtype(jnp.float64): 1e-9, np.dtype(jnp.float32): 1e-4,
             np.dtype(jnp.float16): 2e-2, np.dtype(jnp.bfloat16): 2e-2}
_FIND_TOL_TF32 = 5e-3  # float32 problems whose precision allows TF32


def _run_algorithm(name, direction, spec, out_dtype):
    """A jitted function running one direction of `spec` with algorithm `name` forced (find's
    unit of work; tests replace it to inject a wrong algorithm)."""
    forced = tuple(name if d == direction else None for d in DIRECTIONS)
    return jax.jit(lambda a, b: _bind(direction, a, b, spec=spec, algo=forced,
                                      out_dtype=out_dtype, policy=(False, False, -1)))


def _random_operand(rng, shape, dtype):
    """Normal values for float operands, any value of the dtype for integer ones."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def _rel_l2(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    den = np.linalg.norm(ref)
    num = np.linalg.norm(out - ref)
    return float(num / den) if den > 0 else float(num)


def _find(problem: ConvProblem, platform: str, repeats: int) -> list[FindResult]:
    direction, spec, dtype, out_dtype = (problem.direction, problem.spec, problem.dtype,
                                         problem.out_dtype)
    dev = core.find_device(platform)
    a_shape, b_shape, _ = _shapes(direction, spec)
    rng = np.random.default_rng(0)
    nbytes = (np.prod(a_shape) + np.prod(b_shape)) * np.dtype(dtype).itemsize
    rotate = int(min(8, max(2, 3 * (60 << 20) // max(nbytes, 1)))) if platform == "cuda" else 2
    inputs = [tuple(jax.device_put(_random_operand(rng, s, dtype), dev)
                    for s in (a_shape, b_shape)) for _ in range(rotate)]
    ref = _run_algorithm("direct", direction, spec, out_dtype)(*inputs[0])
    results = []
    for info in conv_algorithms(problem, platform):
        base = dict(name=info.name, workspace_bytes=info.workspace_bytes,
                    deterministic=info.deterministic)
        if not info.supported:
            results.append(FindResult(time_s=float("inf"), ok=False, error=float("nan"),
                                      reason=info.reason, **base))
            continue
        fn = _run_algorithm(info.name, direction, spec, out_dtype)
        err = _rel_l2(fn(*inputs[0]), ref)
        tol = (0.0 if np.issubdtype(out_dtype, np.integer) else  # integer sums are exact
               _FIND_TOL_TF32 if spec.tf32 else _FIND_TOL[np.dtype(out_dtype)])
        if not err <= tol:
            results.append(FindResult(time_s=float("inf"), ok=False, error=err,
                                      reason=f"wrong result: relative error {err:.2e}", **base))
            continue
        seconds, timer = _time_algorithm(info.name, fn, problem, platform, inputs, repeats)
        results.append(FindResult(time_s=seconds, ok=True, error=err, reason="", timer=timer,
                                  **base))
    return sorted(results, key=lambda r: (not r.ok, r.time_s, r.name))


def _time_algorithm(name, fn, problem: ConvProblem, platform, inputs, repeats):
    """(median seconds per call, how it was timed). On the GPU: device time between CUDA
    events, on a stream and buffers of the algorithm's own (jaxdnn._cuda.time_conv_algorithm),
    as cuDNN's find does. Elsewhere, or when there is no free memory for those buffers: wall
    clock of back-to-back jitted calls over rotating inputs."""
    if platform == "cuda":
        try:
            ms = _ffi.module_for("cuda").time_conv_algorithm(
                DIRECTIONS.index(problem.direction), problem.spec.encode(),
                str(np.dtype(problem.dtype)), str(np.dtype(problem.out_dtype)), name, repeats)
            return float(np.median(ms)) / 1e3, "cuda events"
        except RuntimeError:
            pass
    return core.time_jitted(fn, inputs, repeats), "wall clock"


def find_conv_algorithms(problem: ConvProblem, platform: str | None = None, *,
                         repeats: int = 5) -> list[FindResult]:
    """"Find": runs every applicable algorithm for `problem` on the current device of
    `platform`, checks each result against the direct oracle (rejecting wrong answers) and
    times it (median of `repeats` runs over rotating inputs); fastest first."""
    repeats = _checks.positive_int(repeats, "repeats", "jaxdnn.find_conv_algorithms")
    return _find(problem, core.platform_name(platform), repeats)


class ConvFamily:
    """Convolution's side of selection (core.Family): one problem per direction's primitive.
    The fused forward (conv_fused_p) is a forward problem: every forward algorithm runs it (its
    epilogue is a pass after the algorithm's kernels), so it takes the forward's choice."""

    name = "conv"
    primitives = (*_PRIMS.values(), conv_fused_p)

    def problem(self, primitive, avals, params) -> ConvProblem:
        direction, epilogue = "fwd", ""
        if primitive is conv_fused_p:
            _, _, bias, res = avals
            parts = (["bias"] if bias.size else []) + [params["act"] or ""] + (
                ["residual"] if res.size else [])
            epilogue = "+".join(p for p in parts if p)
        else:
            direction = next(d for d, prim in _PRIMS.items() if prim is primitive)
        return ConvProblem(direction, params["spec"], np.dtype(avals[0].dtype),
                           np.dtype(params["out_dtype"]),
                           params["algo"][DIRECTIONS.index(direction)], params["policy"],
                           epilogue)

    def algorithms(self, problem: ConvProblem, platform: str) -> list[core.AlgoInfo]:
        """Each algorithm's default variant, and every variant in benchmark mode, which times
        them; a forced name the listing lacks is described on its own."""
        infos = conv_algorithms(problem, platform, variants=problem.policy[0])
        forced = problem.forced_algo
        if forced is not None and not any(forced in (a.name, a.base) for a in infos):
            infos += core.infos_from_raw(_raw_algorithms(problem, platform, names=[forced]),
                                         problem.direction, platform, {})
        return infos

    def key(self, problem: ConvProblem) -> str:
        return (f"{problem.direction}|{np.dtype(problem.dtype).name}|"
                f"{np.dtype(problem.out_dtype).name}|"
                + ",".join(str(v) for v in problem.spec.encode()))

    def find(self, problem: ConvProblem, platform: str) -> list[dict]:
        return [dataclasses.asdict(r) for r in _find(problem, platform, repeats=5)]


FAMILY = ConvFamily()
core.register_family(FAMILY)
