"""End to end: one SGD training step of whole networks on jaxdnn's ops against the same networks
on jax.lax / jax.nn, side by side in one process, from the same initialisation.

    PYTHONPATH=. python benchmarks/bench_e2e.py                     # the GPU configurations
    PYTHONPATH=. python benchmarks/bench_e2e.py --models resnet50 --steps 20
    PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/bench_e2e.py --quick   # seconds, any host

Networks (jaxdnn/examples/networks.py, written once on an `Ops` table, jaxdnn_ops or lax_ops):
ResNet-50 at 224x224 (batch 128 and 256 in bfloat16, 128 in float32), ResNet-18 with a CIFAR stem
at 32x32 (batch 512) and a ConvNeXt stage of 3 blocks on 56x56x96 feature maps (batch 128), NHWC.
bfloat16 computes in bfloat16 with float32 master weights (the parameters are cast inside the
step); float32 is JAX's default precision on both sides (TF32 convolutions on a GPU, as a user
gets them). The step is jaxdnn/examples/train.py's Trainer: jit(value_and_grad(loss)) and an SGD
update with momentum 0.9, its buffers donated, on one fixed random batch already on the device.

Method: both sides take LOSS_STEPS steps from the same parameters (compiling on the first); the
relative difference of their losses at the last of them is the loss column. Then --warmup more
steps, then --windows windows of --steps steps each, one block_until_ready per window, the two
sides alternating which goes first; images/s is that of each side's median window, and
ratio = jaxdnn images/s / lax images/s (> 1: jaxdnn is faster). --quick runs every network once
per dtype at tiny sizes (a smoke test: its numbers mean nothing). --unfused adds a third side,
the same networks on jaxdnn with every epilogue (bias, residual add, activation) as its own op
after the convolution or batch norm (models.jaxdnn_ops(fused=False): the networks as they ran
before the fused ops), timed in the same windows: the baseline the fused ops are measured
against (unfused_img_s, unfused_ratio = its images/s / lax's).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from jaxdnn.examples import models, networks
from jaxdnn.examples.models import jaxdnn_ops, lax_ops
from jaxdnn.examples.optim import sgd
from jaxdnn.examples.train import Trainer
from common import keep_freed_host_memory, write_results

LOSS_STEPS = 10
LEARNING_RATE = 0.01
# (network, dtype, batch) of the default run, in order.
RUNS = [("resnet50", "bfloat16", 128), ("resnet50", "bfloat16", 256),
        ("resnet50", "float32", 128), ("resnet18", "bfloat16", 512),
        ("resnet18", "float32", 512), ("convnext", "bfloat16", 128), ("convnext", "float32", 128)]
NETWORKS = tuple(dict.fromkeys(name for name, _, _ in RUNS))
QUICK_BATCH, QUICK_WIDTH = 2, 8  # --quick: the batch, and the ResNets' width (64 otherwise)
# --steps (per timed window), --windows (per side) and --warmup: by default, and under --quick
TIMING = {"steps": 10, "windows": 5, "warmup": 3}
QUICK_TIMING = {"steps": 2, "windows": 2, "warmup": 1}
UNFUSED_COLUMNS = ["unfused_img_s", "unfused_ratio", "unfused_ms"]
COLUMNS = ["model", "dtype", "batch", "input", "lax_img_s", "jaxdnn_img_s", "ratio", "lax_ms",
           "jaxdnn_ms", "loss_rel_diff"]


def network(name: str, quick: bool = False):
    """(init(key) -> (params, state), apply, input shape (H, W, C), classes) of a network by
    name; tiny under `quick` (ResNet-50 at 64x64 keeps 2x2 maps in its last stage, so that its
    batch statistics are not over single pixels)."""
    width = QUICK_WIDTH if quick else 64
    if name == "resnet50":
        shape = (64, 64, 3) if quick else (224, 224, 3)
        return (lambda key: networks.init_resnet(key, 50, 1000, shape, width=width),
                networks.apply_resnet, shape, 1000)
    if name == "resnet18":
        shape = (16, 16, 3) if quick else (32, 32, 3)
        return (lambda key: networks.init_resnet(key, 18, 10, shape, cifar_stem=True,
                                                 width=width),
                networks.apply_resnet, shape, 10)
    if name == "cnn":  # the training example's small ResNet (not in RUNS: bench_scaling's)
        shape = (8, 8, 3) if quick else (32, 32, 3)
        return (lambda key: models.init_cnn(key, shape, 10, width=8 if quick else 32),
                models.apply_cnn, shape, 10)
    if name == "convnext":
        shape = (8, 8, 16) if quick else (56, 56, 96)
        return (lambda key: networks.init_convnext_stage(key, 1000, shape, blocks=3),
                networks.apply_convnext_stage, shape, 1000)
    raise ValueError(f"unknown network {name!r}; one of {', '.join(NETWORKS)}")


class Side:
    """One side of the comparison: a Trainer on one Ops table and its own copy of the training
    state (the step donates its buffers)."""

    def __init__(self, ops, apply, dtype, params, state):
        self.name = ops.name
        opt = sgd(LEARNING_RATE, momentum=0.9)
        self.trainer = Trainer(apply, ops, jnp.dtype(dtype), opt)
        params, state = jax.tree.map(jnp.array, (params, state))  # copies
        self.carry = (params, state, opt.init(params))

    def steps(self, n: int, x, y):
        """Runs n steps on (x, y), waits for the last, and returns its loss."""
        params, state, opt_state = self.carry
        for _ in range(n):
            params, state, opt_state, loss = self.trainer.step(params, state, opt_state, x, y)
        self.carry = (params, state, opt_state)
        return jax.block_until_ready((loss, self.carry))[0]


def sides(name: str, dtype: str, batch: int, quick: bool = False, seed: int = 0,
          unfused: bool = False):
    """The (lax, jaxdnn[, jaxdnn unfused]) Sides of a configuration from one initialisation, and
    one random batch (x, y) on the default device. float32 runs at JAX's default precision on
    every side."""
    init, apply, shape, classes = network(name, quick)
    params, state = init(jax.random.key(seed))
    kx, ky = jax.random.split(jax.random.key(seed + 1))
    x = jax.random.normal(kx, (batch, *shape), jnp.float32)
    y = jax.random.randint(ky, (batch,), 0, classes)
    tables = [lax_ops(precision=None), jaxdnn_ops(precision=None)]
    if unfused:
        tables.append(jaxdnn_ops(precision=None, fused=False))
    return [Side(ops, apply, dtype, params, state) for ops in tables], (x, y)


def median_step_seconds(sides, x, y, steps: int, windows: int) -> list[float]:
    """Each side's seconds per step: the median of `windows` windows of `steps` steps, one
    block_until_ready per window, the sides alternating which goes first."""
    times = [[] for _ in sides]
    for w in range(windows):
        for i in range(len(sides)) if w % 2 == 0 else reversed(range(len(sides))):
            start = time.perf_counter()
            sides[i].steps(steps, x, y)
            times[i].append((time.perf_counter() - start) / steps)
    return [statistics.median(t) for t in times]


def measure(name: str, dtype: str, batch: int, args) -> dict:
    """One row: the sides' images/s, their ratios and the loss difference after LOSS_STEPS."""
    all_sides, (x, y) = sides(name, dtype, batch, args.quick, unfused=args.unfused)
    t0 = time.perf_counter()
    losses = [float(side.steps(LOSS_STEPS, x, y)) for side in all_sides]
    for side in all_sides:
        side.steps(args.warmup, x, y)
    t_lax, t_ours, *t_unfused = median_step_seconds(all_sides, x, y, args.steps, args.windows)
    row = {"model": name, "dtype": dtype, "batch": batch, "input": "x".join(map(str, x.shape[1:])),
           "lax_img_s": batch / t_lax, "jaxdnn_img_s": batch / t_ours, "ratio": t_lax / t_ours,
           "lax_ms": t_lax * 1e3, "jaxdnn_ms": t_ours * 1e3, "lax_loss": losses[0],
           "jaxdnn_loss": losses[1], "loss_rel_diff": abs(losses[1] - losses[0]) / abs(losses[0])}
    if t_unfused:
        row.update(unfused_img_s=batch / t_unfused[0], unfused_ratio=t_lax / t_unfused[0],
                   unfused_ms=t_unfused[0] * 1e3)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
          + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return row


