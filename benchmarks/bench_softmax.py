"""softmax and log_softmax: jaxdnn vs jax.nn on the default jax device (CPU or GPU), in one
process.

    python benchmarks/bench_softmax.py [--shape 32768 4096] [--extra] [--repeats 20]

float32 and bfloat16 over the last axis, two directions (benchmarks/common.py DIRECTIONS_NOTE):
fwd and fwd+bwd, jit(value_and_grad(lambda x: sum(f(x) * ct))) on both sides. There are no
backward-only rows: the two sides save different tensors for the backward (jaxdnn y, jax.nn
its own intermediates and row statistics). GB/s of minimal traffic: fwd reads x and writes y
(2N elements), fwd+bwd reads x and ct and writes dx (3N). Default shape: 32768x4096 on a GPU,
1024x4096 on a CPU. --extra adds rows that take the other GPU paths: 262144x256 (a warp per
row) and 1024x65536 (the online kernel).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jaxdnn
from common import (BANDWIDTH_COLUMNS, DIRECTIONS_NOTE, FWD, FWD_BWD, add_row_args, compare,
                    default_trials, fwd_bwd, geomeans_note, keep_freed_host_memory,
                    rotating_inputs, rotation_for, timing_note, write_results)

FUNCS = {"softmax": (jaxdnn.softmax, jax.nn.softmax),
         "log_softmax": (jaxdnn.log_softmax, jax.nn.log_softmax)}


def run(shapes, dtypes, repeats, trials):
    rows = []
    for shape in shapes:
        n = int(np.prod(shape))
        for dtype in dtypes:
            nbytes = n * np.dtype(dtype).itemsize
            inputs = rotating_inputs(
                lambda normal: (normal(shape, dtype) * 3, normal(shape, dtype)),
                rotation_for(3 * nbytes))
            fwd_inputs = [(x,) for x, _ in inputs]
            for name, (ours, ref) in FUNCS.items():
                rows.append(compare(name, dtype, FWD, shape, ours, ref, fwd_inputs, 2 * nbytes,
                                    trials, repeats))
                rows.append(compare(name, dtype, FWD_BWD, shape, fwd_bwd(ours), fwd_bwd(ref),
                                    inputs, 3 * nbytes, trials, repeats))
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
    notes = (f"{DIRECTIONS_NOTE} No backward-only rows: the two sides' vjps keep different "
             "tensors. GB/s of minimal traffic: fwd 2N elements (read x, write y), fwd+bwd 3N "
             "(read x and ct, write dx). ratio = xla_us / jaxdnn_us (> 1: jaxdnn faster). "
             f"{geomeans_note(rows)} {timing_note(trials, args.repeats)} {args.note}").strip()
    write_results("softmax", rows, BANDWIDTH_COLUMNS, notes=notes, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
