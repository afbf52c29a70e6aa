"""Where a memory-bound op's time goes: the GPU kernels that back-to-back jitted calls launch,
ours against the jax.lax/jax.nn path, from a jax.profiler trace (CUPTI timestamps, the GPU at
its own pace, no serialisation). For each side: the wall time per op (as benchmarks/common.py's
time_op measures it), the kernels per op with their mean durations, and the GPU's busy time
per op. Wall minus busy is time the GPU sat idle between kernels.

    PYTHONPATH=. python3 dev/kernel_trace.py maxpool3x3s2:float32 batch_norm:float32 ...
    PYTHONPATH=. python3 dev/kernel_trace.py --run-only batch_norm:float32  # (under ncu)

Cases: the pooling ops of benchmarks/bench_pool.py (forward), the normalization cases of
benchmarks/bench_norm.py (forward; NCHW ones as group_norm_nchw / batch_norm_nchw; a `_bwd`
suffix times the backward alone: each side's vjp function applied to dy), the
activations of benchmarks/bench_activation.py (forward, as act_relu and so on), and the
depthwise layers of the conv table (N=64, 56x56: 3x3 with C=144, 7x7 with C=96) as dw3_fwd,
dw7_bwd_data, dw7_bwd_filter and so on; bn_mix is XLA's batch norm statistics followed by our
batch_norm_inference (our apply kernel where XLA's elementwise one runs).
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import bench_activation  # noqa: E402
import bench_norm  # noqa: E402
import bench_pool  # noqa: E402
import profile_step  # noqa: E402
from common import conv_direction_fn, conv_fns, depthwise_layers, layer_shapes  # noqa: E402
import jaxdnn  # noqa: E402

COPIES = 4  # distinct inputs per jitted call, as the benchmarks rotate them
CALLS = 10  # jitted calls traced per side


def pool_case(name, dtype):
    window, strides, padding, kind = bench_pool.OPS[name]
    x = np.random.default_rng(0).standard_normal((64, 112, 112, 64), np.float32)
    args = [(jnp.asarray(x + i, dtype),) for i in range(COPIES)]
    return (bench_pool.jaxdnn_fn(window, strides, padding, kind),
            bench_pool.xla_fn(window, strides, padding, kind), args)


def norm_case(name, dtype):
    backward = name.endswith("_bwd")
    name = name[:-4] if backward else name
    op, layout = (name[:-5], "NCHW") if name.endswith("_nchw") else (name, None)
    for case in bench_norm.cases("gpu"):
        if case[0] == op and (layout is None or case[1] == layout):
            _, layout, shape, ours, ref, n_stats = case
            break
    else:
        raise SystemExit(f"no normalization case {name}")
    rng = np.random.default_rng(0)
    pshape = bench_norm._param_shape(op, layout, shape)
    normal = lambda s, dt=np.float32: jnp.asarray(rng.standard_normal(s, np.float32), dt)
    args = [bench_norm.make_inputs(shape, pshape, n_stats, dtype, normal)[:-1]
            for _ in range(COPIES)]
    if not backward:
        return ours, ref, args

    def vjps(f):  # (vjp function, cotangents) per input
        res = []
        for a in args:
            out, vjp = jax.jit(lambda *a: jax.vjp(f, *a))(*a)
            cts = jax.tree_util.tree_map(
                lambda o: jnp.asarray(rng.standard_normal(o.shape, np.float32), o.dtype), out)
            res.append((vjp, cts))
        return res

    apply = lambda vjp, cts: vjp(cts)
    return apply, apply, (vjps(ours), vjps(ref))


def mix_case(name, dtype):
    """bn_mix: batch_norm NHWC's forward as XLA's statistics (jnp means, as bench_norm's
    reference) then our batch_norm_inference, against XLA's whole path: our apply kernel in the
    place of XLA's elementwise kernel, after the same reduction."""
    del name
    _, ref, args = norm_case("batch_norm", dtype)

    def ours(x, s, b):
        _, m, v = bench_norm._stats(x, bench_norm._bn_axes(x, -1))
        return jaxdnn.batch_norm_inference(x, s, b, m.reshape(-1), v.reshape(-1),
                                           eps=bench_norm.EPS)

    return ours, ref, args


def depthwise_case(name, dtype):
    size, direction = name[2], name[len("dw7_"):]
    layer = next(lay for lay in depthwise_layers(64) if lay.name.startswith(f"dw{size}x{size}_"))
    rng = np.random.default_rng(0)
    x, w, dy = (rng.standard_normal(s, np.float32) for s in layer_shapes(layer))
    ours, ref = conv_fns(layer)

    args = [tuple(jnp.asarray(a + i, dtype) for a in (x, w, dy)) for i in range(COPIES)]
    return conv_direction_fn(ours, direction), conv_direction_fn(ref, direction), args


def activation_case(name, dtype):
    """act_<op>: the activation's forward over bench_activation's 32768x4096."""
    ours, ref = bench_activation.OPS[name[len("act_"):]]
    x = np.random.default_rng(0).standard_normal((32768, 4096), np.float32)
    return ours, ref, [(jnp.asarray(x + i, dtype),) for i in range(COPIES)]


def make_case(name, dtype):
    """(ours, ref, args) of a case by name: pooling, normalization, activation or depthwise."""
    make = (pool_case if name in bench_pool.OPS else
            activation_case if name.startswith("act_") else
            depthwise_case if name[:4] in ("dw3_", "dw7_") else
            mix_case if name == "bn_mix" else norm_case)
    return make(name, dtype)


