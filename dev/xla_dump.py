"""XLA's own kernels for the reference side of dev/kernel_trace.py's cases: compiles each case's
jax.lax / jax.nn function (the same jitted function of four ops that the trace times) in a
process of its own with --xla_dump_to, and keeps the optimised HLO and the thunk sequence (every
kernel's fusion, grid and block; command buffers after the thunk passes) under DIR/<case>/, and
the PTX where XLA writes it (jax 0.11.2's CUDA build did not).

    PYTHONPATH=. python3 dev/xla_dump.py DIR batch_norm_nchw:float32 act_relu:float32 ...
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

KEEP = ("*.ptx", "*after_optimizations.txt", "*thunk_sequence*.txt")


def compile_reference(spec):
    import jax

    sys.path.insert(0, os.path.dirname(__file__))
    import kernel_trace

    name, dtype = spec.split(":")
    _, ref, args = kernel_trace.make_case(name, dtype)
    kernel_trace.many_fn(ref).lower(args).compile()
    jax.effects_barrier()


def main():
    if sys.argv[1] == "--one":
        compile_reference(sys.argv[2])
        return
    out = sys.argv[1]
    for spec in sys.argv[2:]:
        with tempfile.TemporaryDirectory() as dump:
            env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                                              f" --xla_dump_to={dump} --xla_dump_hlo_as_text"))
            subprocess.run([sys.executable, __file__, "--one", spec], env=env, check=True)
            dest = os.path.join(out, spec.replace(":", "_"))
            os.makedirs(dest, exist_ok=True)
            kept = [f for pat in KEEP for f in glob.glob(os.path.join(dump, pat))]
            for f in kept:
                shutil.copy(f, dest)
            print(f"{spec}: {len(kept)} files -> {dest}", flush=True)


if __name__ == "__main__":
    main()
