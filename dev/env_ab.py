"""A/B of one environment knob read by the kernels at run time, in one process: for each case,
the op under every value of the variable, interleaved over rounds, beside XLA's path.

    PYTHONPATH=. python3 dev/env_ab.py 'dw3_fwd:bfloat16@JAXDNN_DW_PREFETCH=0,6' ...

Cases are dev/kernel_trace.py's (pooling, normalization, depthwise layers). Times: the best
over rounds of the mean per op of back-to-back jitted calls of 4 rotating inputs.
"""

from __future__ import annotations

import os
import sys
import time

import jax

sys.path.insert(0, os.path.dirname(__file__))
import kernel_trace as kt  # noqa: E402

ROUNDS = 3
MIN_S = 0.05


def timer(fn, args):
    f = kt.many_fn(fn)
    jax.block_until_ready(f(args))

    def run():
        reps = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(reps):
                out = f(args)
            jax.block_until_ready(out)
            t = time.perf_counter() - t0
            if t >= MIN_S:
                return t / reps / len(args)
            reps *= 2
    return run


def main():
    for spec in sys.argv[1:]:
        case, knob = spec.split("@")
        var, values = knob.split("=")
        values = values.split(",")
        name, dtype = case.split(":")
        ours, ref, args = kt.make_case(name, dtype)
        t_ours, t_ref = timer(ours, args), timer(ref, args)
        best = {v: float("inf") for v in values}
        xla = float("inf")
        for _ in range(ROUNDS):
            for v in values:
                os.environ[var] = v
                best[v] = min(best[v], t_ours())
            os.environ.pop(var)
            xla = min(xla, t_ref())
        cells = " ".join(f"{v}:{best[v] * 1e6:6.1f}({xla / best[v]:.2f})" for v in values)
        print(f"{case:26} XLA {xla * 1e6:6.1f} | {var}= {cells}", flush=True)


if __name__ == "__main__":
    main()
