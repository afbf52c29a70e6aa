"""Every CUDA conv algorithm, in every direction and arithmetic it supports, against jax.lax in
float64 on the CPU, on the ResNet-50 layers (N=2; the 224x224 stem at N=1), the depthwise layers
of MobileNet-like networks, odd sizes and channel counts, 1-D and 3-D problems and the grid of
kernel paths of tests/test_conv_gpu_algorithms.py, all from tests/problems.py.

Each test asks the CUDA registry which algorithms support each direction of its problem and runs
every one of them with that direction forced, so a newly registered algorithm is tested without
touching this file; test_cases_reach_every_algorithm checks on the CPU (it needs the CUDA module,
not a GPU) that the cases reach every (algorithm, direction, arithmetic) the registry has.

Arithmetics: float32 exact (precision="highest"), TF32 (float32 at the default precision),
float16 and bfloat16, each with its own tolerance (tests/util.py). The float32 operands are
random normal float32; the 16-bit ones random normal rounded to bfloat16 away from zero
(|v| >= 2^-6), which float16 also holds exactly, so one float64 reference serves both. Outputs
are poisoned (tests/conftest.py): an element an algorithm never writes fails.

JAXDNN_ORACLE_ALGOS=a,b restricts the algorithms run (test_gpu_wide_tiles_forced uses it).
"""

from __future__ import annotations

import functools
import os
import zlib
from functools import partial

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import jaxdnn
from jaxdnn.ops import conv as conv_ops

from problems import CONV1D, CONV3D, KERNEL_GRID, ODD_SIZES, depthwise_layers, resnet50_layers
from util import assert_close, error_growth, needs_cuda_module, needs_gpu

REALISTIC = resnet50_layers(2, stem_batch=1) + depthwise_layers(2) + ODD_SIZES + CONV1D + CONV3D
CASES = REALISTIC + KERNEL_GRID
assert len({c.name for c in CASES}) == len(CASES)

# (name, operand dtype, precision): the arithmetics a float32 / 16-bit problem runs in.
ARITHMETICS = [("float32", jnp.float32, "highest"), ("tf32", jnp.float32, "default"),
               ("float16", jnp.float16, None), ("bfloat16", jnp.bfloat16, None)]
DIRECTIONS = ("fwd", "bwd_data", "bwd_filter")
ONLY = [a for a in os.environ.get("JAXDNN_ORACLE_ALGOS", "").split(",") if a]


def _out_shape(case):
    return jax.eval_shape(partial(lax.conv_general_dilated, **case.kw),
                          jax.ShapeDtypeStruct(case.x_shape, jnp.float64),
                          jax.ShapeDtypeStruct(case.w_shape, jnp.float64)).shape


def _problems(case, dtype, precision):
    """{direction: ConvProblem} of the case's convolution and its two gradients."""
    def f(x, w, dy):
        fn = partial(jaxdnn.conv_general_dilated, **case.kw, precision=precision)
        y, vjp = jax.vjp(fn, x, w)
        return y, vjp(dy)

    shapes = (case.x_shape, case.w_shape, _out_shape(case))
    found = jaxdnn.conv_problems(f, *(jax.ShapeDtypeStruct(s, dtype) for s in shapes))
    problems = {p.direction: p for p in found}
    assert sorted(problems) == sorted(DIRECTIONS)
    return problems


def _operands(case, sixteen_bit):
    """(x, w, dy) in float64: random normal float32 values, or values bfloat16 and float16
    both hold exactly (bfloat16-rounded, |v| >= 2^-6)."""
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    out = []
    for shape in (case.x_shape, case.w_shape, _out_shape(case)):
        a = rng.standard_normal(shape)
        if sixteen_bit:
            a = np.sign(a) * np.maximum(np.abs(a), 2.0 ** -6)
            a = a.astype(ml_dtypes.bfloat16)
        out.append(np.asarray(a, np.float32).astype(np.float64))
    return tuple(out)


def _lax_all(case, x, w, dy):
    """(y, dx, dw) of the case by jax.lax in float64 on the CPU."""
    cpu = jax.devices("cpu")[0]
    x, w, dy = (jax.device_put(a, cpu) for a in (x, w, dy))
    y, vjp = jax.vjp(partial(lax.conv_general_dilated, **case.kw,
                             precision=lax.Precision.HIGHEST), x, w)
    return tuple(np.asarray(a) for a in (y, *vjp(dy)))


@functools.cache
def _reference(case, sixteen_bit):
    """{direction: (operands a, b, reference, scale)}: the float64 results and, per output,
    the L2 norm of the products it sums (sqrt of the same op on the squared operands).
    Cached: every arithmetic with the same operands and every algorithm shares them."""
    x, w, dy = _operands(case, sixteen_bit)
    refs = _lax_all(case, x, w, dy)
    scales = tuple(np.sqrt(np.maximum(s, 0.0)) for s in _lax_all(case, x * x, w * w, dy * dy))
    inputs = {"fwd": (x, w), "bwd_data": (dy, w), "bwd_filter": (x, dy)}
    return {d: (*inputs[d], r, s) for d, r, s in zip(DIRECTIONS, refs, scales)}


