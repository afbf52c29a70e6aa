"""GPU convolution: every jaxdnn algorithm and the heuristic's choice against jax.lax (cuDNN
through XLA) on the ResNet-50 layer table plus two depthwise layers (DESIGN.md section 6).

For each (layer, dtype, direction) the table gives XLA's TFLOP/s, jaxdnn's with the default
heuristic choice, their ratio (> 1: jaxdnn faster), the fastest jaxdnn algorithm measured
(what "find" would pick) and whether the heuristic is within 10% of it. fwd is the convolution;
bwd_data / bwd_filter are the halves of its jax.vjp (the other operand closed over, so one
kernel runs). float32 runs at lax's default precision (TF32 on both sides).

    python benchmarks/bench_conv_gpu.py [--batch 64] [--dtypes bfloat16,float32]
        [--layers 1,3] [--dirs fwd] [--algos] [--first-trace]

The heuristic is a pure function of the problem, so `--rescore results/conv_gpu-....json`
recomputes the heuristic's columns from the per-algorithm times of an `--algos` run with the
current heuristic (no GPU needed), keeping the measurements and their environment.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from common import geomean, rotating_inputs, rotation_for, time_op, write_results

import jaxdnn

# (name, H=W, Cin, Cout, kernel, stride, pad, groups)
LAYERS = [
    ("conv1_7x7s2", 224, 3, 64, 7, 2, 3, 1),
    ("l1_1x1_64_64", 56, 64, 64, 1, 1, 0, 1),
    ("l1_3x3_64", 56, 64, 64, 3, 1, 1, 1),
    ("l1_1x1_64_256", 56, 64, 256, 1, 1, 0, 1),
    ("l2_3x3_128", 28, 128, 128, 3, 1, 1, 1),
    ("l2_1x1_512_128", 28, 512, 128, 1, 1, 0, 1),
    ("l3_3x3_256", 14, 256, 256, 3, 1, 1, 1),
    ("l3_1x1_256_1024", 14, 256, 1024, 1, 1, 0, 1),
    ("l4_3x3_512", 7, 512, 512, 3, 1, 1, 1),
    ("l4_3x3s2_256", 28, 256, 256, 3, 2, 1, 1),
    ("dw3x3_144", 56, 144, 144, 3, 1, 1, 144),
    ("dw7x7_96", 56, 96, 96, 7, 1, 3, 96),
    # Not ResNet-50 (left out of its geomeans): large stride-1 filters, where the FFT competes.
    ("x_7x7_64", 56, 64, 64, 7, 1, 3, 1),
    ("x_7x7_128", 28, 128, 128, 7, 1, 3, 1),
]


def in_resnet(name):
    return not name.startswith(("dw", "x_"))
DIRECTIONS = ("fwd", "bwd_data", "bwd_filter")


def conv_fns(stride, pad, groups, algo, precision=None):
    padding = ((pad, pad), (pad, pad))

    def ours(x, w):
        return jaxdnn.conv(x, w, stride=stride, padding=padding, groups=groups, algo=algo,
                           precision=precision)

    def xla(x, w):
        return lax.conv_general_dilated(x, w, (stride, stride), padding,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=groups, precision=precision)
    return ours, xla


def direction_fn(conv, direction):
    if direction == "fwd":
        return lambda x, w, dy: conv(x, w)
    if direction == "bwd_data":
        return lambda x, w, dy: jax.vjp(lambda x_: conv(x_, w), x)[1](dy)[0]
    return lambda x, w, dy: jax.vjp(lambda w_: conv(x, w_), w)[1](dy)[0]


def layer_shapes(layer, batch):
    _, hw, cin, cout, k, stride, pad, groups = layer
    out = (hw + 2 * pad - k) // stride + 1
    return (batch, hw, hw, cin), (k, k, cin // groups, cout), (batch, out, out, cout)


def bench_layer(layer, batch, dtype_name, directions, repeats, all_algos):
    """`dtype_name` is a dtype, or "float32:highest" for exact float32 on both sides."""
    name, _, cin, cout, k, stride, pad, groups = layer
    dtype, _, precision = dtype_name.partition(":")
    dtype, precision = jnp.dtype(dtype), precision or None
    xs, ws, ys = layer_shapes(layer, batch)
    flops = 2.0 * np.prod(ys) * k * k * cin / groups
    nbytes = np.dtype(dtype).itemsize * sum(int(np.prod(s)) for s in (xs, ws, ys))

    def make(rng):
        return tuple(jnp.asarray(rng.standard_normal(s), dtype) for s in (xs, ws, ys))

    inputs = rotating_inputs(make, rotation_for(int(nbytes)))
    problems = layer_problems(layer, batch, dtype_name)
    rows = []
    for d in directions:
        infos = [a for a in jaxdnn.conv_algorithms(problems[d], "cuda") if a.supported]
        heuristic = infos[0].name
        _, xla = conv_fns(stride, pad, groups, None, precision)
        t_xla = time_op(direction_fn(xla, d), inputs, repeats=repeats)
        times = {}
        candidates = [a.name for a in infos] if all_algos else [heuristic]
        for algo in candidates:
            if algo == "direct" and len(candidates) > 1 and heuristic != "direct":
                continue  # the oracle: no reuse, minutes per layer at N=64
            ours, _ = conv_fns(stride, pad, groups, {d: algo}, precision)
            try:
                times[algo] = time_op(direction_fn(ours, d), inputs, repeats=repeats)
            except Exception as e:  # noqa: BLE001 - report and keep benchmarking
                print(f"  {name} {d} {algo}: FAILED {type(e).__name__}: {str(e)[:200]}")
        if heuristic not in times:
            continue
        row = score({"layer": name, "dtype": dtype_name, "dir": d,
                     "XLA TFLOP/s": flops / t_xla / 1e12,
                     "algos": {a: flops / t / 1e12 for a, t in times.items()}}, heuristic)
        rows.append(row)
        print(f"{name:16s} {row['dtype']:8s} {d:10s} XLA {row['XLA TFLOP/s']:7.1f}  jaxdnn "
              f"{row['jaxdnn TFLOP/s']:7.1f} ({heuristic})  ratio {row['ratio']:.2f}  "
              + "  ".join(f"{a}={v:.1f}" for a, v in row["algos"].items()), flush=True)
    return rows


def layer_problems(layer, batch, dtype_name):
    """{direction: ConvProblem} of a layer (traced from shapes only: no device needed)."""
    _, _, _, _, _, stride, pad, groups = layer
    dtype, _, precision = dtype_name.partition(":")
    sds = [jax.ShapeDtypeStruct(s, jnp.dtype(dtype)) for s in layer_shapes(layer, batch)]
    ours = conv_fns(stride, pad, groups, None, precision or None)[0]
    return {p.direction: p for p in jaxdnn.conv_problems(
        lambda x, w, dy: jax.vjp(ours, x, w)[1](dy), *sds)}


def score(row, heuristic):
    """Fills a row's heuristic columns from its per-algorithm TFLOP/s (`row["algos"]`)."""
    tf = row["algos"]
    best = max(tf, key=tf.get)
    row.update({"jaxdnn TFLOP/s": tf[heuristic], "ratio": tf[heuristic] / row["XLA TFLOP/s"],
                "heuristic": heuristic, "best": best, "best TFLOP/s": tf[best],
                "within 10%": "yes" if tf[best] <= 1.1 * tf[heuristic] else "NO"})
    return row


