"""Renders the README's performance tables from the committed results, one command:

    python benchmarks/report.py          # rewrites README.md between the report markers
    python benchmarks/report.py --check  # exits 1 if README.md differs from what it would write
    python benchmarks/report.py --print  # prints the block only

For each (benchmark, device) it reads the latest JSON in benchmarks/results/ (by the date in its
environment) and renders one compact table per family from those JSONs alone: a row per
(device, direction), a column per dtype with the geomean ratio and the lowest row, and above the
table one line per source naming its device, date, jax version and file. Sources measured before
the current methodology (no `method` in their environment, see benchmarks/common.py METHOD) say
so, with what differed; a table rebuilt from logs (`rebuilt_from` in its environment) says that
too. Standard library only: no jax needed.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README = os.path.join(ROOT, "README.md")
BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"

# benchmark -> (title, what an old-method table did differently)
FAMILIES = {
    "e2e": ("End-to-end training step, images/s (loss diff: relative, after 10 steps from one "
            "initialisation)", "predates method tags"),
    "conv_gpu": ("GPU convolution, ResNet-50 layers at N=64, NHWC",
                 "per-direction kernels only (no train row), 2-8 rotating input sets"),
    "conv_cpu": ("CPU convolution (im2col_gemm), ResNet-50 layers at N=8, float32",
                 "no train row; CPU time measured in separate runs; threads per side not "
                 "recorded"),
    "conv_tables": ("GPU convolution, the shapes JAX users report as slowest (benchmarks/"
                    "bench_conv_gpu.py --table): geomean ratio over each table's layers",
                    "predates method tags"),
    "fused": ("Fused ops (benchmarks/bench_fused.py: batch norm + add + ReLU on ResNet-50's "
              "batch norms, conv + bias + activation + residual on a ConvNeXt stage) against "
              "XLA and jaxdnn's unfused chain", "predates method tags"),
    "norm": ("Normalization", "backward from each side's own residuals (the flax-style "
             "reference saves three float32 tensors); no fwd+bwd under value_and_grad"),
    "softmax": ("softmax and log_softmax", "backward from each side's own residuals; no "
                "fwd+bwd under value_and_grad"),
    "activation": ("Activations", "no fwd+bwd under value_and_grad (its bwd rows start from "
                   "the same x and dy on both sides)"),
    "pool": ("Pooling", "backward-only rows from each side's own residuals (jaxdnn's max-pool "
             "selection against XLA's x); fwd+bwd through jax.vjp, not value_and_grad"),
    "bandwidth": ("Memory bandwidth ceiling (XLA's -x; a device copy)",
                  "recorded before method tags; the measurement has not changed"),
}
ORDER = ["e2e", "fused", "conv_tables", "conv_gpu", "conv_cpu", "norm", "softmax",
         "activation", "pool", "bandwidth"]
# Tables kept beside the results only: a training step's GPU time by kernel category
# (benchmarks/profile_step.py), which complements its family's table rather than summarising,
# and multi-device scaling (benchmarks/bench_scaling.py), whose device counts vary by machine.
NOT_RENDERED = {"e2e_profile", "scaling"}
# Directions of old-method tables, relabelled to say what they measured.
OLD_DIRECTIONS = {"norm": {"bwd": "bwd (own residuals)"}, "softmax": {"bwd": "bwd (own residuals)"},
                  "pool": {"bwd": "bwd (own residuals)", "fwd+bwd": "fwd+bwd (vjp)"},
                  "activation": {"bwd": "bwd (same inputs)"}}


def family(benchmark: str) -> str:
    """norm_rows16384 -> norm: variants of a benchmark render as it does; conv_gpu_<table>
    (bench_conv_gpu.py --table) render together as conv_tables."""
    if benchmark.startswith("conv_gpu_"):
        return "conv_tables"
    if benchmark.endswith("_fused"):  # bench_fused.py: norm_fused, conv_fused
        return "fused"
    return next((f for f in ORDER if benchmark.startswith(f)), benchmark)


def latest_results(results_dir: str = RESULTS) -> list[tuple[str, dict, str]]:
    """(benchmark, data, path) of the latest JSON per (benchmark, device), in README order."""
    latest: dict[tuple[str, str], tuple[str, dict, str]] = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(path) as f:
            data = json.load(f)
        env = data["environment"]
        name = env.get("benchmark") or os.path.basename(path).split(f"-{env['platform']}-")[0]
        key = (name, env["device"])
        if key not in latest or env["date"] >= latest[key][1]["environment"]["date"]:
            latest[key] = (name, data, path)

    def rank(item):
        name, data, _ = item
        env = data["environment"]
        fam = family(name)
        return (ORDER.index(fam) if fam in ORDER else len(ORDER), name,
                env["platform"] == "cpu", env["device"])
    return sorted(latest.values(), key=rank)


def _ratio(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}x"


def _geomean(values) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def device_label(name: str, env: dict) -> str:
    where = env["device"]
    if env["platform"] == "cpu":
        where = f"{env.get('host_cpu') or 'CPU'}, {env['cpu_count']} cores"
    return where + (f" ({name})" if name != family(name) else "")


def source(name: str, data: dict, path: str) -> str:
    """One line naming a table's device, date, jax version and method, and its file."""
    env = data["environment"]
    text = f"- {device_label(name, env)}: {env['date']}, jax {env['jax']}"
    if "method" in env:
        text += f", method {env['method']}"
    else:
        text += f"; **old method**: {FAMILIES.get(family(name), ('', 'predates method tags'))[1]}"
    if env.get("rebuilt_from"):
        text += f"; rebuilt from logs ({env['rebuilt_from']})"
    if "Partial run" in data.get("notes", ""):
        text += "; **partial run** (stopped early: its notes say where)"
    return text + f" (`benchmarks/results/{os.path.basename(path)}`)"


