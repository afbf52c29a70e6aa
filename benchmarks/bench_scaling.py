"""Data-parallel scaling: one SGD training step of a network on 1..N devices, on jaxdnn's ops
and on jax.lax / jax.nn, side by side in one process, with the collectives of each compiled step.

    PYTHONPATH=. python benchmarks/bench_scaling.py                       # every GPU jax sees
    PYTHONPATH=. python benchmarks/bench_scaling.py --models cnn --devices 1,2
    XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \
        PYTHONPATH=. python benchmarks/bench_scaling.py --quick          # seconds, any host

The step and the networks are bench_e2e.py's (ResNet-50 at 224x224 in bfloat16 with float32
master weights; "cnn" is the training example's small ResNet at 32x32). On n devices the batch
is n x --per-device-batch, sharded over a 1-D mesh of the first n devices, with the parameters
and optimizer state replicated (jaxdnn/examples/train.py placement: plain jit partitions the
step, jaxdnn's batch norm is synchronised). One device runs twice: without a mesh ("1") and
on a 1-device mesh ("1 mesh"), the A/B that shows the sharded code path costs nothing on one
device. scaling = images/s / (n x the side's images/s on one device without a mesh): 1.0 is
linear. The collective columns count each kind in the compiled step's HLO (ag all-gather, ar
all-reduce, rs reduce-scatter, a2a all-to-all, cp collective-permute).
"""

from __future__ import annotations

import argparse
import time

import jax

from bench_e2e import LOSS_STEPS, QUICK_TIMING, TIMING, Side, median_step_seconds, network
from bench_e2e import sides as bench_sides
from common import keep_freed_host_memory, write_results
from hlo import collectives
from jaxdnn.examples.train import placement

RUNS = [("resnet50", "bfloat16", 128), ("cnn", "float32", 256)]  # (network, dtype, per device)
QUICK_PER_DEVICE = 2
SHORT = {"all-gather": "ag", "all-reduce": "ar", "reduce-scatter": "rs", "all-to-all": "a2a",
         "collective-permute": "cp"}
COLUMNS = ["model", "dtype", "devices", "batch", "lax_img_s", "jaxdnn_img_s", "ratio",
           "lax_scaling", "jaxdnn_scaling", "lax_collectives", "jaxdnn_collectives"]


def counted(side: Side, x, y) -> str:
    """The collectives of the side's compiled step, as "ar 3, ag 1" (or "none")."""
    text = side.trainer.step.lower(*side.carry, x, y).compile().as_text()
    return ", ".join(f"{SHORT[k]} {n}" for k, n in collectives(text).items()) or "none"


def measure(name: str, dtype: str, per_device: int, devices: int, mesh: bool, args) -> dict:
    """One row: both sides' images/s on `devices` devices (with or without a mesh) and the
    collectives of their compiled steps."""
    batch = per_device * devices
    sides, (x, y) = bench_sides(name, dtype, batch, args.quick)
    if mesh:
        put_batch, put_replicated = placement(jax.devices()[:devices])
        x, y = put_batch(x), put_batch(y)
        for side in sides:
            side.carry = put_replicated(side.carry)
    t0 = time.perf_counter()
    counts = [counted(side, x, y) for side in sides]
    for side in sides:
        side.steps(LOSS_STEPS + args.warmup, x, y)  # compiles, then warms up
    t_lax, t_ours = median_step_seconds(sides, x, y, args.steps, args.windows)
    row = {"model": name, "dtype": dtype, "devices": f"{devices}{' mesh' if mesh else ''}"
           if devices == 1 else str(devices), "batch": batch, "lax_img_s": batch / t_lax,
           "jaxdnn_img_s": batch / t_ours, "ratio": t_lax / t_ours,
           "lax_collectives": counts[0], "jaxdnn_collectives": counts[1]}
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
          + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return row


def with_scaling(rows: list[dict]) -> list[dict]:
    """Each row's scaling against its configuration's one-device row without a mesh."""
    base = {(r["model"], r["dtype"]): r for r in rows if r["devices"] == "1"}
    for r in rows:
        b, n = base[r["model"], r["dtype"]], int(r["devices"].split()[0])
        for side in ("lax", "jaxdnn"):
            r[f"{side}_scaling"] = r[f"{side}_img_s"] / (n * b[f"{side}_img_s"])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(dict.fromkeys(m for m, _, _ in RUNS)))
    parser.add_argument("--devices", default=None,
                        help="comma-separated device counts (default: 1, 2, 4, ... up to all)")
    parser.add_argument("--per-device-batch", type=int, default=None,
                        help="images per device (default: per network, see RUNS)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few steps")
    parser.add_argument("--note", default="")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    available = len(jax.devices())
    if args.devices:
        counts = [int(n) for n in args.devices.split(",")]
    else:
        counts = [n for n in (1, 2, 4, 8, 16) if n <= available]
    if any(n < 1 or n > available for n in counts) or 1 not in counts:
        parser.error(f"--devices {args.devices}: counts from 1 to {available}, 1 included")
    models = args.models.split(",")
    for m in models:
        try:
            network(m)
        except ValueError as e:
            parser.error(str(e))
    for flag, value in (QUICK_TIMING if args.quick else TIMING).items():
        setattr(args, flag, value)
    keep_freed_host_memory()
    rows = []
    for name, dtype, per_device in RUNS:
        if name not in models:
            continue
        per_device = args.per_device_batch or (QUICK_PER_DEVICE if args.quick else per_device)
        for n in counts:
            for mesh in ((False, True) if n == 1 else (True,)):
                rows.append(measure(name, dtype, per_device, n, mesh, args))
    notes = (f"{'--quick (tiny sizes: a smoke test). ' if args.quick else ''}One SGD training "
             "step as in bench_e2e.py, data parallel over a 1-D mesh of n devices (batch "
             "sharded, parameters replicated, plain jit; jaxdnn's batch norm synchronised). "
             "devices '1' = no mesh, '1 mesh' = a 1-device mesh. Images/s of the median of "
             f"{args.windows} windows of {args.steps} steps, the sides alternating; ratio = jaxdnn "
             "/ lax images/s; scaling = images/s / (n x one device's). Collectives counted in "
             f"each side's compiled HLO (ag all-gather, ar all-reduce). {args.note}").strip()
    write_results("scaling", with_scaling(rows), COLUMNS, notes=notes, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
