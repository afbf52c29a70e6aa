"""Pooling: jaxdnn against jax.lax.reduce_window / jnp.mean, side by side in one process.

    PYTHONPATH=. python benchmarks/bench_pool.py            # default device (GPU if present)
    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/bench_pool.py

Shapes: 64x112x112x64 NHWC on a GPU (ResNet-50's stem maxpool input), 8x112x112x64 on a CPU.
Ops: max pool 3x3/2 pad 1 and 2x2/2, avg pool 3x3/2 pad 1 (both count_include_pad) and 2x2/2,
global average pool; float32 and bfloat16; three directions:
  fwd      y = pool(x)
  bwd      dx from saved residuals only (jax.vjp is taken outside the timed function and its
           residuals passed in): jaxdnn reads dy and the uint8 selection and writes dx, XLA's
           select_and_scatter reads x and dy and writes dx
  fwd+bwd  y and dx from x and dy in one jitted function (a training step's pooling cost)
GB/s count minimal traffic for each implementation: fwd reads x and writes y; bwd reads dy (and
jaxdnn's selection, or XLA's x, for max pooling) and writes dx; fwd+bwd is their sum without
the residual round trip for jaxdnn (it writes and reads the selection) and for XLA (it reads x
twice). speedup = XLA time / jaxdnn time. Each time is the median of `repeats` calls
(benchmarks/common.py), the best of `trials` such medians with the two implementations
alternating (on a shared CPU the noise between runs is larger than the differences).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


import jaxdnn
from common import geomean, keep_freed_host_memory, rotation_for, time_op, write_results

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


def traffic(kind, x_bytes, y_bytes, y_elems, implementation):
    """Minimal bytes of (fwd, bwd, fwd+bwd)."""
    fwd = x_bytes + y_bytes
    if kind != "max":
        return fwd, y_bytes + x_bytes, fwd + y_bytes + x_bytes
    if implementation == "jaxdnn":  # residual: the uint8 selection (1 byte per y element)
        return fwd, y_bytes + y_elems + x_bytes, fwd + y_elems + (y_bytes + y_elems + x_bytes)
    return fwd, x_bytes + y_bytes + x_bytes, fwd + (x_bytes + y_bytes + x_bytes)


def bench(name, dtype, shape, repeats, trials):
    window, strides, padding, kind = OPS[name]
    fns = {"jaxdnn": jaxdnn_fn(window, strides, padding, kind),
           "xla": xla_fn(window, strides, padding, kind)}
    x_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    rotate = rotation_for(2 * x_bytes)
    rng = np.random.default_rng(0)
    xs = [jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(rotate)]
    y_shape = jax.eval_shape(fns["xla"], xs[0]).shape
    cts = [jnp.asarray(rng.standard_normal(y_shape), dtype) for _ in range(rotate)]
    y_elems = int(np.prod(y_shape))
    y_bytes = y_elems * np.dtype(dtype).itemsize
    vjps = {impl: [jax.vjp(f, x)[1] for x in xs] for impl, f in fns.items()}  # residuals
    times = {impl: [float("inf")] * 3 for impl in fns}
    for _ in range(trials):  # the implementations alternate, so they share the noise
        for impl, f in fns.items():
            def step(x, ct, f=f):
                y, vjp = jax.vjp(f, x)
                return y, vjp(ct)[0]
            t = (time_op(f, [(x,) for x in xs], repeats=repeats),
                 time_op(lambda vjp, ct: vjp(ct)[0], list(zip(vjps[impl], cts)), repeats=repeats),
                 time_op(step, list(zip(xs, cts)), repeats=repeats))
            times[impl] = [min(a, b) for a, b in zip(times[impl], t)]
    del vjps
    out = []
    for i, direction in enumerate(("fwd", "bwd", "fwd+bwd")):
        row = {"op": name, "dtype": np.dtype(dtype).name, "dir": direction,
               "shape": "x".join(map(str, shape))}
        for impl in fns:
            t = times[impl][i]
            nbytes = traffic(kind, x_bytes, y_bytes, y_elems, impl)[i]
            row[f"{impl} us"] = t * 1e6
            row[f"{impl} GB/s"] = nbytes / t / 1e9
        row["speedup"] = times["xla"][i] / times["jaxdnn"][i]
        out.append(row)
        print(row, flush=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", nargs="*", default=list(OPS), choices=list(OPS))
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=None, help="N (default 64 GPU, 8 CPU)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--trials", type=int, default=None,
                        help="best of this many medians (default 3: one GPU trial once read "
                             "a 49 us row as 76 us)")
    args = parser.parse_args()
    keep_freed_host_memory()
    on_gpu = jax.devices()[0].platform == "gpu"
    n = args.batch or (64 if on_gpu else 8)
    repeats = args.repeats or (20 if on_gpu else 5)
    trials = args.trials or 3
    shape = (n, 112, 112, 64)
    rows = []
    for name in args.ops:
        for dt in args.dtypes:
            rows += bench(name, jnp.dtype(dt), shape, repeats, trials)
    columns = ["op", "dtype", "dir", "shape", "jaxdnn us", "xla us", "speedup", "jaxdnn GB/s",
               "xla GB/s"]
    notes = (f"geomean speedup {geomean([r['speedup'] for r in rows]):.2f}x over "
             f"{len(rows)} rows. " + __doc__.split("\n\n")[2].replace("\n", " "))
    write_results("pool", rows, columns, notes=notes)


if __name__ == "__main__":
    main()