def table(columns: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            + ["| " + " | ".join(r) + " |" for r in rows])


def cell(ratios: list[float], low: str, extra: str = "") -> str:
    """geomean, then the lowest row: '1.21x (lowest 1.04x rms_norm)'."""
    return f"{_ratio(_geomean(ratios))} (lowest {low}{extra})"


def by_dtype(sel: list[dict], ratio, label, dtypes, extra=lambda rows: "") -> list[str]:
    out = []
    for dtype in dtypes:
        rows = [r for r in sel if r.get("dtype", "float32") == dtype]
        low = min(rows, key=ratio) if rows else None
        out.append(cell([ratio(r) for r in rows], f"{_ratio(ratio(low))} {label(low)}",
                        extra(rows)) if rows else "")
    return out


def conv_rows(name: str, data: dict, dtypes: list[str]) -> list[list[str]]:
    """Per direction: geomean and lowest over the ResNet-50 layers (not depthwise or 7x7); on
    the CPU also the geomean of the CPU-time ratios."""
    rows = [r for r in data["rows"] if not r["layer"].startswith(("geomean", "dw", "x_"))]
    cpu = data["environment"]["platform"] == "cpu"
    extra = ((lambda sel: f"; CPU time {_ratio(_geomean([r['cpu ratio'] for r in sel]))}")
             if cpu else (lambda sel: ""))
    return [[device_label(name, data["environment"]), d]
            + by_dtype([r for r in rows if r["dir"] == d], lambda r: r["ratio"],
                       lambda r: r["layer"], dtypes, extra)
            for d in dict.fromkeys(r["dir"] for r in rows)]


def memory_rows(name: str, data: dict, dtypes: list[str]) -> list[list[str]]:
    """Per direction: geomean and lowest row per dtype."""
    rows, old = data["rows"], "method" not in data["environment"]
    relabel = OLD_DIRECTIONS.get(family(name), {}) if old else {}
    shapes = len({r["shape"] for r in rows}) > 1

    def label(r):
        parts = [r["op"], r.get("layout", "")] + ([r["shape"]] if shapes else [])
        return " ".join(p for p in parts if p and p != "rows")

    def ratio(r):
        return r["ratio"] if "ratio" in r else r["speedup"]

    def direction(r):
        return r.get("direction", r.get("dir"))
    return [[device_label(name, data["environment"]), relabel.get(d, d)]
            + by_dtype([r for r in rows if direction(r) == d], ratio, label, dtypes)
            for d in dict.fromkeys(map(direction, rows))]


def conv_tables_table(items: list[tuple[str, dict, str]]) -> list[str]:
    """A row per (device, table, dtype): the geomean ratio of every direction over the
    table's layers (its own geomean rows)."""
    rows, dirs = [], []
    for name, data, _ in items:
        for r in data["rows"]:
            if r["layer"].startswith("geomean"):
                dirs += [r["dir"]] if r["dir"] not in dirs else []
    for name, data, _ in items:
        geo = [r for r in data["rows"] if r["layer"].startswith("geomean")]
        for dtype in dict.fromkeys(r["dtype"] for r in geo):
            ratio = {r["dir"]: r["ratio"] for r in geo if r["dtype"] == dtype}
            rows.append([data["environment"]["device"], name.removeprefix("conv_gpu_"), dtype]
                        + [_ratio(ratio.get(d)) for d in dirs])
    return table(["device", "table", "dtype"] + dirs, rows)


