"""CPU convolution: jaxdnn's im2col + GEMM algorithm against jax.lax on XLA:CPU.

The ResNet-50 layer table (DESIGN.md section 6) at N=8, float32, NHWC, in four directions:
fwd, bwd_data, bwd_filter (halves of jax.vjp) and train (jit(value_and_grad) of
sum(conv(x, w) * dy): all three kernels). Both sides run in one process on the same inputs
(benchmarks/common.py); each row gives GFLOP/s (2*N*P*Q*K*C*R*S per kernel) and two ratios,
XLA / jaxdnn (> 1: jaxdnn faster): of wall time, and of process CPU time (all threads) over the
same batches, with the threads each side kept busy (CPU time / wall time). XLA:CPU does not
always use every core; the CPU-time ratio compares the work done, the wall ratio what a user
waits for.

    PYTHONPATH=. python benchmarks/bench_conv_cpu.py [--batch 8] [--layers 1,2] [--dirs fwd,train]
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp
import numpy as np

from common import (CONV_DIRECTIONS, CONV_DIRECTIONS_NOTE, best_times_cpu, conv_direction_fn,
                    conv_flops, conv_fns, default_trials, geomean, keep_freed_host_memory,
                    layer_shapes, resnet50_layers, rotating_inputs, rotation_for, select_layers,
                    timing_note, write_results)

ALGO = "im2col_gemm"


def layer_label(layer):
    _, hw, _, cin = layer.x_shape
    k, _, _, cout = layer.w_shape
    return f"{hw}x{hw} {cin}->{cout} {k}x{k}/{layer.kw['window_strides'][0]}"


def bench_layer(layer, directions, repeats, trials):
    shapes = layer_shapes(layer)
    rotate = rotation_for(4 * sum(int(np.prod(s)) for s in shapes), l2_bytes=32 << 20, cap=4)
    inputs = rotating_inputs(lambda normal: tuple(normal(s, jnp.float32) for s in shapes), rotate)
    ours, xla = conv_fns(layer, ALGO)
    rows = []
    for d in directions:
        (w_ours, c_ours), (w_xla, c_xla) = best_times_cpu(
            conv_direction_fn(ours, d), conv_direction_fn(xla, d), inputs, inputs, trials,
            repeats)
        flops = conv_flops(layer, d)
        rows.append({
            "layer": layer_label(layer), "dir": d,
            "jaxdnn GFLOP/s": flops / w_ours / 1e9, "XLA GFLOP/s": flops / w_xla / 1e9,
            "ratio": w_xla / w_ours, "cpu ratio": c_xla / c_ours,
            "jaxdnn threads": c_ours / w_ours, "XLA threads": c_xla / w_xla,
        })
        r = rows[-1]
        print(f"{r['layer']:22s} {d:10s} jaxdnn {r['jaxdnn GFLOP/s']:6.1f}  XLA "
              f"{r['XLA GFLOP/s']:6.1f} GFLOP/s  ratio {r['ratio']:.2f}  cpu ratio "
              f"{r['cpu ratio']:.2f}  threads {r['jaxdnn threads']:.2f} / "
              f"{r['XLA threads']:.2f}", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--trials", type=int, default=None,
                        help="interleaved rounds, best kept (default: 3 on the CPU)")
    parser.add_argument("--layers", default="", help="1-based indices or names, comma-separated")
    parser.add_argument("--dirs", default=",".join(CONV_DIRECTIONS))
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    keep_freed_host_memory()
    trials = default_trials(args.trials)
    directions = args.dirs.split(",")
    rows = []
    for layer in select_layers(args.layers, resnet50_layers(args.batch)):
        rows += bench_layer(layer, directions, args.repeats, trials)
    summary = []
    for d in directions:
        sel = [r for r in rows if r["dir"] == d]
        summary.append({"layer": "geomean", "dir": d} | {
            k: geomean([r[k] for r in sel])
            for k in ("ratio", "cpu ratio", "jaxdnn threads", "XLA threads")})
    notes = (f"N={args.batch}, float32, NHWC; jaxdnn algo={ALGO!r} vs "
             f"jax.lax.conv_general_dilated, each on as many threads as it takes. "
             f"{CONV_DIRECTIONS_NOTE} ratio = XLA wall time / jaxdnn wall time, cpu ratio = the "
             "same of process CPU time (all threads, same batches); threads = CPU time / wall "
             "time of that side (> 1 where it runs on several cores). Geomeans (wall ratio, cpu "
             "ratio, threads jaxdnn / XLA): " + "; ".join(
                 f"{s['dir']} {s['ratio']:.2f}, {s['cpu ratio']:.2f}, "
                 f"{s['jaxdnn threads']:.2f} / {s['XLA threads']:.2f}" for s in summary)
             + f". {timing_note(trials, args.repeats)}")
    print(notes)
    if args.no_write:
        return
    write_results("conv_cpu", rows + summary,
                  ["layer", "dir", "jaxdnn GFLOP/s", "XLA GFLOP/s", "ratio", "cpu ratio",
                   "jaxdnn threads", "XLA threads"], notes=notes)


if __name__ == "__main__":
    main()
