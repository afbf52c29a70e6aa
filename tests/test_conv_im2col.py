"""The CPU im2col + GEMM convolution against jax.lax in float64, all directions and dtypes.

Each case runs forward, backward-data and backward-filter in one jitted vjp through
jaxdnn.conv_general_dilated(..., algo="im2col_gemm"). The grid covers 1-D/2-D/3-D, strides,
asymmetric and negative padding, lhs and rhs dilation, groups (depthwise too), batch groups,
pointwise (no im2col) problems, empty dims, and shapes large enough to cross every blocking
boundary (several k blocks, column panels, row chunks, dw tiles, edge tiles). Determinism is
checked bit for bit across repeated calls and across thread counts, and every instruction-set
variant the CPU supports (im2col_gemm.avx512, .avx2, .generic) is forced and checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn

from problems import ConvCase, channels_last
from util import assert_close, by_base, rand

ALGO = "im2col_gemm"


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """im2col_gemm is a CPU algorithm: run every test here on the CPU, GPU or not."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _case(name, x, w, strides, padding, **kw):
    dnums = kw.pop("dnums", channels_last(len(x) - 2))
    return ConvCase(name, x, w, dict(window_strides=strides, padding=padding,
                                     dimension_numbers=dnums, **kw))


CASES = [
    _case("3x3_same", (2, 7, 9, 5), (3, 3, 5, 6), (1, 1), "SAME"),
    _case("stride_asym_pad_rhs_dil", (2, 11, 10, 4), (3, 2, 4, 8), (2, 1), [(2, 0), (1, 3)],
          rhs_dilation=(2, 1)),
    _case("negative_pad_lhs_dil", (1, 9, 8, 3), (2, 3, 3, 4), (1, 2), [(-1, 2), (1, -2)],
          lhs_dilation=(2, 1)),
    _case("lhs_dil_along_w", (2, 5, 6, 3), (3, 3, 3, 5), (1, 1), [(1, 1), (2, 2)],
          lhs_dilation=(1, 3)),
    _case("groups", (2, 8, 7, 6), (3, 3, 2, 9), (1, 1), "SAME", feature_group_count=3),
    _case("depthwise", (2, 9, 9, 8), (3, 3, 1, 8), (2, 2), "SAME", feature_group_count=8),
    _case("depthwise_multiplier", (1, 6, 6, 4), (5, 5, 1, 8), (1, 1), [(2, 2), (2, 2)],
          feature_group_count=4),
    _case("batch_groups", (4, 6, 6, 3), (3, 3, 3, 4), (1, 1), "SAME", batch_group_count=2),
    _case("1d", (3, 20, 4), (5, 4, 7), (3,), [(2, 1)], rhs_dilation=(2,)),
    _case("3d", (2, 5, 6, 7, 3), (2, 3, 2, 3, 5), (1, 2, 1), [(1, 0), (0, 1), (1, 1)],
          lhs_dilation=(1, 1, 2), rhs_dilation=(2, 1, 1)),
    _case("pointwise", (2, 6, 7, 16), (1, 1, 16, 24), (1, 1), "VALID"),
    _case("pointwise_groups", (2, 5, 5, 12), (1, 1, 4, 6), (1, 1), "VALID",
          feature_group_count=3),
    _case("1x1_stride2", (2, 7, 7, 8), (1, 1, 8, 12), (2, 2), "VALID"),
    _case("nchw", (2, 3, 7, 6), (4, 3, 3, 2), (1, 2), "SAME", dnums=("NCHW", "OIHW", "NCHW")),
    _case("empty_output", (2, 2, 5, 3), (3, 3, 3, 4), (1, 1), "VALID"),
    _case("empty_input_padded", (1, 0, 4, 2), (1, 3, 2, 3), (1, 1), [(1, 1), (1, 1)]),
    _case("empty_batch", (0, 5, 5, 3), (3, 3, 3, 4), (1, 1), "SAME"),
    # Blocking boundaries: F*Cg = 576 (3 k blocks of 192 in fwd, 2 column panels in bwd_data),
    # K = 33 (edge NR strip); M = 3*16*16 = 768 (several row chunks and dw k blocks).
    _case("wide_channels", (1, 6, 6, 64), (3, 3, 64, 33), (1, 1), "SAME"),
    _case("many_rows", (3, 16, 16, 8), (3, 3, 8, 20), (1, 1), "SAME"),
    _case("dw_row_and_col_tiles", (1, 5, 5, 32), (3, 3, 32, 600), (1, 1), "SAME"),
    _case("pointwise_deep", (2, 9, 9, 300), (1, 1, 300, 40), (1, 1), "VALID"),
    # 144 positions an image, 576 dcol columns (2 panels): bwd_data chunks cross images.
    _case("data_chunks_cross_images", (3, 12, 12, 64), (3, 3, 64, 8), (1, 1), "SAME"),
    # M = 8*32*33 = 8448 positions: 33 k blocks, so dw is reduced in 4 slices.
    _case("sliced_dw", (8, 32, 33, 3), (3, 3, 3, 5), (1, 1), "SAME"),
]
SMALL_16BIT = ("3x3_same", "groups", "pointwise", "negative_pad_lhs_dil", "empty_output",
               "wide_channels", "3d")