def many_fn(fn):
    return jax.jit(lambda all_args: [fn(*a) for a in all_args])


def wall_per_op(f, args):
    jax.block_until_ready(f(args))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            out = f(args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / CALLS / len(args))
    return best


def trace_events(trace_dir):
    """The trace's spans: (name, ts_us, dur_us, args) of each on a GPU stream, and (name,
    dur_us) of each on the host."""
    events = profile_step.load_trace(trace_dir)["traceEvents"]
    gpu_pids = profile_step.gpu_processes(events)
    spans = [e for e in events if e.get("ph") == "X"]
    return ([(e["name"], float(e["ts"]), float(e["dur"]), e.get("args", {})) for e in spans
             if e.get("pid") in gpu_pids],
            [(e["name"], float(e["dur"])) for e in spans if e.get("pid") not in gpu_pids])


def traced(f, args):
    jax.block_until_ready(f(args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(CALLS):
                out = f(args)
            jax.block_until_ready(out)
        return trace_events(d)


def report(label, f, args):
    wall = wall_per_op(f, args)
    events, host_events = traced(f, args)
    ops = CALLS * len(args)
    by_name = collections.defaultdict(list)
    details = {}
    for name, _, dur, ev_args in events:
        by_name[name].append(dur)
        details.setdefault(name, ev_args)
    busy = sum(d for _, _, d, _ in events) / ops
    span = (max(t + d for _, t, d, _ in events) - min(t for _, t, _, _ in events)) / ops if events else 0
    # Idle time between consecutive kernels, by (previous, next) kernel: launch gaps inside an
    # op against the boundaries between ops and between jitted calls.
    gaps = collections.defaultdict(list)
    ordered = sorted(events, key=lambda e: e[1])
    for (n0, t0, d0, _), (n1, t1, _, _) in zip(ordered, ordered[1:]):
        gaps[(n0[:40], n1[:40])].append(t1 - t0 - d0)
    print(f"  {label}: wall {wall * 1e6:7.1f} us/op   GPU busy {busy:7.1f} us/op   "
          f"first-to-last kernel {span:7.1f} us/op")
    for name, durs in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"      {len(durs) / ops:5.2f}/op  {np.mean(durs):8.1f} us  {name[:100]}")
        info = {k: v for k, v in details[name].items()
                if k in ("kernel_details", "grid", "block", "registers_per_thread",
                         "shared_memory", "occupancy") or "grid" in k or "block" in k}
        print(f"                       {str(info or details[name])[:240]}")
    per_op = len(ordered) / ops
    if per_op == int(per_op) and per_op > 0:  # idle time per op: inside ops, between, calls
        k, per_call = int(per_op), int(per_op) * len(args)
        where = collections.defaultdict(float)
        for j, ((_, t0, d0, _), (_, t1, _, _)) in enumerate(zip(ordered, ordered[1:])):
            kind = ("between calls" if (j + 1) % per_call == 0 else
                    "between ops" if (j + 1) % k == 0 else "inside an op")
            where[kind] += (t1 - t0 - d0) / ops
        print("      idle per op (us): " + ", ".join(f"{w} {v:.2f}" for w, v in where.items()))
    print("      gaps (us): previous -> next kernel: count/op, mean, max")
    for (a, b), g in sorted(gaps.items(), key=lambda kv: -sum(kv[1]))[:8]:
        print(f"        {len(g) / ops:5.2f}/op {np.mean(g):7.2f} {np.max(g):8.2f}  {a} -> {b}")
    host = collections.defaultdict(list)
    for name, dur in host_events:
        host[name[:60]].append(dur)
    print("      host events: count/op, mean us, name (top 10 by total)")
    for name, durs in sorted(host.items(), key=lambda kv: -sum(kv[1]))[:10]:
        print(f"        {len(durs) / ops:6.2f}/op {np.mean(durs):8.2f}  {name}")
    return wall, busy


def main():
    if sys.argv[1] == "--run-only":  # ours, a few calls, untraced (for ncu --kernel-name ...)
        for spec in sys.argv[2:]:
            ours, _, args = make_case(*spec.split(":"))
            args = args[0] if isinstance(args, tuple) else args
            f = many_fn(ours)
            for _ in range(3):
                jax.block_until_ready(f(args))
        return
    rows = []
    for spec in sys.argv[1:]:
        name, dtype = spec.split(":")
        ours, ref, args = make_case(name, dtype)
        ours_args, ref_args = args if isinstance(args, tuple) else (args, args)
        print(f"=== {name} {dtype}", flush=True)
        w_o, b_o = report("jaxdnn", many_fn(ours), ours_args)
        w_x, b_x = report("XLA   ", many_fn(ref), ref_args)
        rows.append((spec, w_o, b_o, w_x, b_x))
    print(f"\n{'case':28} {'ours wall':>9} {'busy':>7} {'XLA wall':>9} {'busy':>7} {'ratio':>6}")
    for spec, w_o, b_o, w_x, b_x in rows:
        print(f"{spec:28} {w_o * 1e6:9.1f} {b_o:7.1f} {w_x * 1e6:9.1f} {b_x:7.1f} "
              f"{w_x / w_o:6.2f}")


if __name__ == "__main__":
    main()
