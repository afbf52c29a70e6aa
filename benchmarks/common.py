"""Benchmark harness shared by every bench_*.py (method: docs/perf/method.md).

* Each measurement jits ONE function that applies the op to `rotate` distinct input sets, so
  dispatch is amortised and the inputs do not all sit in the L2 cache.
* Warm-up first (compilation, module load), then back-to-back calls synchronised once per batch
  (dispatch overlaps device work, as in a training loop); the median batch mean is reported.
  A batch lasts at least MIN_BATCH_S, so that the fixed cost of its first dispatch and final
  synchronisation (~0.1 ms on a GPU) stays small against it.
* jaxdnn and the jax.lax / jax.nn path run in the same process on the same inputs, and the
  tables report their ratio (> 1 means jaxdnn is faster).
* The headline rows are what a user runs: the forward alone, and forward + backward as
  `jax.jit(jax.value_and_grad(...))` of a loss on both sides (fwd_bwd), XLA free to fuse and to
  recompute. Backward-only rows appear only where both sides start from the same tensors.
* Host memory freed by one call is kept for the next (keep_freed_host_memory): the timings are
  of the kernels, not of the kernel's page faults on fresh output pages.
* Each table is written as benchmarks/results/<name>-<platform>-<device>.{md,json}: one file
  per (benchmark, device), replaced by the next run (git keeps the earlier ones). The JSON's
  environment carries `method` (METHOD); benchmarks/report.py renders README tables from them.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxdnn
from jaxdnn.selection.cache import device_identity

# The conv layer tables are tests/problems.py's, shared with the tests.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from problems import (CONV_TABLES, ConvCase, depthwise_layers, large_filter_layers,  # noqa: E402
                      resnet50_layers)

MIN_BATCH_S = 0.02

# The methodology a table was measured with, recorded in its JSON environment. 2: fwd+bwd
# headline rows under jit(value_and_grad) (conv: a "train" row per layer), backward-only rows
# only from the same inputs on both sides, CPU time and threads beside wall time. Tables
# without the field predate it.
METHOD = 2

FWD, FWD_BWD, BWD_SAME = "fwd", "fwd+bwd", "bwd (same inputs)"

DIRECTIONS_NOTE = (
    f"Directions: {FWD} = the op alone; {FWD_BWD} = jax.jit(jax.value_and_grad(lambda x, *p: "
    "jnp.sum(op(x, *p) * ct))) with the gradient of x and the op's trainable parameters, on both "
    "sides: the forward and the backward a training step runs, XLA free to fuse and to recompute "
    "(so the loss reduction is part of it; XLA may fuse the forward into it, while jaxdnn's "
    f"forward writes y for it to read); {BWD_SAME} = the backward alone where both sides start "
    "from the same tensors.")


def keep_freed_host_memory() -> None:
    """Tells glibc's malloc to keep freed memory in the process (mallopt: no heap trimming, a
    fixed 32 MB mmap threshold) instead of returning it to the OS. On the CPU every call's
    outputs are fresh host buffers; returned to the OS between calls, each output page costs a
    page fault when the kernel first writes it (~1 us on a VM). Whether glibc returns them
    depends on the process's heap layout: on a 2-core VM, a batch norm forward of 6.4 MB took
    400-1400 faults per op on either side, by process, and its time moved by 2x with them
    (docs/perf/method.md). No effect where the C library is not glibc."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    libc.mallopt(m_trim_threshold, 1 << 30)
    libc.mallopt(m_mmap_threshold, 32 << 20)


# ---- timing ---------------------------------------------------------------------------------

def _jit_many(fn: Callable) -> Callable:
    """One jitted function applying `fn` to every input tuple of a list."""
    return jax.jit(lambda all_inputs: [fn(*args) for args in all_inputs])


