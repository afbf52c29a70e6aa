"""CPU convolution: jaxdnn's im2col + GEMM algorithm against jax.lax on XLA:CPU.

The ResNet-50 layer table (DESIGN.md section 6) at N=8, float32, NHWC, in the three directions:
fwd is the convolution, bwd_data and bwd_filter are the two halves of its jax.vjp. Both sides
run in one process on the same inputs (benchmarks/common.py: time_op); the table reports
GFLOP/s (2*N*P*Q*K*C*R*S/groups per direction) and the ratio jaxdnn / XLA (> 1: jaxdnn faster).

    PYTHONPATH=. python benchmarks/bench_conv_cpu.py [--batch 8] [--repeats 10] [--layers 1,2]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import (geomean, keep_freed_host_memory, rotating_inputs, rotation_for, time_op,
                    write_results)
from jax import lax

import jaxdnn
from jaxdnn.algo import time_jitted

# (H, W, Cin, Cout, kernel, stride, pad)
RESNET50 = [
    (224, 224, 3, 64, 7, 2, 3),
    (56, 56, 64, 64, 1, 1, 0),
    (56, 56, 64, 64, 3, 1, 1),
    (56, 56, 64, 256, 1, 1, 0),
    (28, 28, 128, 128, 3, 1, 1),
    (28, 28, 512, 128, 1, 1, 0),
    (14, 14, 256, 256, 3, 1, 1),
    (14, 14, 256, 1024, 1, 1, 0),
    (7, 7, 512, 512, 3, 1, 1),
    (28, 28, 256, 256, 3, 2, 1),
]
DIRECTIONS = ("fwd", "bwd_data", "bwd_filter")
ALGO = "im2col_gemm"


def conv_fns(stride, pad):
    """(jaxdnn conv, lax conv) as functions of (x, w), NHWC / HWIO."""
    padding = ((pad, pad), (pad, pad))

    def ours(x, w):
        return jaxdnn.conv(x, w, stride=stride, padding=padding, algo=ALGO)

    def xla(x, w):
        return lax.conv_general_dilated(x, w, (stride, stride), padding,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return ours, xla


def direction_fn(conv, direction):
    """The op timed for a direction: the conv itself, or one half of its vjp (the other
    operand is closed over, so only that backward kernel runs)."""
    if direction == "fwd":
        return lambda x, w, dy: conv(x, w)
    if direction == "bwd_data":
        return lambda x, w, dy: jax.vjp(lambda x_: conv(x_, w), x)[1](dy)[0]
    return lambda x, w, dy: jax.vjp(lambda w_: conv(x, w_), w)[1](dy)[0]


def cpu_seconds(fn, inputs, repeats):
    """Median process CPU time (all threads) of one fn(*args). On a machine shared with other
    jobs the wall time depends on how much of the cores the process gets; GFLOP per CPU-second
    does not."""
    return time_jitted(fn, inputs, repeats, clock=time.process_time)


def bench_layer(layer, batch, directions, repeats):
    h, w_, cin, cout, k, stride, pad = layer
    out_h = (h + 2 * pad - k) // stride + 1
    out_w = (w_ + 2 * pad - k) // stride + 1
    flops = 2.0 * batch * out_h * out_w * cout * cin * k * k
    shapes = ((batch, h, w_, cin), (k, k, cin, cout), (batch, out_h, out_w, cout))
    nbytes = 4 * sum(int(np.prod(s)) for s in shapes)

    def make(rng):
        return tuple(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes)

    inputs = rotating_inputs(make, rotation_for(nbytes, l2_bytes=32 << 20, cap=4))
    ours, xla = conv_fns(stride, pad)
    rows = []
    for d in directions:
        fns = (direction_fn(ours, d), direction_fn(xla, d))
        t_ours, t_xla = (time_op(f, inputs, repeats=repeats) for f in fns)
        c_ours, c_xla = (cpu_seconds(f, inputs, max(3, repeats // 2)) for f in fns)
        rows.append({
            "layer": f"{h}x{w_} {cin}->{cout} {k}x{k}/{stride}",
            "dir": d,
            "jaxdnn GFLOP/s": flops / t_ours / 1e9,
            "XLA GFLOP/s": flops / t_xla / 1e9,
            "ratio": t_xla / t_ours,
            "jaxdnn GFLOP/cpu-s": flops / c_ours / 1e9,
            "XLA GFLOP/cpu-s": flops / c_xla / 1e9,
            "cpu ratio": c_xla / c_ours,
        })
        r = rows[-1]
        print(f"{r['layer']:22s} {d:10s} jaxdnn {r['jaxdnn GFLOP/s']:6.1f}  XLA "
              f"{r['XLA GFLOP/s']:6.1f}  ratio {r['ratio']:.2f}   per cpu-s: jaxdnn "
              f"{r['jaxdnn GFLOP/cpu-s']:6.1f}  XLA {r['XLA GFLOP/cpu-s']:6.1f}  ratio "
              f"{r['cpu ratio']:.2f}", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--layers", default="", help="1-based layer indices, e.g. 2,3")
    parser.add_argument("--dirs", default=",".join(DIRECTIONS))
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    keep_freed_host_memory()
    layers = RESNET50 if not args.layers else [RESNET50[int(i) - 1] for i in
                                                args.layers.split(",")]
    directions = tuple(args.dirs.split(","))
    rows = []
    for layer in layers:
        rows += bench_layer(layer, args.batch, directions, args.repeats)
    for d in directions:
        sel = [r for r in rows if r["dir"] == d]
        rows.append({"layer": "geomean", "dir": d, "ratio": geomean([r["ratio"] for r in sel]),
                     "cpu ratio": geomean([r["cpu ratio"] for r in sel])})
    if args.no_write:
        return
    notes = (f"N={args.batch}, float32, NHWC; jaxdnn algo={ALGO!r} vs jax.lax.conv_general_dilated "
             "(backward: jax.vjp), both on all CPU cores. ratio = XLA time / jaxdnn time "
             "(> 1: jaxdnn faster). GFLOP/cpu-s divides by the process CPU time (all threads) "
             "instead of the wall time: it does not depend on how much of the cores other jobs "
             "leave to the benchmark.")
    write_results("conv_cpu", rows, ["layer", "dir", "jaxdnn GFLOP/s", "XLA GFLOP/s", "ratio",
                                     "jaxdnn GFLOP/cpu-s", "XLA GFLOP/cpu-s", "cpu ratio"],
                  notes=notes)


if __name__ == "__main__":
    main()