def runs(models, quick: bool) -> list[tuple[str, str, int]]:
    """The (network, dtype, batch) of RUNS for `models`; under quick, each (network, dtype) once
    at QUICK_BATCH."""
    selected = [r for r in RUNS if r[0] in models]
    if quick:
        selected = list(dict.fromkeys((m, dt, QUICK_BATCH) for m, dt, _ in selected))
    return selected


def _at_least(minimum: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, not {value}")
        return value
    return parse


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(NETWORKS),
                        help=f"comma-separated, of {', '.join(NETWORKS)}")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few steps")
    for flag, minimum, what in (("steps", 1, "steps per timed window"),
                                ("windows", 1, "timed windows per side"),
                                ("warmup", 0, f"untimed steps after the {LOSS_STEPS} loss steps")):
        parser.add_argument(f"--{flag}", type=_at_least(minimum), default=None,
                            help=f"{what} (default {TIMING[flag]}, quick {QUICK_TIMING[flag]})")
    parser.add_argument("--unfused", action="store_true",
                        help="also time jaxdnn with the epilogues unfused (the baseline)")
    parser.add_argument("--note", default="", help="appended to the notes of the results table")
    parser.add_argument("--out-dir", default=None,
                        help="where the table goes (default: benchmarks/results)")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    for m in models:
        try:
            network(m)
        except ValueError as e:  # before any work
            parser.error(str(e))
    for flag, value in (QUICK_TIMING if args.quick else TIMING).items():
        if getattr(args, flag) is None:
            setattr(args, flag, value)
    keep_freed_host_memory()
    todo = runs(models, args.quick)
    rows = []
    for i, (name, dtype, batch) in enumerate(todo):
        rows.append(measure(name, dtype, batch, args))
        # Written after each configuration, so that a run stopped part-way leaves its table.
        partial = "" if i + 1 == len(todo) else f" Partial run: {i + 1} of {len(todo)} rows."
        notes = (f"{'--quick (tiny sizes: a smoke test). ' if args.quick else ''}One training "
                 "step (benchmarks/bench_e2e.py): jit(value_and_grad) of the cross-entropy and an "
                 f"SGD update (momentum 0.9, lr {LEARNING_RATE}), buffers donated, one fixed "
                 "random batch on the device; bfloat16 = bfloat16 compute with float32 master "
                 "weights, float32 = JAX's default precision on both sides (TF32 convolutions on "
                 f"a GPU). Images/s of the median of {args.windows} windows of {args.steps} "
                 "steps, one block_until_ready per window, the sides alternating, after "
                 f"{LOSS_STEPS + args.warmup} steps; ratio = jaxdnn / lax images/s (> 1: jaxdnn "
                 "is faster). loss_rel_diff = |jaxdnn loss - lax loss| / |lax loss| at step "
                 f"{LOSS_STEPS} from the same initialisation.{partial} {args.note}").strip()
        columns = COLUMNS + (UNFUSED_COLUMNS if args.unfused else [])
        write_results("e2e", rows, columns, notes=notes, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