def _inputs(case, dtype, seed=0):
    rng = np.random.default_rng(seed)
    y_shape = jax.eval_shape(partial(lax.conv_general_dilated, **case.kw),
                             jax.ShapeDtypeStruct(case.x_shape, jnp.float64),
                             jax.ShapeDtypeStruct(case.w_shape, jnp.float64)).shape
    return tuple(rand(rng, s, dtype) for s in (case.x_shape, case.w_shape, y_shape))


@partial(jax.jit, static_argnums=0)
def _ref_all(case, x, w, ct):
    """(y, dx, dw) from jax.lax in float64."""
    f = partial(lax.conv_general_dilated, **case.kw, precision=lax.Precision.HIGHEST)
    y, vjp = jax.vjp(f, x, w)
    return (y, *vjp(ct))


@partial(jax.jit, static_argnums=(0, 4, 5))
def _ours_all(case, x, w, ct, preferred=None, algo=ALGO):
    f = partial(jaxdnn.conv_general_dilated, **case.kw, algo=algo,
                preferred_element_type=preferred)
    y, vjp = jax.vjp(f, x, w)
    return (y, *vjp(ct.astype(y.dtype)))


def _check(case, dtype, preferred=None):
    x, w, ct = _inputs(case, dtype)
    want = _ref_all(case, *(np.asarray(a, np.float64) for a in (x, w, ct)))
    got = _ours_all(case, x, w, ct, preferred)
    out_dtype = np.dtype(preferred or dtype)
    for name, g, r in zip(("fwd", "bwd_data", "bwd_filter"), got, want):
        if name == "fwd":
            assert g.dtype == out_dtype
        assert_close(g, r, dtype, what=f"{case} {np.dtype(dtype).name} {name}")


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=lambda d: np.dtype(d).name)
def test_matches_lax(case, dtype):
    _check(case, dtype)


@pytest.mark.parametrize("case", [c for c in CASES if c.name in SMALL_16BIT], ids=str)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: np.dtype(d).name)
def test_matches_lax_16bit(case, dtype):
    _check(case, dtype)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: np.dtype(d).name)
def test_16bit_in_float32_out(dtype):
    for name in ("3x3_same", "pointwise"):
        case = next(c for c in CASES if c.name == name)
        x, w, ct = _inputs(case, dtype)
        want = _ref_all(case, *(np.asarray(a, np.float64) for a in (x, w, ct)))
        y = jax.jit(partial(jaxdnn.conv_general_dilated, **case.kw, algo=ALGO,
                            preferred_element_type=jnp.float32))(x, w)
        assert y.dtype == jnp.float32
        assert_close(y, want[0], dtype, what=f"{case} {np.dtype(dtype).name} -> float32")


def test_conv_api_and_workspace():
    """jaxdnn.conv (the PyTorch-style API) forces the algorithm too, and the registry reports
    it as deterministic with a workspace."""
    rng = np.random.default_rng(1)
    x, w = rand(rng, (2, 10, 10, 8)), rand(rng, (3, 3, 8, 16))
    y = jaxdnn.conv(x, w, stride=2, padding=1, algo=ALGO)
    ref = lax.conv_general_dilated(x.astype(np.float64), w.astype(np.float64), (2, 2),
                                   [(1, 1), (1, 1)], dimension_numbers=channels_last(2))
    assert_close(y, ref, jnp.float32)
    spec = jaxdnn.ConvSpec(lhs_shape=(2, 1, 10, 10, 8), rhs_shape=(1, 3, 3, 8, 16),
                           stride=(1, 2, 2), padding=((0, 0), (1, 1), (1, 1)),
                           lhs_dilation=(1, 1, 1), rhs_dilation=(1, 1, 1), groups=1)
    f32 = np.dtype("float32")
    for direction in ("fwd", "bwd_data", "bwd_filter"):
        infos = jaxdnn.conv_algorithms(jaxdnn.ConvProblem(direction, spec, f32, f32), "cpu")
        info = by_base(infos)[ALGO]
        assert info.supported and info.deterministic and info.workspace_bytes > 0
        assert info.rank == 0  # the CPU heuristic's first choice for this size


# ----------------------------------------------------------------------------------------------
# Determinism and the instruction-set variants
# ----------------------------------------------------------------------------------------------

DETERMINISM_CASES = ("many_rows", "wide_channels", "dw_row_and_col_tiles", "groups", "sliced_dw",
                     "data_chunks_cross_images")


def _bits(arrays):
    return [np.asarray(a).view(np.uint32 if np.asarray(a).dtype.itemsize == 4 else np.uint64)
            for a in arrays]


