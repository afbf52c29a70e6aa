"""GPU convolution through the public API: jaxdnn.conv against jax.lax.conv_general_dilated
(cuDNN through XLA) on the ResNet-50 layer table plus two depthwise layers and two 7x7
stride-1 layers (DESIGN.md section 6), under jit, in bfloat16, float32 (lax's default
precision: TF32 on both sides) and float32 precision="highest" (exact float32 on both sides).

Per (layer, dtype) four rows: fwd, bwd_data, bwd_filter (halves of jax.vjp with a random
cotangent) and train (jax.jit(jax.value_and_grad(loss, argnums=(0, 1))) with loss =
sum(conv(x, w) * dy): the forward and both backward kernels, XLA free to fuse), each with
TFLOP/s of both sides, their ratio (> 1: jaxdnn faster) and the algorithm jaxdnn's heuristic
runs on this device (jaxdnn.explain of the jitted train step). Geomeans per dtype and direction
over the ResNet-50 layers close the table.

    python benchmarks/bench_conv_gpu.py            # everything, ~5-6 min on an H100
    python benchmarks/bench_conv_gpu.py --dtypes bfloat16 --layers 3,l2_3x3_128 --dirs fwd,train
    python benchmarks/bench_conv_gpu.py --algos    # also time every supported algorithm (slow)
    python benchmarks/bench_conv_gpu.py --batch 2 --layers 2,3 --no-write   # a CPU smoke test
    python benchmarks/bench_conv_gpu.py --table 3d   # or grouped, transposed, dilated_depthwise

--table picks the layers: resnet (the default: the ResNet-50 table, two depthwise and two 7x7
layers, N=64) or one of the tables of the shapes users report as slowest in JAX
(tests/problems.py CONV_TABLES: 3-D convolutions of a video U-Net and their transposes at N=4,
ResNeXt's grouped 3x3 layers, 2-D transposed convolutions, dilated depthwise ones), each
written to its own results table (conv_gpu_<table>) with geomeans over all its layers.

Each measurement jits one function over ROTATE input sets (x, w, dy): 8, as the independent
review harness used, which overflows the 50 MB L2 of an H100 or H200 on every layer (the
smallest set, l4_3x3_512 in bfloat16, is 11 MB). With --algos the table also names the fastest
jaxdnn algorithm ("find") and whether the heuristic is within 10% of it; `--rescore
results/conv_gpu-....json` recomputes those columns of an --algos table with the current
heuristic (no GPU needed, but a CUDA build), keeping its measurements and environment.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp

import jaxdnn
from common import (CONV_DIRECTIONS, CONV_DIRECTIONS_NOTE, best_times, conv_direction_fn,
                    conv_flops, conv_fns, conv_layers, default_trials, geomean, in_resnet,
                    layer_shapes, rotating_inputs, select_layers, table_layers, time_op,
                    timing_note, write_results)

ROTATE = 8
KERNELS = CONV_DIRECTIONS[:3]  # the directions that are one kernel each
DTYPES = "bfloat16,float32,float32:highest"


def parse_dtype(dtype_name):
    """(dtype, precision) of "bfloat16", "float32" or "float32:highest"."""
    dtype, _, precision = dtype_name.partition(":")
    return jnp.dtype(dtype), precision or None


def kernel_directions(layer, dtype_name) -> dict:
    """{layer direction: the direction of the kernel that computes it}: the same, except for a
    transposed convolution written lax's way, which runs as a strided convolution's data
    gradient (its forward on the bwd_data kernel, its input gradient on the forward kernel)."""
    dtype, precision = parse_dtype(dtype_name)
    args = [jax.ShapeDtypeStruct(s, dtype) for s in layer_shapes(layer)]
    (fwd,) = jaxdnn.conv_problems(conv_direction_fn(conv_fns(layer, None, precision)[0], "fwd"),
                                  *args)
    swap = fwd.direction == "bwd_data"
    return {"fwd": fwd.direction, "bwd_data": "fwd" if swap else "bwd_data",
            "bwd_filter": "bwd_filter"}


def heuristic_algos(layer, dtype_name, platform):
    """{direction: algorithm} that jaxdnn runs on `platform` for a layer: jaxdnn.explain of the
    jitted train step (every kernel direction) on shapes alone."""
    dtype, precision = parse_dtype(dtype_name)
    args = [jax.ShapeDtypeStruct(s, dtype) for s in layer_shapes(layer)]
    step = jax.jit(conv_direction_fn(conv_fns(layer, None, precision)[0], "train"))
    ran = {e.direction: e.algo for e in jaxdnn.explain(step, *args, platform=platform)}
    return {d: ran[k] for d, k in kernel_directions(layer, dtype_name).items()}


def bench_layer(layer, dtype_name, directions, repeats, trials, all_algos):
    name = layer.name
    dtype, precision = parse_dtype(dtype_name)
    inputs = rotating_inputs(
        lambda normal: tuple(normal(s, dtype) for s in layer_shapes(layer)), ROTATE)
    algos = heuristic_algos(layer, dtype_name, jax.default_backend())
    algos["train"] = "/".join(algos[d] for d in KERNELS)
    ours, xla = conv_fns(layer, None, precision)
    rows = []
    for d in directions:
        t_ours, t_xla = best_times(conv_direction_fn(ours, d), conv_direction_fn(xla, d),
                                   inputs, inputs, trials, repeats)
        flops = conv_flops(layer, d)
        row = {"layer": name, "dtype": dtype_name, "dir": d, "XLA TFLOP/s": flops / t_xla / 1e12,
               "jaxdnn TFLOP/s": flops / t_ours / 1e12, "ratio": t_xla / t_ours,
               "algo": algos[d]}
        if all_algos and d in KERNELS:
            row["algos"] = time_algorithms(layer, dtype_name, d, inputs, repeats)
            score(row, algos[d])
        rows.append(row)
        print(f"{name:16s} {dtype_name:15s} {d:10s} XLA {row['XLA TFLOP/s']:7.1f}  jaxdnn "
              f"{row['jaxdnn TFLOP/s']:7.1f} ({algos[d]})  ratio {row['ratio']:.2f}"
              + "".join(f"  {a}={v:.1f}" for a, v in row.get("algos", {}).items()), flush=True)
    return rows


def time_algorithms(layer, dtype_name, direction, inputs, repeats):
    """{algorithm: TFLOP/s} of every supported jaxdnn algorithm for one direction, each forced
    (its default variant: the kernel its base name runs)."""
    dtype, precision = parse_dtype(dtype_name)
    args = [jax.ShapeDtypeStruct(s, dtype) for s in layer_shapes(layer)]
    fn = conv_direction_fn(conv_fns(layer, None, precision)[0], direction)
    kernel = kernel_directions(layer, dtype_name)[direction]
    (problem,) = [p for p in jaxdnn.conv_problems(fn, *args) if p.direction == kernel]
    infos = [a for a in jaxdnn.conv_algorithms(problem, variants=False) if a.supported]
    out = {}
    for info in infos:
        if info.name == "direct" and infos[0].name != "direct":
            continue  # the oracle: no reuse, minutes per layer at N=64
        forced = conv_fns(layer, {direction: info.name}, precision)[0]
        try:
            t = time_op(conv_direction_fn(forced, direction), inputs, repeats=repeats)
        except Exception as e:  # noqa: BLE001 - report and keep benchmarking
            print(f"  {layer.name} {direction} {info.name}: FAILED {type(e).__name__}: "
                  f"{str(e)[:200]}")
            continue
        out[info.name] = conv_flops(layer, direction) / t / 1e12
    return out


def score(row, heuristic):
    """Fills a row's find columns from its per-algorithm TFLOP/s (`row["algos"]`)."""
    tf = row["algos"]
    best = max(tf, key=tf.get) if tf else heuristic
    row.update({"algo": heuristic, "best": best, "best TFLOP/s": tf.get(best, float("nan")),
                "within 10%": "yes" if tf.get(best, 0) <= 1.1 * tf.get(heuristic, 0) else "NO"})


