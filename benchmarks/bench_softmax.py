"""softmax and log_softmax: jaxdnn vs jax.nn on the default jax device (CPU or GPU), in one
process.

    python benchmarks/bench_softmax.py [--shape 32768 4096] [--extra] [--repeats 20]

Both directions, float32 and bfloat16, over the last axis. GB/s are of minimal traffic: forward
reads x and writes y (2N elements); backward reads y and dy and writes dx (3N). The backward is
the vjp function each implementation returns, applied to dy under jit: it runs from the
residuals that implementation saved (y for jaxdnn; y and the row statistics for jax.nn).
Default shape: 32768x4096 on a GPU (the issue's), 1024x4096 on a CPU. --extra adds rows that
take the other GPU paths: 262144x256 (a warp per row) and 1024x65536 (the online kernel).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np


import jaxdnn
from common import (add_row_args, bandwidth_row, best_times, default_trials, geomean,
                    keep_freed_host_memory, rotating_inputs, rotation_for, write_results)

FUNCS = {"softmax": (jaxdnn.softmax, jax.nn.softmax),
         "log_softmax": (jaxdnn.log_softmax, jax.nn.log_softmax)}

COLUMNS = ["op", "dtype", "direction", "shape", "jaxdnn_us", "xla_us", "jaxdnn_GBps", "xla_GBps",
           "ratio"]


def _apply_vjp(vjp_fn, dy):
    return vjp_fn(dy)[0]


def run(shapes, dtypes, repeats, trials):
    rows = []
    device = jax.devices()[0]
    for shape in shapes:
        n = int(np.prod(shape))
        for dtype in dtypes:
            itemsize = np.dtype(dtype).itemsize
            rotate = rotation_for(3 * n * itemsize)
            inputs = rotating_inputs(
                lambda rng: (np.asarray(rng.standard_normal(shape) * 3, dtype),
                             np.asarray(rng.standard_normal(shape), dtype)), rotate, device=device)
            fwd_inputs = [(x,) for x, _ in inputs]
            for name, (ours, ref) in FUNCS.items():
                times = {"fwd": best_times(ours, ref, fwd_inputs, fwd_inputs, trials, repeats)}
                vjps = [[(jax.vjp(jax.jit(f), x)[1], dy) for x, dy in inputs] for f in (ours, ref)]
                times["bwd"] = best_times(_apply_vjp, _apply_vjp, *vjps, trials, repeats)
                del vjps
                for direction, elems in (("fwd", 2 * n), ("bwd", 3 * n)):
                    t_ours, t_ref = times[direction]
                    rows.append(bandwidth_row(name, dtype, direction, shape,
                                              elems * itemsize, t_ours, t_ref))
                    print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs="+", default=None)
    parser.add_argument("--extra", action="store_true", help="also time the other GPU paths")
    add_row_args(parser)
    args = parser.parse_args()
    keep_freed_host_memory()
    on_gpu = jax.devices()[0].platform == "gpu"
    shapes = [tuple(args.shape) if args.shape else ((32768, 4096) if on_gpu else (1024, 4096))]
    if args.extra:
        shapes += [(262144, 256), (1024, 65536)]
    trials = default_trials(args.trials)
    rows = run(shapes, [jnp.dtype(d) for d in args.dtypes], args.repeats, trials)
    notes = ("GB/s of minimal traffic: fwd 2N elements (read x, write y), bwd 3N (read y and dy, "
             "write dx). ratio = xla_us / jaxdnn_us (> 1: jaxdnn faster). bwd = each "
             "implementation's vjp function (its saved residuals) applied to dy. Times: best of "
             f"{trials} interleaved rounds of `repeats` calls. Geomean ratio: "
             f"{geomean([r['ratio'] for r in rows]):.3f}. {args.note}".strip())
    write_results("softmax", rows, COLUMNS, notes=notes)


if __name__ == "__main__":
    main()