def fused_rows(name: str, data: dict, dtypes: list[str]) -> list[list[str]]:
    """Per (baseline, direction): geomean and lowest row per dtype."""
    rows = data["rows"]
    return [[device_label(name, data["environment"]), f"{d} vs {b}"]
            + by_dtype([r for r in rows if r["direction"] == d and r["baseline"] == b],
                       lambda r: r["ratio"], lambda r: f"{r['op']} {r['shape']}", dtypes)
            for b in dict.fromkeys(r["baseline"] for r in rows)
            for d in dict.fromkeys(r["direction"] for r in rows)]


def e2e_table(items: list[tuple[str, dict, str]]) -> list[str]:
    """A row per (device, network, dtype, batch): both sides' images/s, their ratio and the
    relative loss difference; with bench_e2e --unfused rows, also the unfused baseline's ratio."""
    unfused = any("unfused_ratio" in r for _, data, _ in items for r in data["rows"])
    return table(["device", "model", "dtype", "batch", "lax img/s", "jaxdnn img/s", "ratio"]
                 + (["unfused ratio"] if unfused else []) + ["loss diff"],
                 [[device_label(name, data["environment"]), f"{r['model']} {r['input']}",
                   r["dtype"], str(r["batch"]), f"{r['lax_img_s']:.0f}",
                   f"{r['jaxdnn_img_s']:.0f}", _ratio(r["ratio"])]
                  + ([_ratio(r.get("unfused_ratio"))] if unfused else [])
                  + [f"{r['loss_rel_diff']:.1e}"]
                  for name, data, _ in items for r in data["rows"]])


def bandwidth_table(rows: list[dict]) -> list[str]:
    return table(["MB", "XLA -x GB/s", "copy GB/s (CUDA events)"],
                 [[str(r["MB"]), f"{r['xla_neg_GBps']:.0f}",
                   f"{r['torch_copy_GBps']:.0f}" if "torch_copy_GBps" in r else ""]
                  for r in rows])


def render(results_dir: str = RESULTS) -> str:
    """The generated block, markers included: one table per family, GPU and CPU rows together,
    a column per dtype (geomean ratio and the lowest row)."""
    lines = [BEGIN, "<!-- Generated by `python benchmarks/report.py` from the latest "
             "benchmarks/results/*.json per benchmark and device; do not edit by hand. -->"]
    groups: dict[str, list[tuple[str, dict, str]]] = {}
    for item in latest_results(results_dir):
        if item[0] in NOT_RENDERED:
            continue
        fam = family(item[0])
        groups.setdefault("conv" if fam in ("conv_gpu", "conv_cpu") else fam, []).append(item)
    titles = {"conv": "Convolution, ResNet-50 layers (GPU: N=64 NHWC; CPU: N=8, im2col_gemm)"}
    for fam, items in groups.items():
        title = titles.get(fam) or FAMILIES.get(fam, (fam, ""))[0]
        lines += [f"**{title}**", ""] + [source(*item) for item in items] + [""]
        if fam == "bandwidth":
            lines += bandwidth_table(items[0][1]["rows"]) + [""]
            continue
        if fam == "e2e":
            lines += e2e_table(items) + [""]
            continue
        if fam == "conv_tables":
            lines += conv_tables_table(items) + [""]
            continue
        dtypes = list(dict.fromkeys(r.get("dtype", "float32") for _, data, _ in items
                                    for r in data["rows"]))
        body = []
        rows_of = {"conv": conv_rows, "fused": fused_rows}.get(fam, memory_rows)
        for name, data, _ in items:
            body += rows_of(name, data, dtypes)
        lines += table(["device", "direction"] + dtypes, body) + [""]
    return "\n".join(lines + [END])


def updated_readme(text: str, block: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    return text[:start] + block + text[end + len(END):]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale")
    parser.add_argument("--print", action="store_true", help="print the block only")
    parser.add_argument("--readme", default=README)
    parser.add_argument("--results", default=RESULTS)
    args = parser.parse_args(argv)
    block = render(args.results)
    if args.print:
        print(block)
        return 0
    with open(args.readme) as f:
        text = f.read()
    new = updated_readme(text, block)
    if args.check:
        if new == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                   "README.md", "generated"))
        print("README.md's performance tables are stale: run python benchmarks/report.py")
        return 1
    if new != text:
        with open(args.readme, "w") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
