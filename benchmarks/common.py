"""Benchmark harness shared by every bench_*.py (method: ../shared/DESIGN.md section 6).

* Each measurement jits ONE function that applies the op to `rotate` distinct input sets, so
  dispatch is amortised and the inputs do not all sit in the L2 cache.
* Warm-up first (compilation, module load), then back-to-back calls synchronised once per batch
  (dispatch overlaps device work, as in a training loop); the median batch mean is reported.
  A batch lasts at least MIN_BATCH_S, so that the fixed cost of its first dispatch and final
  synchronisation (~0.1 ms on a GPU) stays small against it.
* jaxdnn and the jax.lax / jax.nn path run in the same process on the same inputs, and the
  tables report their ratio (> 1 means jaxdnn is faster).
* Host memory freed by one call is kept for the next (keep_freed_host_memory): the timings are
  of the kernels, not of the kernel's page faults on fresh output pages.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np


MIN_BATCH_S = 0.02


def keep_freed_host_memory() -> None:
    """Tells glibc's malloc to keep freed memory in the process (mallopt: no heap trimming, a
    fixed 32 MB mmap threshold) instead of returning it to the OS. On the CPU every call's
    outputs are fresh host buffers; returned to the OS between calls, each output page costs a
    page fault when the kernel first writes it (~1 us on a VM). Whether glibc returns them
    depends on the process's heap layout: on a 2-core VM, a batch norm forward of 6.4 MB took
    400-1400 faults per op on either side, by process, and its time moved by 2x with them
    (benchmarks/NOTES.md, session 24). No effect where the C library is not glibc."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    libc.mallopt(m_trim_threshold, 1 << 30)
    libc.mallopt(m_mmap_threshold, 32 << 20)


def time_op(fn: Callable, inputs: Sequence[tuple], *, repeats: int = 20, warmup: int = 2,
            batches: int = 5) -> float:
    """Seconds of one `fn(*args)`: the median over `batches` of the mean time of back-to-back
    calls of one jitted function that applies `fn` to all `inputs`. Calls within a batch are
    only synchronised at its end, so host dispatch overlaps device work as in a training loop.
    A batch has repeats // batches calls, or more where that lasts under MIN_BATCH_S: with four
    calls of a 50 us op, the batch's fixed ~0.1 ms of dispatch and synchronisation was 10-20% of
    it (H200, session 12: group norm NCHW bfloat16 forward read 0.78x XLA so, 1.04x with the
    floor; a profiler trace of both kernels agrees with the latter)."""

    @jax.jit
    def many(all_inputs):
        return [fn(*args) for args in all_inputs]

    for _ in range(warmup):
        jax.block_until_ready(many(inputs))
    t0 = time.perf_counter()
    jax.block_until_ready(many(inputs))
    one = time.perf_counter() - t0
    per_batch = max(1, repeats // batches, min(1000, int(MIN_BATCH_S / max(one, 1e-9)) + 1))
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            out = many(inputs)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / per_batch)
    return statistics.median(times) / len(inputs)


def best_times(f_ours: Callable, f_ref: Callable, inputs_ours: Sequence[tuple],
               inputs_ref: Sequence[tuple], trials: int, repeats: int = 20) -> tuple[float, float]:
    """Min over `trials` rounds of time_op for each side, the two alternating within a round so
    that they share the machine's noise (noise only adds time; on a shared 2-core CPU single
    timings of the same call move by 30-50%)."""
    t_ours = t_ref = float("inf")
    for _ in range(trials):
        t_ours = min(t_ours, time_op(f_ours, inputs_ours, repeats=repeats))
        t_ref = min(t_ref, time_op(f_ref, inputs_ref, repeats=repeats))
    return t_ours, t_ref


def default_trials(trials: int | None, platform: str | None = None) -> int:
    """Interleaved rounds unless given: 3 on a CPU, 1 on a GPU (its timings repeat within a few
    percent); platform: jax's default device's unless given."""
    return trials or (3 if (platform or jax.devices()[0].platform) == "cpu" else 1)


def add_row_args(parser) -> None:
    """The options of the benchmarks over one (rows, columns) tensor: --dtypes, --repeats,
    --trials (see default_trials) and --note."""
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--trials", type=int, default=None,
                        help="interleaved rounds, best kept (default: 3 on the CPU, 1 on a GPU)")
    parser.add_argument("--note", default="", help="appended to the notes of the results table")


def rotating_inputs(make: Callable[[np.random.Generator], tuple], rotate: int, seed: int = 0,
                    device=None) -> list[tuple]:
    """`rotate` independent random input tuples, placed on `device`."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rotate):
        args = make(rng)
        out.append(tuple(jax.device_put(a, device) for a in args))
    return out


def rotation_for(bytes_per_call: int, *, l2_bytes: int = 60 << 20, cap: int = 8) -> int:
    """Enough input sets that together they overflow the L2 cache (at least 2, at most cap)."""
    return int(min(cap, max(2, -(-3 * l2_bytes // max(bytes_per_call, 1)))))


def bandwidth_row(op: str, dtype, direction: str, shape, nbytes: int, t_ours: float,
                  t_ref: float) -> dict:
    """One row of a memory-bound comparison: times, GB/s of `nbytes` minimal traffic, ratio."""
    gbytes = nbytes / 1e9
    return dict(op=op, dtype=np.dtype(dtype).name, direction=direction,
                shape="x".join(map(str, shape)), jaxdnn_us=t_ours * 1e6, xla_us=t_ref * 1e6,
                jaxdnn_GBps=gbytes / t_ours, xla_GBps=gbytes / t_ref, ratio=t_ref / t_ours)


def environment() -> dict:
    dev = jax.devices()[0]
    return {
        "date": datetime.date.today().isoformat(),
        "device": getattr(dev, "device_kind", str(dev)),
        "platform": dev.platform,
        "jax": jax.__version__,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def write_results(name: str, rows: list[dict], columns: Sequence[str], *, notes: str = "",
                  out_dir: str | None = None, env: dict | None = None) -> str:
    """Writes `rows` as a markdown table (with the environment: this machine's, or `env` for
    results measured elsewhere) and JSON next to it under benchmarks/results/, and prints the
    table. Returns the markdown path."""
    env = env or environment()
    out_dir = out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out_dir, exist_ok=True)
    slug = env["device"].replace(" ", "_").replace("/", "_")
    base = os.path.join(out_dir, f"{name}-{env['platform']}-{slug}-{env['date']}")
    lines = [f"# {name}", "",
             f"{env['date']}, {env['device']} ({env['platform']}, {env['cpu_count']} CPU "
             f"cores), jax {env['jax']}, Python {env['python']}", ""]
    if notes:
        lines += [notes, ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |")
    text = "\n".join(lines) + "\n"
    with open(base + ".md", "w") as f:
        f.write(text)
    with open(base + ".json", "w") as f:
        json.dump({"environment": env, "notes": notes, "rows": rows}, f, indent=1, default=str)
    print(text)
    return base + ".md"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def geomean(values: Sequence[float]) -> float:
    values = [v for v in values if v and v > 0]
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")