def rescore(path, table, batch):
    """Rows of an --algos results file, re-scored with the current heuristic for CUDA."""
    with open(path) as f:
        data = json.load(f)
    rows, layers = [], {lay.name: lay for lay in table_layers(table, batch)}
    for r in data["rows"]:
        if "algos" in r:
            heuristic = heuristic_algos(layers[r["layer"]], r["dtype"], "cuda")[r["dir"]]
            score(r, heuristic)
            if heuristic in r["algos"]:
                r["jaxdnn TFLOP/s"] = r["algos"][heuristic]
                r["ratio"] = r["jaxdnn TFLOP/s"] / r["XLA TFLOP/s"]
        if not r["layer"].startswith("geomean"):
            rows.append(r)
    return rows, data["environment"]


def first_trace_cost(batch):
    """Seconds to trace + compile a jitted train step of three layers: default heuristic,
    benchmark mode with an empty cache (runs find), and benchmark mode with the cache warm."""
    fns = []
    layers = conv_layers(batch)
    for layer in (layers[2], layers[4], layers[8]):
        args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in layer_shapes(layer)]
        fns.append((conv_direction_fn(conv_fns(layer)[0], "train"), args))

    def compile_all():
        jax.clear_caches()  # trace and compile from scratch each time
        t0 = time.perf_counter()
        for f, args in fns:
            jax.jit(f).lower(*args).compile()
        return time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as cache:
        out = {"heuristic": compile_all()}
        with jaxdnn.config(benchmark=True, cache_dir=cache):
            out["benchmark, empty cache"] = compile_all()
            out["benchmark, cached"] = compile_all()
    return out


