"""Where the GPU time of one training step goes: bench_e2e.py's step of one configuration, on
jaxdnn and on jax.lax / jax.nn, traced with jax.profiler, its kernels summed by category.

    PYTHONPATH=. python benchmarks/profile_step.py               # ResNet-50, bfloat16, batch 256
    PYTHONPATH=. python benchmarks/profile_step.py --model convnext --dtype float32 --batch 128
    PYTHONPATH=. python benchmarks/profile_step.py --unfused     # jaxdnn without the fused ops too

Each side compiles and takes WARMUP steps, then --steps steps run inside
jax.profiler.trace(dir, create_perfetto_trace=True). The kernels are the complete events of the
trace's /device:GPU processes (CUPTI's timestamps; the events dev/kernel_trace.py reads); their
durations are summed per category of kernel name (CATEGORIES) and divided by the steps. Where
kernels do not overlap (a step's run one after another on XLA's compute stream), the total is
the GPU's busy time per step, and bench_e2e.py's step time is that plus the GPU's idle gaps. The
notes list each side's largest kernels, so that a kernel in the wrong category shows. Needs a
GPU.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile

import jax

from bench_e2e import NETWORKS, sides
from common import write_results

WARMUP = 2
# Kernel name -> category: the first pattern that matches (re.search) wins. jaxdnn's kernels are
# named by their namespace, jaxdnn::<family> (demangled) or 6jaxdnn<n><family> (mangled); the
# library kernels XLA calls for a convolution or a matrix product (cuDNN, cuBLAS and its nvjet
# kernels, CUTLASS, XLA's Triton GEMMs) by their library or algorithm; XLA's own kernels by the
# HLO instruction they run, a lower-case name (loop_add_fusion, input_reduce_fusion_3, copy_5).


def _jaxdnn(family: str) -> str:
    return rf"jaxdnn(::|\d+){family}(?![a-z_])"


CATEGORIES = [
    # the fused convolution's epilogue pass (cc/conv/cuda_epilogue.cu): memory-bound work between
    # the convolutions, counted apart from them
    ("conv epilogue", _jaxdnn("conv") + r"(::|\d+).*epilogue_kernel"),
    ("convolution / GEMM", _jaxdnn("conv") + r"|(?i:cudnn|xmma|cutlass|gemm|cublas|nvjet|"
                                               r"convolve|conv2d|fprop|dgrad|wgrad|winograd|fft)"),
    ("normalization", _jaxdnn("norm")),
    ("activation", _jaxdnn("activation")),
    ("pooling", _jaxdnn("pool") + r"|reduce[-_]window|select[-_]and[-_]scatter"),
    ("softmax", _jaxdnn("softmax")),
    ("memcpy / memset", r"^(?i:mem(cpy|set))"),
    ("XLA fusions", r"^[a-z][a-z0-9_]*([.-]\d+)*$"),
]
OTHER = "other"
CATEGORY_NAMES = [name for name, _ in CATEGORIES] + [OTHER]
_COMPILED = [(name, re.compile(pattern)) for name, pattern in CATEGORIES]


def category(kernel: str) -> str:
    """The category of a GPU kernel (or memory operation) by its name in the trace."""
    return next((name for name, pattern in _COMPILED if pattern.search(kernel)), OTHER)


def gpu_processes(events: list[dict]) -> set:
    """The pids of a trace's /device:GPU processes (named by "process_name" metadata events),
    whose complete events are the kernels and memory operations that ran on the GPU."""
    return {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
            and str(e.get("args", {}).get("name", "")).startswith("/device:GPU")}


def gpu_kernels(trace: dict) -> list[tuple[str, float]]:
    """(name, duration in us) of every complete event ("ph": "X") of the trace's GPU processes;
    host events are left out."""
    events = trace["traceEvents"]
    gpu = gpu_processes(events)
    return [(e["name"], float(e["dur"])) for e in events
            if e.get("ph") == "X" and e.get("pid") in gpu]


def breakdown(trace: dict, steps: int) -> dict[str, dict[str, float]]:
    """{category: {"ms": GPU milliseconds per step, "kernels": kernels per step}} over every
    category of CATEGORY_NAMES, from a trace of `steps` steps."""
    out = {name: {"ms": 0.0, "kernels": 0.0} for name in CATEGORY_NAMES}
    for name, dur in gpu_kernels(trace):
        cell = out[category(name)]
        cell["ms"] += dur / 1e3 / steps
        cell["kernels"] += 1 / steps
    return out


def top_kernels(trace: dict, steps: int, n: int) -> list[tuple[str, float]]:
    """The n kernels with the most GPU time: (name, ms per step), largest first."""
    total = collections.Counter()
    for name, dur in gpu_kernels(trace):
        total[name] += dur / 1e3 / steps
    return total.most_common(n)


def load_trace(trace_dir: str) -> dict:
    """The perfetto_trace.json.gz that jax.profiler.trace wrote under trace_dir."""
    (path,) = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    with gzip.open(path) as f:
        return json.load(f)


def traced_steps(side, steps: int, x, y) -> dict:
    """The trace of `steps` steps of a Side (compiled and warm)."""
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            side.steps(steps, x, y)
        return load_trace(d)


def rows_of(parts: dict[str, dict]) -> list[dict]:
    """One row per category (then the total) from {side: breakdown}."""
    rows = []
    for name in CATEGORY_NAMES + ["total"]:
        row = {"category": name}
        for side, cells in parts.items():
            picked = cells.values() if name == "total" else [cells[name]]
            row[f"{side}_ms"] = sum(c["ms"] for c in picked)
            row[f"{side}_kernels"] = sum(c["kernels"] for c in picked)
        rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", choices=NETWORKS)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5, help="traced steps per side")
    parser.add_argument("--top", type=int, default=8, help="largest kernels listed per side")
    parser.add_argument("--unfused", action="store_true",
                        help="also profile jaxdnn without its fused ops (bench_e2e.py --unfused):"
                             " the breakdown before fusion beside the one after")
    parser.add_argument("--out-dir", default=None,
                        help="where the table goes (default: benchmarks/results)")
    args = parser.parse_args(argv)
    if jax.default_backend() != "gpu":
        raise SystemExit("profile_step.py needs a GPU (its breakdown is of GPU kernels)")
    all_sides, (x, y) = sides(args.model, args.dtype, args.batch, unfused=args.unfused)
    keys = ("lax", "jaxdnn", "unfused")[:len(all_sides)]
    parts, tops = {}, {}
    for key, side in zip(keys, all_sides):
        side.steps(WARMUP, x, y)
        trace = traced_steps(side, args.steps, x, y)
        parts[key] = breakdown(trace, args.steps)
        tops[key] = top_kernels(trace, args.steps, args.top)
    largest = " ".join(
        f"Largest {side} kernels (ms/step): " + "; ".join(f"{ms:.2f} {name[:80]}"
                                                           for name, ms in top) + "."
        for side, top in tops.items())
    notes = (f"{args.model}, {args.dtype}, batch {args.batch}: GPU kernel time per training step "
             f"(benchmarks/profile_step.py; bench_e2e.py's step), mean of {args.steps} traced "
             f"steps after {WARMUP}, by kernel name (profile_step.CATEGORIES); kernels = "
             f"launches per step"
             + ("; unfused = jaxdnn without its fused ops (bench_e2e.py --unfused). "
                if args.unfused else ". ") + largest)
    columns = ["category", *(f"{k}_ms" for k in keys), *(f"{k}_kernels" for k in keys)]
    write_results("e2e_profile", rows_of(parts), columns, notes=notes, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
