"""Side-by-side jaxdnn TFLOP/s of several bench_conv_gpu.py runs (their printed logs), for the
A/Bs of one device call: two trees (say a commit and its parent) timed one after the other.
XLA's own rate moves by up to 50% between runs, so the columns compare our kernels with each
other; XLA's column is the first run's.

    python benchmarks/compare_conv_runs.py base.log new.log
"""

from __future__ import annotations

import argparse
import math
import re

ROW = re.compile(r"(\S+)\s+(\S+)\s+(\S+)\s+XLA\s+([\d.]+)\s+jaxdnn\s+([\d.]+)\s+\((\S+)\)")


def parse(path: str) -> dict[tuple[str, str, str], tuple[float, float, str]]:
    """(layer, dtype, direction) -> (XLA TFLOP/s, jaxdnn TFLOP/s, algorithm) of one log."""
    rows = {}
    with open(path) as f:
        for line in f:
            m = ROW.match(line)
            if m:
                rows[m[1], m[2], m[3]] = float(m[4]), float(m[5]), m[6]
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", help="bench_conv_gpu.py outputs; the first is the base")
    args = parser.parse_args()
    runs = [parse(p) for p in args.logs]
    keys = [k for k in runs[0] if all(k in r for r in runs[1:])]
    names = [p.rsplit("/", 1)[-1].removesuffix(".log") for p in args.logs]
    print(f"{'layer':16s} {'dtype':9s} {'dir':10s} {'XLA':>6s} " +
          " ".join(f"{n[:14]:>14s}" for n in names) + "  (jaxdnn TFLOP/s, x base)")
    logs = [[] for _ in runs[1:]]
    for k in keys:
        base = runs[0][k][1]
        cells = [f"{base:14.1f}"]
        for i, r in enumerate(runs[1:]):
            ratio = r[k][1] / base
            logs[i].append(math.log(ratio))
            cells.append(f"{r[k][1]:7.1f} {ratio:5.2f}x")
        print(f"{k[0]:16s} {k[1]:9s} {k[2]:10s} {runs[0][k][0]:6.1f} " + " ".join(cells) +
              f"  ({runs[0][k][2]})")
    if keys:
        print(f"{'geomean x base':44s} {'':>14s} " +
              " ".join(f"{'':>7s} {math.exp(sum(v) / len(v)):5.2f}x" for v in logs))


if __name__ == "__main__":
    main()
