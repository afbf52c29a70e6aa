"""Activations: jaxdnn vs jax.nn on the default jax device (CPU or GPU), in one process.

    python benchmarks/bench_activation.py [--shape 32768 4096] [--ops relu gelu] [--repeats 20]

float32 and bfloat16, three directions (benchmarks/common.py DIRECTIONS_NOTE): fwd; fwd+bwd,
jit(value_and_grad(lambda x: sum(f(x) * ct))) on both sides; bwd (same inputs),
jit(lambda x, dy: vjp(f, x)[1](dy)) on both sides, which starts from x and dy on both: XLA
fuses jax.nn's into one pass from x, and jaxdnn's unused forward is dead code, so it is our
backward kernel alone. GB/s of minimal traffic: fwd reads x and writes y (2N elements); fwd+bwd
and bwd read x and ct (dy) and write dx (3N). Default shape: 32768x4096 on a GPU, 1024x4096 on
a CPU (16 MiB of float32, past the caches of a small machine once rotated).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

import jaxdnn
from common import (BANDWIDTH_COLUMNS, BWD_SAME, DIRECTIONS_NOTE, FWD, FWD_BWD, add_row_args,
                    backward, compare, default_trials, fwd_bwd, geomeans_note,
                    keep_freed_host_memory, rotating_inputs, rotation_for, timing_note,
                    write_results)

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


def run(shape, ops, dtypes, repeats, trials):
    rows = []
    n = int(np.prod(shape))
    for dtype in dtypes:
        nbytes = n * np.dtype(dtype).itemsize
        inputs = rotating_inputs(lambda normal: (normal(shape, dtype) * 2, normal(shape, dtype)),
                                 rotation_for(3 * nbytes))
        fwd_inputs = [(x,) for x, _ in inputs]
        for name in ops:
            ours, ref = OPS[name]
            for direction, wrap, args, traffic in ((FWD, lambda f: f, fwd_inputs, 2),
                                                   (FWD_BWD, fwd_bwd, inputs, 3),
                                                   (BWD_SAME, backward, inputs, 3)):
                rows.append(compare(name, dtype, direction, shape, wrap(ours), wrap(ref), args,
                                    traffic * nbytes, trials, repeats))
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
    trials = default_trials(args.trials)
    rows = run(shape, args.ops, [jnp.dtype(d) for d in args.dtypes], args.repeats, trials)
    notes = (f"{DIRECTIONS_NOTE} Here {BWD_SAME} = jit(lambda x, dy: vjp(f, x)[1](dy)): both "
             "sides start from x and dy. GB/s of minimal traffic: fwd 2N elements (read x, "
             f"write y), {FWD_BWD} and {BWD_SAME} 3N (read x and ct, write dx). ratio = xla_us / "
             f"jaxdnn_us (> 1: jaxdnn faster). {geomeans_note(rows)} "
             f"{timing_note(trials, args.repeats)} {args.note}").strip()
    write_results("activation", rows, BANDWIDTH_COLUMNS, notes=notes, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