def rescore(path, batch):
    """Rows of an `--algos` results file, re-scored with the current heuristic."""
    with open(path) as f:
        data = json.load(f)
    rows = []
    for r in data["rows"]:
        if "algos" not in r:
            continue  # a summary row
        layer = next(lay for lay in LAYERS if lay[0] == r["layer"])
        infos = jaxdnn.conv_algorithms(layer_problems(layer, batch, r["dtype"])[r["dir"]], "cuda")
        rows.append(score(r, next(a.name for a in infos if a.supported)))
    return rows, data["environment"]


def first_trace_cost(batch):
    """Seconds to trace + compile a jitted fwd+bwd step of three layers: default heuristic,
    benchmark mode with an empty cache (runs find), and benchmark mode with the cache warm."""
    fns = []
    for layer in (LAYERS[2], LAYERS[4], LAYERS[8]):
        xs, ws, ys = layer_shapes(layer, batch)
        _, _, _, _, _, stride, pad, groups = layer
        ours, _ = conv_fns(stride, pad, groups, None)
        args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in (xs, ws)]

        def step(x, w, ours=ours):
            return jax.grad(lambda x, w: jnp.sum(ours(x, w).astype(jnp.float32)), (0, 1))(x, w)
        fns.append((step, args))

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


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dtypes", default="bfloat16,float32",
                        help="comma-separated; float32:highest = exact float32 on both sides")
    parser.add_argument("--layers", default="", help="1-based layer indices")
    parser.add_argument("--dirs", default=",".join(DIRECTIONS))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--algos", action="store_true", help="time every supported algorithm")
    parser.add_argument("--first-trace", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--rescore", default="", help="an --algos results .json to re-score")
    args = parser.parse_args()
    layers = LAYERS if not args.layers else [LAYERS[int(i) - 1] for i in args.layers.split(",")]
    directions = tuple(args.dirs.split(","))
    rows, env, extra = [], None, ""
    if args.rescore:
        rows, env = rescore(args.rescore, args.batch)
        args.algos = True
        with open(args.rescore) as f:
            old_notes = json.load(f).get("notes", "")
        first_trace = old_notes[old_notes.find(" First trace"):] if "First trace" in old_notes \
            else ""
        extra = (" Heuristic columns re-scored (--rescore) from the measured per-algorithm "
                 "times with the current heuristic." + first_trace)
    else:
        for dtype in args.dtypes.split(","):
            for layer in layers:
                rows += bench_layer(layer, args.batch, dtype, directions, args.repeats,
                                    args.algos)
    summary = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for d in directions:
            sel = [r for r in rows if r["dtype"] == dtype and r["dir"] == d]
            resnet = [r for r in sel if in_resnet(r["layer"])]
            summary.append({"layer": "geomean (ResNet-50)", "dtype": dtype, "dir": d,
                            "ratio": geomean([r["ratio"] for r in resnet])})
    hits = [r["within 10%"] == "yes" for r in rows if in_resnet(r["layer"])]
    notes = (f"N={args.batch}, NHWC; float32 = default precision (TF32 allowed on both sides), "
             "float32:highest = HIGHEST on both sides (exact float32). "
             "ratio = XLA time / jaxdnn time with the heuristic's algorithm (> 1: jaxdnn "
             "faster); best = fastest jaxdnn algorithm measured.")
    if args.algos and hits:
        notes += (f" Heuristic within 10% of the fastest on {sum(hits)}/{len(hits)} "
                  f"({100 * sum(hits) / len(hits):.0f}%) ResNet-50 cases.")
    if args.first_trace:
        cost = first_trace_cost(args.batch)
        notes += " First trace+compile of 3 layers' fwd+bwd (s): " + ", ".join(
            f"{k} {v:.2f}" for k, v in cost.items()) + "."
    notes += extra
    print(notes)
    for s in summary:
        print(f"geomean {s['dtype']:8s} {s['dir']:10s} {s['ratio']:.2f}")
    if args.no_write:
        return
    write_results("conv_gpu", rows + summary,
                  ["layer", "dtype", "dir", "XLA TFLOP/s", "jaxdnn TFLOP/s", "ratio", "heuristic",
                   "best", "best TFLOP/s", "within 10%"], notes=notes, env=env)


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    main()