def _reduction_length(case, direction):
    """An upper bound of the number of products each output of `direction` sums."""
    nd = len(case.x_shape) - 2
    groups = case.kw.get("feature_group_count", 1)
    taps = int(np.prod(case.w_shape[:nd]))
    if direction == "fwd":
        return taps * case.w_shape[nd]
    if direction == "bwd_data":
        return taps * case.w_shape[-1] // groups
    return int(np.prod(_out_shape(case)[:-1]))


def _supported(problem):
    return [a.name for a in jaxdnn.conv_algorithms(problem, "cuda")
            if a.supported and (not ONLY or a.base in ONLY)]


def _all_algorithms(problems):
    """[(algorithm, direction)] the registry supports, and one jitted function running them all
    on {direction: (a, b)} (one compilation per case and arithmetic, not per algorithm)."""
    runs = [(name, d) for d, p in problems.items() for name in _supported(p)]

    def run(operands):
        return [conv_ops._bind(d, *operands[d], spec=problems[d].spec,
                               out_dtype=problems[d].out_dtype, policy=(False, False, -1),
                               algo=tuple(name if e == d else None for e in DIRECTIONS))
                for name, d in runs]

    return runs, jax.jit(run)


@pytest.mark.parametrize("arith", ARITHMETICS, ids=lambda a: a[0])
@pytest.mark.parametrize("case", CASES, ids=str)
@needs_gpu
def test_gpu_algorithms_match_lax(case, arith):
    kind, dtype, precision = arith
    gpu = jax.devices("gpu")[0]
    problems = _problems(case, dtype, precision)
    assert all(p.spec.tf32 == (kind == "tf32") for p in problems.values())
    refs = _reference(case, sixteen_bit=np.dtype(dtype).itemsize == 2)
    operands = {}
    for d, problem in problems.items():
        a_shape, b_shape, _ = conv_ops._shapes(d, problem.spec)
        a, b = refs[d][:2]
        operands[d] = (jax.device_put(a.astype(dtype).reshape(a_shape), gpu),
                       jax.device_put(b.astype(dtype).reshape(b_shape), gpu))
    runs, run = _all_algorithms(problems)
    for (name, d), out in zip(runs, run(operands)):
        ref, scale = refs[d][2:]
        assert out.dtype == problems[d].out_dtype
        assert_close(np.asarray(out).reshape(ref.shape), ref, kind, scale=scale,
                     growth=error_growth(name, kind),
                     k=_reduction_length(case, d), what=f"{name} {d} {case} {kind}")
    assert {d for _, d in runs} == set(DIRECTIONS) or ONLY, f"directions run: {runs}"


WIDE = ["im2col_256_columns", "im2col_512_outputs_s2", "l3_3x3_256", "l3_1x1_256_1024",
        "l4_3x3_512", "l4_3x3s2_256"]


@needs_gpu
def test_gpu_wide_tiles_are_listed_variants():
    """implicit_precomp_gemm's 256-column tiles (and the two ordered splits that come with them
    on short grids) are taken by size (cc/conv/cuda_gemm_conv.cuh: wide_plan): at N=2 none of
    the cases above is large enough for the default variant to reach them, so the listing
    offers them as the variant pinned to 128x256 tiles, which test_gpu_algorithms_match_lax
    runs with every other variant."""
    for name in WIDE:
        case = next(c for c in CASES if c.name == name)
        listed = [a.name for p in _problems(case, jnp.bfloat16, "default").values()
                  for a in jaxdnn.conv_algorithms(p, "cuda") if a.supported]
        assert any(n.split(".")[0] == "implicit_precomp_gemm" and "128x256" in n.split(".")
                   for n in listed), (name, listed)


# ---- coverage: needs the CUDA module, not a GPU ----------------------------------------------

def _coverage(cases):
    """({(algorithm, direction, arithmetic): [case names that it supports]},
    {(algorithm, direction, arithmetic): {case name: why not}}) over `cases`."""
    reached, refused = {}, {}
    for case in cases:
        for kind, dtype, precision in ARITHMETICS:
            for direction, problem in _problems(case, dtype, precision).items():
                for a in jaxdnn.conv_algorithms(problem, "cuda"):
                    key = (a.base, direction, kind)
                    if a.supported:
                        reached.setdefault(key, []).append(case.name)
                    else:
                        refused.setdefault(key, {})[case.name] = a.reason
    return reached, refused


@needs_cuda_module
def test_cases_reach_every_algorithm():
    """Every registered CUDA algorithm runs on some case, and so does each of its (direction,
    arithmetic) pairs, unless the registry refuses that pair, for one and the same reason, on
    every case where the algorithm runs otherwise (fused winograd: "no bwd_filter"); and each
    runs on the ResNet-50 / depthwise layers, the odd sizes or the 1-D/3-D problems, not only
    on the small grid."""
    reached, refused = _coverage(CASES)
    names = {n for n, _, _ in (*reached, *refused)}
    assert {n for n, _, _ in reached} == names
    for name in sorted(names):
        runs_on = {c for (n, _, _), cases in reached.items() if n == name for c in cases}
        for direction in DIRECTIONS:
            for kind, _, _ in ARITHMETICS:
                key = (name, direction, kind)
                if key not in reached:
                    why = {refused[key][c] for c in runs_on}
                    assert len(why) == 1, f"{key}: no case; refused for {sorted(why)}"
    realistic = {c.name for c in REALISTIC}
    only_grid = sorted(k for k, cases in reached.items() if not realistic & set(cases))
    assert not only_grid, f"reached only by the small grid: {only_grid}"
