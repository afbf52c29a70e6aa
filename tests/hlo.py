"""Collectives in compiled HLO text (``jax.jit(f).lower(...).compile().as_text()``), for the
partitioning checks and benchmarks/bench_scaling.py."""

from __future__ import annotations

import math
import re

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def collectives(compiled_text: str) -> dict[str, int]:
    """How many of each collective the compiled HLO runs (the -start of async pairs)."""
    out = {}
    for c in COLLECTIVES:
        n = len(re.findall(rf"= [^=]*? {c}(-start)?\(", compiled_text))
        if n:
            out[c] = n
    return out


def gathered_sizes(compiled_text: str) -> list[int]:
    """The element count of every all-gather's result in the compiled HLO."""
    sizes = []
    for m in re.finditer(r"= (\(?[^=]*?) all-gather(-start)?\(", compiled_text):
        shapes = re.findall(r"[a-z]+\d*\[([\d,]*)\]", m.group(1))
        sizes.append(math.prod(int(d) for d in shapes[-1].split(",") if d))
    return sizes