def summarised(table: str, layer: str) -> bool:
    """Whether a layer counts in its table's geomeans (the resnet table: ResNet-50's only)."""
    return in_resnet(layer) if table == "resnet" else True


def summary_label(table: str) -> str:
    return "ResNet-50" if table == "resnet" else table


def summary_rows(rows, table="resnet"):
    """Geomean ratio per (dtype, direction) over the table's summarised layers."""
    out = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for d in dict.fromkeys(r["dir"] for r in rows):
            sel = [r["ratio"] for r in rows
                   if r["dtype"] == dtype and r["dir"] == d and summarised(table, r["layer"])]
            if sel:
                out.append({"layer": f"geomean ({summary_label(table)})", "dtype": dtype,
                            "dir": d, "ratio": geomean(sel)})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", default="resnet",
                        help="resnet, 3d, grouped, transposed or dilated_depthwise")
    parser.add_argument("--batch", type=int, default=None,
                        help="N (default: the table's, 64 for resnet)")
    parser.add_argument("--dtypes", default=DTYPES,
                        help="comma-separated; float32:highest = exact float32 on both sides")
    parser.add_argument("--layers", default="", help="1-based indices or names, comma-separated")
    parser.add_argument("--dirs", default=",".join(CONV_DIRECTIONS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trials", type=int, default=None,
                        help="interleaved rounds, best kept (default: 1 on a GPU)")
    parser.add_argument("--algos", action="store_true", help="time every supported algorithm")
    parser.add_argument("--first-trace", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--rescore", default="", help="an --algos results .json to re-score")
    args = parser.parse_args()
    trials = default_trials(args.trials)
    rows, env, extra = [], None, ""
    t0 = time.perf_counter()
    if args.rescore:
        rows, env = rescore(args.rescore, args.table, args.batch)
        args.algos = True
        extra = (" Heuristic columns re-scored (--rescore) from the measured per-algorithm "
                 "times with the current heuristic.")
        report(args, rows, env, trials, extra)
    else:
        dtypes = args.dtypes.split(",")
        for i, dtype in enumerate(dtypes):
            for layer in select_layers(args.layers, table_layers(args.table, args.batch)):
                rows += bench_layer(layer, dtype, args.dirs.split(","), args.repeats, trials,
                                    args.algos)
            # Written after each dtype, so a run stopped part-way still leaves its table.
            partial = "" if i + 1 == len(dtypes) else (
                f" Partial run: dtypes {', '.join(dtypes[:i + 1])} of {', '.join(dtypes)}.")
            report(args, rows, env, trials, extra + partial)
    print(f"total {time.perf_counter() - t0:.0f} s")


def report(args, rows, env, trials, extra):
    """Prints the notes and writes the table of `rows` (unless --no-write)."""
    batch = table_layers(args.table, args.batch)[0].x_shape[0]
    notes = (f"N={batch}, channels-last, through jaxdnn.conv (jaxdnn.conv_general_dilated for "
             "lhs-dilated, transposed convolutions) and lax.conv_general_dilated under jit. "
             "float32 = default precision (TF32 allowed on both sides), float32:highest = "
             f"precision='highest' on both sides (exact float32). {CONV_DIRECTIONS_NOTE} "
             "ratio = XLA time / jaxdnn time (> 1: jaxdnn faster); algo = what jaxdnn's "
             "heuristic runs on this device (jaxdnn.explain; train: fwd/bwd_data/bwd_filter). "
             f"{ROTATE} rotating input sets per jitted call. {timing_note(trials, args.repeats)}")
    label = summary_label(args.table)
    hits = [r["within 10%"] == "yes" for r in rows
            if "within 10%" in r and summarised(args.table, r["layer"])]
    if hits:
        notes += (f" best = fastest jaxdnn algorithm measured; the heuristic is within 10% of it "
                  f"on {sum(hits)}/{len(hits)} {label} cases.")
    if args.first_trace:
        cost = first_trace_cost(args.batch or 64)
        notes += " First trace+compile of 3 layers' train steps (s): " + ", ".join(
            f"{k} {v:.2f}" for k, v in cost.items()) + "."
    summary = summary_rows(rows, args.table)
    notes += f" Geomean ratio over the {label} layers: " + "; ".join(
        f"{s['dtype']} {s['dir']} {s['ratio']:.3f}" for s in summary) + "." + extra
    print(notes)
    if args.no_write:
        return
    columns = ["layer", "dtype", "dir", "XLA TFLOP/s", "jaxdnn TFLOP/s", "ratio", "algo"]
    if args.algos:
        columns += ["best", "best TFLOP/s", "within 10%"]
    name = "conv_gpu" if args.table == "resnet" else f"conv_gpu_{args.table}"
    write_results(name, rows + summary, columns, notes=notes, env=env)


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    main()