def _measure(many: Callable, inputs: Sequence[tuple], repeats: int, warmup: int,
             batches: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one op: medians over `batches` of the batch means
    of back-to-back `many(inputs)` calls, divided by the number of input sets."""
    for _ in range(warmup):
        jax.block_until_ready(many(inputs))
    t0 = time.perf_counter()
    jax.block_until_ready(many(inputs))
    one = time.perf_counter() - t0
    per_batch = max(1, repeats // batches, min(1000, int(MIN_BATCH_S / max(one, 1e-9)) + 1))
    walls, cpus = [], []
    for _ in range(batches):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(per_batch):
            out = many(inputs)
        jax.block_until_ready(out)
        walls.append((time.perf_counter() - t0) / per_batch)
        cpus.append((time.process_time() - c0) / per_batch)
    return statistics.median(walls) / len(inputs), statistics.median(cpus) / len(inputs)


def time_op(fn: Callable, inputs: Sequence[tuple], *, repeats: int = 20, warmup: int = 2,
            batches: int = 5) -> float:
    """Seconds of one `fn(*args)`: the median over `batches` of the mean time of back-to-back
    calls of one jitted function that applies `fn` to all `inputs`. Calls within a batch are
    only synchronised at its end, so host dispatch overlaps device work as in a training loop.
    A batch has repeats // batches calls, or more where that lasts under MIN_BATCH_S: with four
    calls of a 50 us op, the batch's fixed ~0.1 ms of dispatch and synchronisation was 10-20% of
    it (H200, 2026-11-30: group norm NCHW bfloat16 forward read 0.78x XLA so, 1.04x with the
    floor; a profiler trace of both kernels agrees with the latter)."""
    return _measure(_jit_many(fn), inputs, repeats, warmup, batches)[0]


def best_times_cpu(f_ours: Callable, f_ref: Callable, inputs_ours: Sequence[tuple],
                   inputs_ref: Sequence[tuple], trials: int, repeats: int = 20
                   ) -> tuple[tuple[float, float], tuple[float, float]]:
    """((wall, cpu) of ours, (wall, cpu) of the reference): for each side the round of least
    wall time out of `trials` rounds of time_op's measurement, the two sides alternating within a
    round so that they share the machine's noise (noise only adds time; on a shared 2-core CPU
    single timings of the same call move by 30-50%). cpu is the process CPU time (all threads)
    over the same batches, so cpu / wall is the number of threads the side kept busy."""
    manys = (_jit_many(f_ours), _jit_many(f_ref))
    best = [(float("inf"), float("inf"))] * 2
    for _ in range(trials):
        for i, (many, inputs) in enumerate(zip(manys, (inputs_ours, inputs_ref))):
            best[i] = min(best[i], _measure(many, inputs, repeats, 2, 5))
    return best[0], best[1]


def best_times(f_ours: Callable, f_ref: Callable, inputs_ours: Sequence[tuple],
               inputs_ref: Sequence[tuple], trials: int, repeats: int = 20) -> tuple[float, float]:
    """Wall seconds of (ours, reference), as best_times_cpu."""
    ours, ref = best_times_cpu(f_ours, f_ref, inputs_ours, inputs_ref, trials, repeats)
    return ours[0], ref[0]


def default_trials(trials: int | None, platform: str | None = None) -> int:
    """Interleaved rounds unless given: 3 on a CPU, 1 on a GPU (its timings repeat within a few
    percent); platform: jax's default device's unless given."""
    return trials or (3 if (platform or jax.devices()[0].platform) == "cpu" else 1)


def add_row_args(parser, repeats: int | None = 20) -> None:
    """The options of the memory-bound benchmarks: --dtypes, --repeats, --trials (see
    default_trials), --note and --out-dir."""
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--trials", type=int, default=None,
                        help="interleaved rounds, best kept (default: 3 on the CPU, 1 on a GPU)")
    parser.add_argument("--note", default="", help="appended to the notes of the results table")
    parser.add_argument("--out-dir", default=None,
                        help="where the table goes (default: benchmarks/results)")


# ---- inputs ---------------------------------------------------------------------------------

_normal = jax.jit(jax.random.normal, static_argnums=(1, 2))


def rotating_inputs(make: Callable[[Callable], tuple], rotate: int, seed: int = 0,
                    device=None) -> list[tuple]:
    """`rotate` independent input tuples `make(normal)`, where normal(shape, dtype=float32)
    draws standard normal values on `device` (default: jax's default device) with jax.random,
    so that large inputs cost no host time or transfer."""
    device = device or jax.devices()[0]
    key = jax.device_put(jax.random.key(seed), device)
    counter = itertools.count()

    def normal(shape, dtype=jnp.float32):
        return _normal(jax.random.fold_in(key, next(counter)), tuple(shape), jnp.dtype(dtype))
    return [tuple(make(normal)) for _ in range(rotate)]


def run_cases(cases, dtypes, device, bench: Callable) -> list[dict]:
    """The rows of bench(case, dtype) for every case and dtype name, with `device` as jax's
    default device."""
    rows = []
    with jax.default_device(device):
        for case in cases:
            for dt in dtypes:
                rows += bench(case, jnp.dtype(dt))
    return rows


def rotation_for(bytes_per_call: int, *, l2_bytes: int = 60 << 20, cap: int = 8) -> int:
    """Enough input sets that together they overflow the L2 cache (at least 2, at most cap)."""
    return int(min(cap, max(2, -(-3 * l2_bytes // max(bytes_per_call, 1)))))


# ---- what is timed --------------------------------------------------------------------------

def fwd_bwd(f: Callable, argnums=0) -> Callable:
    """A training step's use of `f`: jax.value_and_grad of sum(f(*args) * ct) with respect to
    args[argnums] (f's first output where it returns several). The result is called as
    step(*args, ct); XLA is free to fuse and to recompute across the forward and backward."""
    def step(*args):
        *args, ct = args

        def loss(*a):
            y = f(*a)
            return jnp.sum((y[0] if isinstance(y, tuple) else y) * ct)
        return jax.value_and_grad(loss, argnums)(*args)
    return step


def backward(f: Callable) -> Callable:
    """f's backward alone from (x, dy): jit(lambda x, dy: vjp(f, x)[1](dy)); the forward is
    dead code where the backward does not need it."""
    return lambda x, dy: jax.vjp(f, x)[1](dy)[0]


# ---- convolution layers (bench_conv_gpu.py, bench_conv_cpu.py) ------------------------------

def conv_layers(batch: int) -> list[ConvCase]:
    """The ResNet-50 layers, two depthwise layers and two 7x7 stride-1 layers (not ResNet-50,
    left out of its geomeans: large stride-1 filters, where the FFT competes), at `batch`."""
    return resnet50_layers(batch) + depthwise_layers(batch) + large_filter_layers(batch)


def table_layers(table: str, batch: int | None) -> list[ConvCase]:
    """The layers of a GPU conv table: "resnet" (conv_layers, default batch 64) or one of
    tests/problems.py's CONV_TABLES (3d, grouped, transposed, dilated_depthwise) at its own
    default batch unless `batch` is given."""
    if table == "resnet":
        return conv_layers(batch or 64)
    if table not in CONV_TABLES:
        raise ValueError(f"unknown conv table {table!r}: resnet or one of {sorted(CONV_TABLES)}")
    layers, default_batch = CONV_TABLES[table]
    return layers(batch or default_batch)


# fwd is the convolution, bwd_data / bwd_filter the halves of its jax.vjp with a random
# cotangent (the other operand closed over, so one kernel runs), train all three at once.
CONV_DIRECTIONS = ("fwd", "bwd_data", "bwd_filter", "train")
CONV_DIRECTIONS_NOTE = (
    "fwd = the convolution; bwd_data / bwd_filter = one half of its jax.vjp applied to a random "
    "cotangent dy (the other operand closed over, so that one backward kernel runs); train = "
    "jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(conv(x, w) * dy), argnums=(0, 1))): the "
    "forward and both backward kernels, XLA free to fuse, counted as 3x the forward's FLOPs.")


def in_resnet(name: str) -> bool:
    return name in {lay.name for lay in resnet50_layers(1)}


def select_layers(spec: str, layers: list[ConvCase]) -> list[ConvCase]:
    """Layers by comma-separated 1-based indices or names ("" = all of `layers`)."""
    if not spec:
        return list(layers)
    by_name = {lay.name: lay for lay in layers}
    return [by_name[s] if s in by_name else layers[int(s) - 1] for s in spec.split(",")]


def layer_shapes(layer: ConvCase) -> tuple[tuple, tuple, tuple]:
    """(x, w, y) shapes, channels-last (N...C, W..IO, N...C), of any rank."""
    y = jax.eval_shape(lambda x, w: lax.conv_general_dilated(x, w, **layer.kw),
                       jax.ShapeDtypeStruct(layer.x_shape, jnp.float32),
                       jax.ShapeDtypeStruct(layer.w_shape, jnp.float32))
    return layer.x_shape, layer.w_shape, tuple(y.shape)


def conv_flops(layer: ConvCase, direction: str) -> float:
    """2 x the multiply-adds of real inputs, 3x that for train: 2*N*P*Q*K*C*R*S/groups (every
    output position times the filter); for a transposed (lhs-dilated) convolution, every
    input position times the filter, as for the forward convolution whose gradient it is (the
    taps on the dilation's holes are not work)."""
    w = np.prod(layer.w_shape, dtype=np.float64)  # taps x C/groups x K
    positions = layer.x_shape if layer.kw.get("lhs_dilation") else layer_shapes(layer)[2]
    return 2.0 * np.prod(positions[:-1], dtype=np.float64) * w * (
        3 if direction == "train" else 1)


def conv_fns(layer: ConvCase, algo=None, precision=None) -> tuple[Callable, Callable]:
    """(jaxdnn conv, lax conv) of a layer as functions of (x, w), channels-last: jaxdnn.conv as
    a user calls it (stride, padding, dilation, groups), or jaxdnn.conv_general_dilated with
    lax's own keywords for an lhs-dilated (transposed) convolution."""
    kw = layer.kw

    def ours(x, w):
        if kw.get("lhs_dilation"):
            return jaxdnn.conv_general_dilated(x, w, **kw, precision=precision, algo=algo)
        return jaxdnn.conv(x, w, stride=kw["window_strides"], padding=kw["padding"],
                           dilation=kw.get("rhs_dilation") or 1,
                           groups=kw.get("feature_group_count", 1), algo=algo,
                           precision=precision)

    def xla(x, w):
        return lax.conv_general_dilated(x, w, **kw, precision=precision)
    return ours, xla


def conv_direction_fn(conv: Callable, direction: str) -> Callable:
    """The function of (x, w, dy) timed for a direction (CONV_DIRECTIONS)."""
    if direction == "fwd":
        return lambda x, w, dy: conv(x, w)
    if direction == "bwd_data":
        return lambda x, w, dy: jax.vjp(lambda x_: conv(x_, w), x)[1](dy)[0]
    if direction == "bwd_filter":
        return lambda x, w, dy: jax.vjp(lambda w_: conv(x, w_), w)[1](dy)[0]
    return fwd_bwd(conv, (0, 1))


# ---- rows, summaries, results ---------------------------------------------------------------

def bandwidth_row(op: str, dtype, direction: str, shape, nbytes: int, t_ours: float,
                  t_ref: float, **extra) -> dict:
    """One row of a memory-bound comparison: times, GB/s of `nbytes` minimal traffic, ratio."""
    gbytes = nbytes / 1e9
    return dict(op=op, **extra, dtype=np.dtype(dtype).name, direction=direction,
                shape="x".join(map(str, shape)), jaxdnn_us=t_ours * 1e6, xla_us=t_ref * 1e6,
                jaxdnn_GBps=gbytes / t_ours, xla_GBps=gbytes / t_ref, ratio=t_ref / t_ours)


BANDWIDTH_COLUMNS = ["op", "dtype", "direction", "shape", "jaxdnn_us", "xla_us", "jaxdnn_GBps",
                     "xla_GBps", "ratio"]


def compare(op: str, dtype, direction: str, shape, f_ours: Callable, f_ref: Callable,
            inputs: Sequence[tuple], nbytes: int, trials: int, repeats: int, **extra) -> dict:
    """Times both sides of one memory-bound row on the same inputs (best_times), prints and
    returns its bandwidth_row."""
    t_ours, t_ref = best_times(f_ours, f_ref, inputs, inputs, trials, repeats)
    row = bandwidth_row(op, dtype, direction, shape, nbytes, t_ours, t_ref, **extra)
    print(" ".join(f"{k}={_fmt(v)}" for k, v in row.items()), flush=True)
    return row


def geomeans_by(rows: Sequence[dict], key: str, value: str = "ratio") -> dict:
    """{rows[key]: geomean of rows[value]} in order of first appearance."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r[value])
    return {k: geomean(v) for k, v in groups.items()}


def geomeans_note(rows: Sequence[dict], key: str = "direction") -> str:
    """'Geomean ratio by direction: fwd 1.10 (20 rows), ...'."""
    counts = {k: sum(r[key] == k for r in rows) for k in geomeans_by(rows, key)}
    return f"Geomean ratio by {key}: " + ", ".join(
        f"{k} {g:.3f} ({counts[k]} rows)" for k, g in geomeans_by(rows, key).items()) + "."


def timing_note(trials: int, repeats: int) -> str:
    return (f"Timing: benchmarks/common.py, best of {trials} interleaved round(s); a round = "
            f"median of 5 batch means, a batch >= {MIN_BATCH_S * 1e3:.0f} ms and >= "
            f"{max(1, repeats // 5)} calls, each call one jit over rotating input sets.")


def environment() -> dict:
    dev = jax.devices()[0]
    return {
        "date": datetime.date.today().isoformat(),
        "device": getattr(dev, "device_kind", str(dev)),
        "platform": dev.platform,
        "jax": jax.__version__,
        "cpu_count": os.cpu_count(),
        "host_cpu": device_identity("cpu").rsplit(" x", 1)[0],  # the model
        "python": platform.python_version(),
        "method": METHOD,
    }


def results_base(name: str, env: dict, out_dir: str | None = None) -> str:
    """benchmarks/results/<name>-<platform>-<device>, the path of a table without extension."""
    out_dir = out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    slug = env["device"].replace(" ", "_").replace("/", "_")
    return os.path.join(out_dir, f"{name}-{env['platform']}-{slug}")


def write_results(name: str, rows: list[dict], columns: Sequence[str], *, notes: str = "",
                  out_dir: str | None = None, env: dict | None = None) -> str:
    """Writes `rows` as a markdown table (with the environment: this machine's, or `env` for
    results measured elsewhere) and JSON next to it under benchmarks/results/, replacing that
    benchmark's previous table for the device, and prints the table. Returns the markdown
    path."""
    env = dict(env or environment(), benchmark=name)
    base = results_base(name, env, out_dir)
    os.makedirs(os.path.dirname(base), exist_ok=True)
    method = f"method {env['method']}" if "method" in env else "old method"
    lines = [f"# {name}", "",
             f"{env['date']}, {env['device']} ({env['platform']}, {env['cpu_count']} CPU "
             f"cores), jax {env['jax']}, Python {env['python']}, {method}", ""]
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
