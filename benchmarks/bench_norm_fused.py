"""The fused batch norm (``activation="relu"``, ``residual=``) on ResNet-50's batch norms, against
the two things it replaces: XLA's own fusion of the same math (jnp, as a user writes it) and
jaxdnn's unfused chain (batch_norm, then +, then jaxdnn.relu: one more pass per op).

    python benchmarks/bench_norm_fused.py                    # N=64, bfloat16 and float32
    python benchmarks/bench_norm_fused.py --dtypes bfloat16 --batch 256

Layers (channels-last, ResNet-50 at batch N): every block's last batch norm takes the shortcut
and the ReLU ("bn+add+relu": 56x56x256, 28x28x512, 14x14x1024, 7x7x2048), the others the ReLU
alone ("bn+relu": the stem's 112x112x64 and the blocks' inner widths). Directions as
bench_norm.py (benchmarks/common.py DIRECTIONS_NOTE): fwd, and fwd+bwd under
jit(value_and_grad) with respect to x, scale, bias (and the residual). Each (layer, dtype,
direction) gives two rows, one per baseline; ratio = baseline time / fused time (> 1: the fused
op is faster). GB/s of minimal traffic: fwd read x (and the residual) + write y; fwd+bwd read
x and the cotangent (and the residual) + write dx (and d(residual)).
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp

import jaxdnn
from bench_norm import ref_batch_norm
from common import (BANDWIDTH_COLUMNS, DIRECTIONS_NOTE, FWD, FWD_BWD, add_row_args, compare,
                    default_trials, fwd_bwd, geomeans_note, keep_freed_host_memory,
                    rotating_inputs, rotation_for, timing_note, write_results)

# (H, W, C) of ResNet-50's batch norms: block ends (with the shortcut), then the ReLU-only ones.
BLOCK_ENDS = [(56, 56, 256), (28, 28, 512), (14, 14, 1024), (7, 7, 2048)]
INNER = [(112, 112, 64), (56, 56, 64), (28, 28, 128), (14, 14, 256), (7, 7, 512)]


def layers(batch: int):
    """(op, shape, residual?) of every batch norm kind in the network."""
    return ([("bn+add+relu", (batch, *hwc), True) for hwc in BLOCK_ENDS] +
            [("bn+relu", (batch, *hwc), False) for hwc in INNER])


def sides(residual: bool):
    """(fused, jaxdnn chain, XLA): f(x, scale, bias, r) -> (y, mean, var); r is unused
    without a residual."""
    def fused(x, s, b, r):
        return jaxdnn.batch_norm(x, s, b, activation="relu", residual=r if residual else None)

    def chain(x, s, b, r):
        y, m, v = jaxdnn.batch_norm(x, s, b)
        return jaxdnn.relu(y + r if residual else y), m, v

    def xla(x, s, b, r):
        y, m, v = ref_batch_norm(-1)(x, s, b, fast=False)
        return jax.nn.relu(y + r if residual else y), m, v

    return fused, chain, xla


def bench_layer(op, shape, residual, dtype, directions, device, trials, repeats):
    nbytes = math.prod(shape) * jnp.dtype(dtype).itemsize
    c = shape[-1]

    def make(normal):  # x, scale, bias, residual, cotangent
        return ((normal(shape) * 2 + 0.5).astype(dtype), normal((c,)), normal((c,)),
                normal(shape, dtype), normal(shape, dtype))

    inputs = rotating_inputs(make, rotation_for((4 if residual else 3) * nbytes), device=device)
    fused, chain, xla = sides(residual)
    rows = []
    for direction in (FWD, FWD_BWD):
        if direction not in directions:
            continue
        if direction == FWD:
            args = [a[:-1] for a in inputs]
            ours, bases = fused, (chain, xla)
            traffic = 3 if residual else 2
        else:
            args = inputs
            argnums = (0, 1, 2, 3) if residual else (0, 1, 2)
            ours = fwd_bwd(fused, argnums)
            bases = (fwd_bwd(chain, argnums), fwd_bwd(xla, argnums))
            traffic = 5 if residual else 3
        for name, base in zip(("jaxdnn chain", "XLA"), bases):
            rows.append(compare(op, dtype, direction, shape, ours, base, args, traffic * nbytes,
                                trials, repeats, baseline=name))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", default=None, help="cpu or gpu (default: jax's default)")
    parser.add_argument("--batch", type=int, default=None, help="N (default 64; CPU: 4)")
    parser.add_argument("--directions", default=f"{FWD},{FWD_BWD}")
    add_row_args(parser)
    args = parser.parse_args()
    keep_freed_host_memory()
    platform = args.platform or jax.default_backend()
    device = jax.devices(platform)[0]
    batch = args.batch or (4 if platform == "cpu" else 64)
    directions = set(args.directions.split(","))
    trials = default_trials(args.trials, platform)
    rows = []
    with jax.default_device(device):
        for op, shape, residual in layers(batch):
            for dt in args.dtypes:
                rows += bench_layer(op, shape, residual, jnp.dtype(dt), directions, device,
                                    trials, args.repeats)
    notes = (f"{DIRECTIONS_NOTE} Baselines: XLA (the same math in jnp, fused by XLA) and "
             "jaxdnn's unfused chain (batch_norm, +, relu); their times are in the xla_us / "
             "xla_GBps columns. ratio = baseline time / fused time. "
             f"{geomeans_note(rows, 'baseline')} {timing_note(trials, args.repeats)} "
             f"{args.note}").strip()
    write_results("norm_fused", rows, ["op", "baseline"] + BANDWIDTH_COLUMNS[1:], notes=notes,
                  out_dir=args.out_dir)


if __name__ == "__main__":
    main()
