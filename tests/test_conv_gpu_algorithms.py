"""CUDA conv algorithms beyond their accuracy (tests/test_conv_oracle.py checks that against
jax.lax): bitwise reproducibility and mixed-precision results on the GPU; and the registry logic
(support reasons, workspace arithmetic), which needs the CUDA module but no GPU.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn
from jaxdnn.ops import conv as conv_ops
from jaxdnn.selection import conv as conv_sel

from problems import KERNEL_GRID
from util import (assert_close, by_base, error_growth, has_gpu, needs_cuda_module, needs_gpu, rand,
                  subprocess_env)

NHWC = ("NHWC", "HWIO", "NHWC")


def _problems(x_shape, w_shape, kw, dtype, precision):
    """The three ConvProblems (fwd, bwd_data, bwd_filter) of one convolution."""
    kw = dict(kw)
    kw.setdefault("dimension_numbers", NHWC)

    def f(x, w):
        y, vjp = jax.vjp(lambda x, w: jaxdnn.conv_general_dilated(x, w, precision=precision,
                                                                  **kw), x, w)
        return vjp(y)

    sds = [jax.ShapeDtypeStruct(s, dtype) for s in (x_shape, w_shape)]
    return {p.direction: p for p in jaxdnn.conv_problems(f, *sds)}


def _operands(problem, rng, dtype):
    a_shape, b_shape, _ = conv_ops._shapes(problem.direction, problem.spec)
    return rand(rng, a_shape, dtype), rand(rng, b_shape, dtype)


def _run(name, problem, a, b, device, out_dtype=None):
    out_dtype = problem.out_dtype if out_dtype is None else out_dtype
    fn = conv_sel._run_algorithm(name, problem.direction, problem.spec, out_dtype)
    return fn(jax.device_put(a, device), jax.device_put(b, device))


def _supported(problem):
    return [a for a in jaxdnn.conv_algorithms(problem, "cuda") if a.supported]


@needs_gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", [c for c in KERNEL_GRID
                                  if c.name in ("3x3_same", "many_tiles_split_k",
                                                "stem_3_channels", "depthwise")],
                         ids=str)
def test_deterministic_algorithms_are_bitwise_reproducible_on_gpu(case, dtype):
    x_shape, w_shape, kw = case.x_shape, case.w_shape, case.kw
    gpu = jax.devices("gpu")[0]
    rng = np.random.default_rng(5)
    for direction, problem in _problems(x_shape, w_shape, kw, dtype, "highest").items():
        a, b = _operands(problem, rng, dtype)
        for info in _supported(problem):
            if not info.deterministic:
                continue
            first = np.asarray(_run(info.name, problem, a, b, gpu))
            again = np.asarray(_run(info.name, problem, a, b, gpu))
            np.testing.assert_array_equal(first, again, err_msg=f"{info.name} {direction}")


@needs_gpu
def test_mixed_precision_result_float32_on_gpu():
    """bf16 operands with a float32 result: every GEMM algorithm stores float32."""
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    rng = np.random.default_rng(9)
    x, w = rand(rng, (2, 9, 9, 16), jnp.bfloat16), rand(rng, (3, 3, 16, 32), jnp.bfloat16)
    ref = lax.conv_general_dilated(jax.device_put(x.astype(np.float64), cpu),
                                   jax.device_put(w.astype(np.float64), cpu), (1, 1), "SAME",
                                   dimension_numbers=NHWC)
    for info in _supported(_problems(x.shape, w.shape, dict(window_strides=(1, 1),
                                                            padding="SAME"),
                                     jnp.bfloat16, None)["fwd"]):
        y = jaxdnn.conv(*(jax.device_put(v, gpu) for v in (x, w)), padding="SAME",
                        algo=info.name, preferred_element_type=jnp.float32)
        assert y.dtype == jnp.float32
        assert_close(y, ref, jnp.float32, tol=1e-5, what=info.name,
                     growth=error_growth(info.name, jnp.float32))


# ---- registry logic: needs the CUDA module, not a GPU -------------------------------------------

def _infos(x_shape, w_shape, kw, dtype=jnp.float32, precision="highest", direction="fwd"):
    problem = _problems(x_shape, w_shape, kw, dtype, precision)[direction]
    return by_base(jaxdnn.conv_algorithms(problem, "cuda")), problem


@needs_cuda_module
def test_im2col_workspace_is_exact():
    """The issue's example: N=32, 224x224x3, 7x7, 64 outputs, stride 1, SAME, float32. The
    patch matrix has 32*224*224 rows of 7*7*3 = 147 columns, padded to 148 (whole 16-byte
    chunks): 950,534,144 bytes."""
    infos, _ = _infos((32, 224, 224, 3), (7, 7, 3, 64), dict(window_strides=(1, 1),
                                                             padding="SAME"))
    assert infos["im2col_gemm"].supported
    assert infos["im2col_gemm"].workspace_bytes == 32 * 224 * 224 * 148 * 4
    bf16, _ = _infos((32, 224, 224, 3), (7, 7, 3, 64), dict(window_strides=(1, 1),
                                                            padding="SAME"), jnp.bfloat16)
    assert bf16["im2col_gemm"].workspace_bytes == 32 * 224 * 224 * 152 * 2


@needs_cuda_module
def test_im2col_bwd_filter_splits_the_reduction():
    """ResNet-50's stem at N=64 (bf16): bwd_filter is a 147x64 GEMM over 64*112*112 pixels, two
    output tiles; im2col_gemm splits its 12544 k-slices into 131 ranges of 96 and adds one
    float partial filter per range after the 152-column patch matrix."""
    infos, _ = _infos((64, 224, 224, 3), (7, 7, 3, 64),
                      dict(window_strides=(2, 2), padding=((3, 3), (3, 3))), jnp.bfloat16,
                      direction="bwd_filter")
    patches = 64 * 112 * 112 * 152 * 2
    assert infos["im2col_gemm"].workspace_bytes == patches + 131 * 147 * 64 * 4


@needs_cuda_module
def test_gemm_algorithms_report_reasons_and_workspaces():
    kw = dict(window_strides=(1, 1), padding="SAME")
    infos, _ = _infos((2, 8, 8, 3), (3, 3, 3, 16), kw)
    assert not infos["implicit_precomp_gemm"].supported
    assert "multiples of 8" in infos["implicit_precomp_gemm"].reason
    # implicit_gemm pads 3 channels to 8 in its workspace: x (2*8*8*8 floats) and w (9*8*16
    # floats), each rounded up to 256 bytes. bwd_data's GEMM N side is Cg itself: no padding.
    assert infos["implicit_gemm"].supported
    assert infos["implicit_gemm"].workspace_bytes == 4096 + 4608
    # In TF32 its forward adds the padded w transposed (wgmma reads 32-bit operands k-major).
    tf32_pad, _ = _infos((2, 8, 8, 3), (3, 3, 3, 16), kw, precision="default")
    assert tf32_pad["implicit_gemm"].workspace_bytes == 4096 + 2 * 4608
    bwdd, _ = _infos((2, 8, 8, 3), (3, 3, 3, 16), kw, direction="bwd_data")
    assert "multiples of 8" in bwdd["implicit_gemm"].reason
    # im2col_gemm's bwd_data: float column gradients, one row per output pixel (2*8*8) of
    # 3*3*3 = 27 columns padded to 32.
    assert bwdd["im2col_gemm"].supported
    assert bwdd["im2col_gemm"].workspace_bytes == 2 * 8 * 8 * 32 * 4
    assert infos["implicit_gemm"].tensor_cores and infos["implicit_gemm"].deterministic
    assert not infos["implicit_gemm_splitk_atomic"].deterministic
    assert infos["direct"].supported and not infos["direct"].tensor_cores

    f64, _ = _infos((2, 8, 8, 16), (3, 3, 16, 16), kw, jnp.float64)
    assert not f64["implicit_gemm"].supported and "float64" in f64["implicit_gemm"].reason

    # precomp: one int32 offset per (output pixel, tap).
    infos, _ = _infos((2, 8, 8, 16), (3, 3, 16, 16), kw)
    assert infos["implicit_precomp_gemm"].workspace_bytes == 2 * 8 * 8 * 9 * 4
    assert infos["implicit_gemm"].workspace_bytes == 0
    # TF32 fwd adds the transposed filter (wgmma reads 32-bit operands k-major only).
    tf32, _ = _infos((2, 8, 8, 16), (3, 3, 16, 16), kw, precision="default")
    assert tf32["implicit_precomp_gemm"].workspace_bytes == 2 * 8 * 8 * 9 * 4 + 3 * 3 * 16 * 16 * 4
    tf32_bwd, _ = _infos((2, 8, 8, 16), (3, 3, 16, 16), kw, precision="default",
                         direction="bwd_data")
    assert tf32_bwd["implicit_precomp_gemm"].workspace_bytes == 2 * 8 * 8 * 9 * 4
    # Strided bwd_data runs as residue classes: the sub-filters (w's size), the class results
    # (dx's size) and the largest class's table (class (1, 1): 2x2 taps over 2*4*4 pixels).
    s2, _ = _infos((2, 8, 8, 16), (3, 3, 16, 16), dict(window_strides=(2, 2), padding="SAME"),
                   jnp.bfloat16, direction="bwd_data")
    assert s2["implicit_precomp_gemm"].workspace_bytes == 3 * 3 * 16 * 16 * 2 + 2 * 8 * 8 * 16 * 2 \
        + 2 * 4 * 4 * 4 * 4
    # bwd_filter: the same table (x offsets per output pixel and tap) plus, when the reduction
    # splits, one float partial filter per split.
    bwdf, _ = _infos((2, 8, 8, 16), (3, 3, 16, 16), kw, direction="bwd_filter")
    assert bwdf["implicit_precomp_gemm"].workspace_bytes == 2 * 8 * 8 * 9 * 4
    big, _ = _infos((64, 56, 56, 64), (3, 3, 64, 64), kw, jnp.bfloat16, direction="bwd_filter")
    table = 64 * 56 * 56 * 9 * 4
    assert big["implicit_precomp_gemm"].workspace_bytes == table + 53 * 576 * 64 * 4


@needs_cuda_module
def test_split_k_plan():
    """bwd_filter of a 3x3 64->64 layer at N=64 has one 128x64 output tile per 128 filter rows
    (5 tiles) and 64*56*56 / 64 = 3136 bf16 k-slices: split-K cuts it into ceil(264 / 5) = 53
    ranges, and the ordered workspace holds one float partial C per split."""
    infos, _ = _infos((64, 56, 56, 64), (3, 3, 64, 64), dict(window_strides=(1, 1),
                                                             padding="SAME"),
                      jnp.bfloat16, direction="bwd_filter")
    c = 576 * 64 * 4
    # On Hopper the halo filter kernel takes it (cuda_halo_filter.cuh): one split per SM for
    # its single (channel chunk, k block) pair, 132 of them.
    hopper = has_gpu() and str(getattr(jax.devices("gpu")[0], "compute_capability", "")) \
        .startswith("9")
    assert infos["implicit_gemm_splitk"].workspace_bytes == (132 if hopper else 53) * c
    assert infos["implicit_gemm_splitk_atomic"].workspace_bytes == c
    # A forward problem that already fills the GPU does not split.
    fwd, _ = _infos((64, 56, 56, 64), (3, 3, 64, 64), dict(window_strides=(1, 1),
                                                           padding="SAME"), jnp.bfloat16)
    assert not fwd["implicit_gemm_splitk"].supported
    assert "fills the GPU" in fwd["implicit_gemm_splitk"].reason


@pytest.mark.parametrize("precision,tf32", [(None, True), ("default", True), ("high", True),
                                            ("highest", False), (lax.Precision.HIGHEST, False),
                                            (("highest", "default"), False)])
def test_precision_selects_tf32(precision, tf32):
    probs = _problems((1, 4, 4, 8), (3, 3, 8, 8), dict(window_strides=(1, 1), padding="SAME"),
                      jnp.float32, precision)
    assert all(p.spec.tf32 == tf32 for p in probs.values())
    bf16 = _problems((1, 4, 4, 8), (3, 3, 8, 8), dict(window_strides=(1, 1), padding="SAME"),
                     jnp.bfloat16, None)
    assert not any(p.spec.tf32 for p in bf16.values())


def test_bad_precision_is_rejected():
    x, w = jnp.ones((1, 4, 4, 8)), jnp.ones((3, 3, 8, 8))
    with pytest.raises(ValueError, match="unknown `precision`"):
        jaxdnn.conv(x, w, precision="hihgest")
    with pytest.raises(TypeError, match="precision"):
        jaxdnn.conv(x, w, precision=3)


EMPTY = [((2, 0, 7, 64), (3, 3, 64, 64), 0),  # empty input rows
         ((2, 2, 7, 64), (4, 3, 64, 64), 0),  # a filter longer than the input: empty output
         ((0, 6, 7, 16), (3, 3, 16, 16), 1),  # empty batch
         ((2, 6, 7, 16), (3, 3, 16, 0), 1)]   # no output channels


@needs_cuda_module
def test_registry_answers_empty_problems(tmp_path):
    """Problems with an empty operand (the CPU runs them: tests/test_conv.py) get an answer
    from the CUDA registry, every direction, with `direct` among the supported algorithms.
    In a subprocess: a crash must fail this test, not the test run."""
    script = textwrap.dedent(f"""
        import jax, jax.numpy as jnp, jaxdnn
        def f(x, w):
            y, vjp = jax.vjp(lambda x, w: jaxdnn.conv(x, w, padding=pad), x, w)
            return vjp(y)

        for x, w, pad in {EMPTY!r}:
            for p in jaxdnn.conv_problems(f, jax.ShapeDtypeStruct(x, jnp.bfloat16),
                                          jax.ShapeDtypeStruct(w, jnp.bfloat16)):
                names = [a.name for a in jaxdnn.conv_algorithms(p, "cuda") if a.supported]
                assert "direct" in names, (x, w, p.direction, names)
                print("ok", x, w, p.direction, flush=True)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env=subprocess_env(JAX_PLATFORMS="cpu"))
    assert run.returncode == 0, f"exit {run.returncode}: {run.stdout[-2000:]}{run.stderr[-2000:]}"
