"""The fused ops against the two things each replaces: XLA's own fusion of the same math (jax.lax
/ jax.nn, as a user writes it) and jaxdnn's unfused chain (the op, then its epilogue as separate
ops: jnp adds and jaxdnn's activation kernels, one more pass each).

    python benchmarks/bench_fused.py                  # both families, bfloat16 and float32
    python benchmarks/bench_fused.py --ops norm --dtypes bfloat16 --batch 256

norm: the fused batch norm (``activation="relu"``, ``residual=``) on ResNet-50's batch norms at
batch N (default 64), channels-last: every block's last batch norm takes the shortcut and the
ReLU ("bn+add+relu": 56x56x256, 28x28x512, 14x14x1024, 7x7x2048), the others the ReLU alone
("bn+relu": the stem's 112x112x64 and the blocks' inner widths).
conv: the fused convolution (``bias=``, ``activation=``, ``residual=``) on a ConvNeXt stage's
three convolutions at 56x56x96 (batch N, default 128: depthwise 7x7 + bias, 1x1 to 384 + bias +
GELU, 1x1 back + bias + residual) and a BN-folded inference ResNet layer (3x3 + bias + ReLU at
28x28x128, batch 64).

Directions (benchmarks/common.py DIRECTIONS_NOTE): fwd, and fwd+bwd under jit(value_and_grad)
with respect to every operand. Each (layer, dtype, direction) gives two rows, one per baseline;
ratio = baseline time / fused time (> 1: the fused op is faster). GB/s of minimal traffic: the
norm rows read x (and the residual) and write y, forward; read x and the cotangent (and the
residual) and write dx (and d(residual)), fwd+bwd; the conv rows count x, w, y and the residual
once each (forward) and twice (fwd+bwd), a floor rather than the kernels' traffic.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

import jaxdnn
from bench_norm import ref_batch_norm
from common import (BANDWIDTH_COLUMNS, DIRECTIONS_NOTE, FWD, FWD_BWD, add_row_args, compare,
                    default_trials, fwd_bwd, geomeans_note, keep_freed_host_memory,
                    rotating_inputs, rotation_for, run_cases, timing_note, write_results)

# (H, W, C) of ResNet-50's batch norms: block ends (with the shortcut), then the ReLU-only ones.
BLOCK_ENDS = [(56, 56, 256), (28, 28, 512), (14, 14, 1024), (7, 7, 2048)]
INNER = [(112, 112, 64), (56, 56, 64), (28, 28, 128), (14, 14, 256), (7, 7, 512)]


@dataclasses.dataclass(frozen=True)
class Case:
    """One fused op on one layer: its operands' shapes (the first is x-like, the residual, when
    there is one, the last; `params` index the float32 ones, the rest take the dtype), the
    three sides as functions of the operands, and the minimal forward traffic in elements of
    the op's dtype."""

    family: str
    op: str
    shapes: tuple
    params: tuple
    fused: Callable
    chain: Callable
    xla: Callable
    elements: int


def norm_cases(batch: int) -> list[Case]:
    out = []
    for residual, op, hwcs in ((True, "bn+add+relu", BLOCK_ENDS), (False, "bn+relu", INNER)):
        for hwc in hwcs:
            shape = (batch, *hwc)
            c = hwc[-1]

            def fused(x, s, b, *r):
                return jaxdnn.batch_norm(x, s, b, activation="relu", residual=r[0] if r else None)

            def chain(x, s, b, *r):
                y, m, v = jaxdnn.batch_norm(x, s, b)
                return jaxdnn.relu(y + r[0] if r else y), m, v

            def xla(x, s, b, *r):
                y, m, v = ref_batch_norm(-1)(x, s, b, fast=False)
                return jax.nn.relu(y + r[0] if r else y), m, v

            shapes = (shape, (c,), (c,)) + ((shape,) if residual else ())
            out.append(Case("norm", op, shapes, (1, 2), fused, chain, xla,
                            (3 if residual else 2) * math.prod(shape)))
    return out


def _lax_conv(x, w, groups):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    feature_group_count=groups)


