"""Pooling: jaxdnn against jax.lax.reduce_window / jnp.mean, side by side in one process.

    PYTHONPATH=. python benchmarks/bench_pool.py            # default device (GPU if present)
    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/bench_pool.py [--batch 1]

Shapes: 64x112x112x64 NHWC on a GPU (ResNet-50's stem maxpool input), 8x112x112x64 on a CPU.
Ops: max pool 3x3/2 pad 1 and 2x2/2, avg pool 3x3/2 pad 1 (count_include_pad, and excluding
padding) and 2x2/2, global average pool; float32 and bfloat16.

Directions: fwd, y = pool(x); fwd+bwd, jit(value_and_grad(lambda x: sum(pool(x) * ct))) on both
sides; bwd (same inputs) only for the average pools, whose backward reads dy alone on both sides
(jit(lambda x, dy: vjp(pool, x)[1](dy)), the forward dead code). Max pooling has no
backward-only row: jaxdnn's backward reads the selection its forward saved, XLA's
select_and_scatter recomputes it from x. GB/s of minimal traffic: fwd reads x and writes y;
fwd+bwd reads x and ct and writes dx; bwd reads dy and writes dx. Times: best of `trials` rounds
(3 by default, on a GPU too), the two implementations alternating.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxdnn
from common import (BANDWIDTH_COLUMNS, BWD_SAME, DIRECTIONS_NOTE, FWD, FWD_BWD, add_row_args,
                    backward, compare, fwd_bwd, geomeans_note, keep_freed_host_memory,
                    rotating_inputs, rotation_for, timing_note, write_results)

# name -> (window, strides, padding, kind); kind in max / avg / avg_exclude_pad / global.
OPS = {
    "maxpool3x3s2": (3, 2, 1, "max"),
    "maxpool2x2s2": (2, 2, 0, "max"),
    "avgpool3x3s2": (3, 2, 1, "avg"),
    "avgpool3x3s2_excl": (3, 2, 1, "avg_exclude_pad"),
    "avgpool2x2s2": (2, 2, 0, "avg"),
    "global_avgpool": (None, None, None, "global"),
}


def jaxdnn_fn(window, strides, padding, kind):
    if kind == "global":
        return jaxdnn.global_avg_pool
    if kind == "max":
        return lambda x: jaxdnn.max_pool(x, window, strides, padding)
    return lambda x: jaxdnn.avg_pool(x, window, strides, padding,
                                     count_include_pad=kind == "avg")


def xla_fn(window, strides, padding, kind):
    """The jax.lax path (what flax.linen.max_pool / avg_pool lower to)."""
    if kind == "global":
        return lambda x: jnp.mean(x, axis=(1, 2))
    dims, strd = (1, window, window, 1), (1, strides, strides, 1)
    pads = ((0, 0), (padding, padding), (padding, padding), (0, 0))
    if kind == "max":
        return lambda x: lax.reduce_window(x, -jnp.inf, lax.max, dims, strd, pads)

    def avg(x):
        total = lax.reduce_window(x, np.array(0, x.dtype), lax.add, dims, strd, pads)
        if kind == "avg":
            return total / (window * window)
        ones = jnp.ones((1, *x.shape[1:3], 1), x.dtype)
        return total / lax.reduce_window(ones, np.array(0, x.dtype), lax.add, dims, strd, pads)
    return avg


def bench(name, dtype, shape, repeats, trials):
    window, strides, padding, kind = OPS[name]
    ours, ref = jaxdnn_fn(window, strides, padding, kind), xla_fn(window, strides, padding, kind)
    y_shape = jax.eval_shape(ref, jax.ShapeDtypeStruct(shape, dtype)).shape
    x_bytes, y_bytes = (int(np.prod(s)) * np.dtype(dtype).itemsize for s in (shape, y_shape))
    inputs = rotating_inputs(lambda normal: (normal(shape, dtype), normal(y_shape, dtype)),
                             rotation_for(2 * x_bytes))
    directions = [(FWD, ours, ref, [(x,) for x, _ in inputs], x_bytes + y_bytes),
                  (FWD_BWD, fwd_bwd(ours), fwd_bwd(ref), inputs, 2 * x_bytes + y_bytes)]
    if kind != "max":  # linear: neither side's backward reads x
        directions.append((BWD_SAME, backward(ours), backward(ref), inputs, x_bytes + y_bytes))
    return [compare(name, dtype, d, shape, f_ours, f_ref, args, nbytes, trials, repeats)
            for d, f_ours, f_ref, args, nbytes in directions]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", nargs="*", default=list(OPS), choices=list(OPS))
    parser.add_argument("--batch", type=int, default=None, help="N (default 64 GPU, 8 CPU)")
    add_row_args(parser, repeats=None)
    args = parser.parse_args()
    keep_freed_host_memory()
    on_gpu = jax.devices()[0].platform == "gpu"
    n = args.batch or (64 if on_gpu else 8)
    repeats = args.repeats or (20 if on_gpu else 5)
    trials = args.trials or 3  # also on a GPU: one GPU trial once read a 49 us row as 76 us
    rows = []
    for name in args.ops:
        for dt in args.dtypes:
            rows += bench(name, jnp.dtype(dt), (n, 112, 112, 64), repeats, trials)
    directions = " ".join(__doc__.split("\n\n")[3].split())  # the docstring's paragraph
    notes = (f"{DIRECTIONS_NOTE} {directions} ratio = xla_us / jaxdnn_us (> 1: jaxdnn faster). "
             f"{geomeans_note(rows)} {timing_note(trials, repeats)} {args.note}").strip()
    write_results("pool", rows, BANDWIDTH_COLUMNS, notes=notes, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
