"""Activations: jaxdnn vs jax.nn on the default jax device (CPU or GPU), in one process.

    python benchmarks/bench_activation.py [--shape 32768 4096] [--ops relu gelu] [--repeats 20]

Both directions, float32 and bfloat16. GB/s are of minimal traffic: forward reads x and writes
y (2N elements); backward reads x and dy and writes dx (3N). The backward is
``jit(lambda x, dy: vjp(f, x)[1](dy))`` for both sides: XLA fuses jax.nn's into one pass from x,
and for jaxdnn the unused forward is dead code, so it is our backward kernel alone.
Default shape: 32768x4096 on a GPU (the issue's), 1024x4096 on a CPU (16 MiB of float32, past
the caches of a small machine once rotated).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np


import jaxdnn
from common import (add_row_args, bandwidth_row, best_times, default_trials, geomean,
                    keep_freed_host_memory, rotating_inputs, rotation_for, write_results)

OPS = {
    "relu": (jaxdnn.relu, jax.nn.relu),
    "relu6": (jaxdnn.relu6, jax.nn.relu6),
    "leaky_relu": (jaxdnn.leaky_relu, jax.nn.leaky_relu),
    "elu": (jaxdnn.elu, jax.nn.elu),
    "sigmoid": (jaxdnn.sigmoid, jax.nn.sigmoid),
    "tanh": (jaxdnn.tanh, jnp.tanh),
    "gelu": (jaxdnn.gelu, jax.nn.gelu),
    "gelu_exact": (functools.partial(jaxdnn.gelu, approximate=False),
                   functools.partial(jax.nn.gelu, approximate=False)),
    "silu": (jaxdnn.silu, jax.nn.silu),
    "softplus": (jaxdnn.softplus, jax.nn.softplus),
}

COLUMNS = ["op", "dtype", "direction", "shape", "jaxdnn_us", "xla_us", "jaxdnn_GBps", "xla_GBps",
           "ratio"]


def backward(f):
    return lambda x, dy: jax.vjp(f, x)[1](dy)[0]


def run(shape, ops, dtypes, repeats, trials):
    rows = []
    device = jax.devices()[0]
    for dtype in dtypes:
        itemsize = np.dtype(dtype).itemsize
        n = int(np.prod(shape))
        rotate = rotation_for(3 * n * itemsize)
        inputs = rotating_inputs(
            lambda rng: (np.asarray(rng.standard_normal(shape) * 2, dtype),
                         np.asarray(rng.standard_normal(shape), dtype)), rotate, device=device)
        fwd_inputs = [(x,) for x, _ in inputs]
        for name in ops:
            ours, ref = OPS[name]
            for direction, elems, args, wrap in (("fwd", 2 * n, fwd_inputs, lambda f: f),
                                                  ("bwd", 3 * n, inputs, backward)):
                t_ours, t_ref = best_times(wrap(ours), wrap(ref), args, args, trials, repeats)
                rows.append(bandwidth_row(name, dtype, direction, shape, elems * itemsize,
                                          t_ours, t_ref))
                print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs="+", default=None)
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    add_row_args(parser)
    args = parser.parse_args()
    keep_freed_host_memory()
    on_gpu = jax.devices()[0].platform == "gpu"
    shape = tuple(args.shape) if args.shape else ((32768, 4096) if on_gpu else (1024, 4096))
    dtypes = [jnp.dtype(d) for d in args.dtypes]
    trials = default_trials(args.trials)
    rows = run(shape, args.ops, dtypes, args.repeats, trials)
    notes = ("GB/s of minimal traffic: fwd 2N elements (read x, write y), bwd 3N (read x and dy, "
             "write dx). ratio = xla_us / jaxdnn_us (> 1: jaxdnn faster). bwd = "
             f"jit(vjp(f, x)(dy)) for both. Times: best of {trials} interleaved rounds of "
             "`repeats` calls. Geomean ratio: "
             f"{geomean([r['ratio'] for r in rows]):.3f}. {args.note}".strip())
    write_results("activation", rows, COLUMNS, notes=notes)


if __name__ == "__main__":
    main()