def _results(names, dtype):
    """Our (y, dx, dw) for the named cases, as lists of arrays, keyed by case."""
    out = {}
    for case in (c for c in CASES if c.name in names):
        x, w, ct = _inputs(case, dtype)
        out[case.name] = [np.asarray(a) for a in _ours_all(case, x, w, ct)]
    return out


def test_deterministic_repeated_calls():
    for case in (c for c in CASES if c.name in DETERMINISM_CASES):
        x, w, ct = _inputs(case, jnp.float32, seed=3)
        first = _bits(_ours_all(case, x, w, ct))
        for _ in range(2):
            again = _bits(_ours_all(case, x, w, ct))
            for a, b in zip(first, again):
                assert np.array_equal(a, b), f"{case}: results differ between calls"


_WORKER = """
import os, sys
import numpy as np
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
sys.path.insert(0, sys.argv[1])
import conftest  # float64 and poisoned outputs, as in the test session
import test_conv_im2col as t
res = t._results(t.THREAD_CASES, np.float32)
np.savez(sys.argv[2], **{f"{k}_{i}": a for k, v in res.items() for i, a in enumerate(v)})
"""
THREAD_CASES = list(DETERMINISM_CASES) + ["negative_pad_lhs_dil", "pointwise", "3d", "depthwise"]


def test_one_cpu_is_bitwise_the_same(tmp_path):
    """One CPU (a single-thread pool, so other chunkings and tilings) gives bitwise the same
    results as this process."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = str(tmp_path / "one_cpu.npz")
    # cwd outside the source tree: `python -c` puts the cwd first on sys.path.
    proc = subprocess.run([sys.executable, "-c", _WORKER, here, path], cwd=tmp_path,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    one_cpu = np.load(path)
    for name, arrays in _results(THREAD_CASES, jnp.float32).items():
        for i, a in enumerate(arrays):
            assert np.array_equal(_bits([a])[0], _bits([one_cpu[f"{name}_{i}"]])[0]), \
                f"{name} output {i}: one CPU differs from {os.cpu_count()} CPUs"


# The instruction-set variants (cc/conv/variant.h), best first, and (dtype, cases) each runs.
ISAS = ("avx512", "avx2", "generic")
ISA_CASES = [(jnp.float32, THREAD_CASES), (jnp.float64, THREAD_CASES),
             (jnp.bfloat16, ["3x3_same", "pointwise"]), (jnp.float16, ["3x3_same", "pointwise"])]


def _isa_listing():
    """{variant name: info} of im2col_gemm for a small float32 problem on this CPU."""
    spec = jaxdnn.ConvSpec(lhs_shape=(2, 1, 7, 9, 5), rhs_shape=(1, 3, 3, 5, 6),
                           stride=(1, 1, 1), padding=((0, 0), (1, 1), (1, 1)),
                           lhs_dilation=(1, 1, 1), rhs_dilation=(1, 1, 1), groups=1)
    f32 = np.dtype("float32")
    infos = jaxdnn.conv_algorithms(jaxdnn.ConvProblem("fwd", spec, f32, f32), "cpu")
    return {a.name: a for a in infos if a.base == ALGO}


def test_isa_listing():
    """Every instruction set is a listed variant; the default runs the best one the CPU has, and
    one it lacks is unsupported with the reason."""
    listed = _isa_listing()
    assert set(listed) == {f"{ALGO}.{isa}" for isa in ISAS}
    supported = [isa for isa in ISAS if listed[f"{ALGO}.{isa}"].supported]
    assert "generic" in supported
    assert supported == list(ISAS[ISAS.index(supported[0]):]), "a lesser ISA is missing"
    default = [name for name, a in listed.items() if a.default]
    assert default == [f"{ALGO}.{supported[0]}"]
    for isa in ISAS[:ISAS.index(supported[0])]:
        assert "this CPU lacks" in listed[f"{ALGO}.{isa}"].reason


@pytest.mark.parametrize("isa", ISAS)
def test_isa_variant_matches_lax(isa):
    """Each instruction set the CPU supports, forced by its variant name, against the float64
    reference on the cases that cross the blocking boundaries (whose sizes depend on it)."""
    name = f"{ALGO}.{isa}"
    info = _isa_listing()[name]
    if not info.supported:
        pytest.skip(info.reason)
    for dtype, names in ISA_CASES:
        for case in (c for c in CASES if c.name in names):
            x, w, ct = _inputs(case, dtype)
            want = _ref_all(case, *(np.asarray(a, np.float64) for a in (x, w, ct)))
            got = _ours_all(case, x, w, ct, algo=name)
            for i, (g, r) in enumerate(zip(got, want)):
                assert_close(g, r, dtype, what=f"{name} {case} {np.dtype(dtype).name} output {i}")
    x, w, _ = _inputs(CASES[0], jnp.float32)
    text = jax.jit(partial(jaxdnn.conv_general_dilated, **CASES[0].kw, algo=name)).lower(
        x, w).as_text()
    assert f'algo = "{name}"' in text