def conv_cases(batch: int) -> list[Case]:
    """(op, x shape, w shape, groups, activation, residual?) of the ConvNeXt stage's
    convolutions and a BN-folded ResNet layer."""
    layers = [("dw7x7+bias", (batch, 56, 56, 96), (7, 7, 1, 96), 96, None, False),
              ("1x1+bias+gelu", (batch, 56, 56, 96), (1, 1, 96, 384), 1, "gelu", False),
              ("1x1+bias+residual", (batch, 56, 56, 384), (1, 1, 384, 96), 1, None, True),
              ("3x3+bias+relu", (max(1, batch // 2), 28, 28, 128), (3, 3, 128, 128), 1, "relu",
               False)]
    out = []
    for op, x_shape, w_shape, groups, act, residual in layers:
        y_shape = (*x_shape[:-1], w_shape[-1])
        acts = {None: (lambda v: v, lambda v: v), "gelu": (jaxdnn.gelu, jax.nn.gelu),
                "relu": (jaxdnn.relu, jax.nn.relu)}[act]

        def fused(x, w, b, *r, groups=groups, act=act):
            return jaxdnn.conv(x, w, padding="SAME", groups=groups, bias=b, activation=act,
                               residual=r[0] if r else None)

        def chain(x, w, b, *r, groups=groups, ours=acts[0]):
            y = jaxdnn.conv(x, w, padding="SAME", groups=groups) + b.astype(x.dtype)
            return ours(y + r[0] if r else y)

        def xla(x, w, b, *r, groups=groups, theirs=acts[1]):
            y = _lax_conv(x, w, groups) + b.astype(x.dtype)
            return theirs(y + r[0] if r else y)

        shapes = (x_shape, w_shape, (w_shape[-1],)) + ((y_shape,) if residual else ())
        elements = math.prod(x_shape) + math.prod(w_shape) + (2 if residual else 1) * math.prod(
            y_shape)
        out.append(Case("conv", op, shapes, (2,), fused, chain, xla, elements))
    return out


def bench_case(case: Case, dtype, directions, device, trials, repeats):
    """The case's rows: per direction, the fused op against each baseline."""
    nbytes = case.elements * jnp.dtype(dtype).itemsize

    def make(normal):  # the operands, then the cotangent of the (first) result
        ops = [normal(s, jnp.float32 if i in case.params else dtype)
               for i, s in enumerate(case.shapes)]
        if case.family == "norm":  # away from zero mean, as bench_norm's inputs
            ops[0] = (normal(case.shapes[0]) * 2 + 0.5).astype(dtype)
        y = jax.eval_shape(case.fused, *ops)
        return (*ops, normal((y[0] if isinstance(y, tuple) else y).shape, dtype))

    inputs = rotating_inputs(make, rotation_for(2 * nbytes), device=device)
    argnums = tuple(range(len(case.shapes)))
    rows = []
    for direction in (FWD, FWD_BWD):
        if direction not in directions:
            continue
        if direction == FWD:
            args, ours, bases, scale = [a[:-1] for a in inputs], case.fused, (case.chain,
                                                                               case.xla), 1
        else:
            args, ours = inputs, fwd_bwd(case.fused, argnums)
            bases, scale = (fwd_bwd(case.chain, argnums), fwd_bwd(case.xla, argnums)), 2
        for name, base in zip(("jaxdnn chain", "XLA"), bases):
            rows.append(compare(case.op, dtype, direction, case.shapes[0], ours, base, args,
                                scale * nbytes, trials, repeats, baseline=name))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", default=None, help="cpu or gpu (default: jax's default)")
    parser.add_argument("--ops", default="norm,conv", help="norm, conv or both")
    parser.add_argument("--batch", type=int, default=None,
                        help="N (default: norm 64, conv 128; CPU: 2)")
    parser.add_argument("--directions", default=f"{FWD},{FWD_BWD}")
    add_row_args(parser)
    args = parser.parse_args()
    keep_freed_host_memory()
    platform = args.platform or jax.default_backend()
    device = jax.devices(platform)[0]
    cpu = platform == "cpu"
    directions = set(args.directions.split(","))
    trials = default_trials(args.trials, platform)
    for family, cases, default_batch in (("norm", norm_cases, 64), ("conv", conv_cases, 128)):
        if family not in args.ops.split(","):
            continue
        rows = run_cases(cases(args.batch or (2 if cpu else default_batch)), args.dtypes, device,
                         lambda case, dt: bench_case(case, dt, directions, device, trials,
                                                     args.repeats))
        notes = (f"{DIRECTIONS_NOTE} Baselines: XLA (the same math on jax.lax / jax.nn, fused by "
                 "XLA) and jaxdnn's unfused chain (the op, then its epilogue as separate ops); "
                 "their times are in the xla_us / xla_GBps columns. ratio = baseline time / fused "
                 f"time. {geomeans_note(rows, 'baseline')} {timing_note(trials, args.repeats)} "
                 f"{args.note}").strip()
        write_results(f"{family}_fused", rows, ["op", "baseline"] + BANDWIDTH_COLUMNS[1:],
                      notes=notes, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
