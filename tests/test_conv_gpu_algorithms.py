"""Every CUDA conv algorithm, one direction at a time, on a grid of problems and on the
ResNet-50 layer table, against an independent float64 oracle; plus the registry logic (support
reasons, workspace arithmetic), which needs the CUDA module but no GPU.

Each test asks the registry which algorithms support a (problem, direction, dtype) and runs
every one of them with that direction forced, so a newly registered algorithm is tested
without touching this file.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn
from jaxdnn.ops import conv as conv_ops

from util import assert_close, has_gpu, rand

NHWC = ("NHWC", "HWIO", "NHWC")

needs_cuda_module = pytest.mark.skipif(not jaxdnn.build_info()["cuda"],
                                       reason="jaxdnn built without CUDA")
needs_gpu = pytest.mark.skipif(not has_gpu(), reason="no GPU")

# (name, x shape, w shape, conv_general_dilated keyword arguments); channels-last.
GRID = [
    ("3x3_same", (2, 9, 11, 16), (3, 3, 16, 24), dict(window_strides=(1, 1), padding="SAME")),
    ("3x3_stride2_asym", (3, 13, 10, 8), (3, 3, 8, 16),
     dict(window_strides=(2, 2), padding=((1, 2), (0, 1)))),
    # bwd_data by residue classes, eight of the nine empty (their dx is zero): a 1x1 stride 3.
    ("classes_stride3_empty", (2, 10, 11, 16), (1, 1, 16, 32), dict(window_strides=(3, 3),
                                                                    padding="VALID")),
    ("1x1_two_n_tiles", (2, 7, 9, 32), (1, 1, 32, 136), dict(window_strides=(1, 1),
                                                             padding="VALID")),
    ("dilated", (1, 12, 12, 8), (3, 3, 8, 8), dict(window_strides=(1, 1), padding="SAME",
                                                   rhs_dilation=(2, 2))),
    ("lhs_dilated", (2, 6, 5, 8), (3, 2, 8, 16), dict(window_strides=(1, 2),
                                                      padding=((1, 2), (0, 1)),
                                                      lhs_dilation=(2, 3))),
    ("groups", (2, 8, 8, 32), (3, 3, 16, 48), dict(window_strides=(1, 1), padding="SAME",
                                                   feature_group_count=2)),
    ("many_tiles_split_k", (4, 30, 30, 64), (3, 3, 64, 64), dict(window_strides=(1, 1),
                                                                 padding="SAME")),
    ("wide_reduction", (8, 16, 16, 64), (3, 3, 64, 128), dict(window_strides=(1, 1),
                                                              padding="SAME")),
    # implicit_gemm's halo path (16-bit): two channel chunks, three 64-column tiles, asymmetric
    # padding, partial tiles in both directions; and a 2x5 filter with 128-column tiles.
    ("halo_3x3_asym", (3, 28, 21, 128), (3, 3, 128, 192),
     dict(window_strides=(1, 1), padding=((2, 0), (0, 2)))),
    ("halo_2x5", (2, 30, 15, 64), (2, 5, 64, 128),
     dict(window_strides=(1, 1), padding=((1, 0), (2, 2)))),
    # implicit_precomp_gemm's A through TMA's im2col mode (Hopper): strides, asymmetric
    # padding and dilation in the forward; two groups of 64 channels; a partial last tile.
    ("im2col_s2_dilated", (3, 15, 13, 64), (3, 3, 64, 128),
     dict(window_strides=(2, 2), padding=((1, 2), (0, 1)), rhs_dilation=(1, 2))),
    ("im2col_groups", (2, 9, 10, 128), (3, 3, 64, 128), dict(window_strides=(1, 1),
                                                            padding="SAME",
                                                            feature_group_count=2)),
    # 256-column tiles (16-bit im2col, one group, N a multiple of 256; the l3-l4 layers):
    # 126 pixels (one partial M tile), asymmetric padding; a 1x1 stride-2 layer with 512
    # outputs (two N tiles) and bwd_data by residue classes.
    ("im2col_256_columns", (2, 9, 7, 256), (3, 3, 256, 256),
     dict(window_strides=(1, 1), padding=((1, 0), (0, 2)))),
    ("im2col_512_outputs_s2", (3, 5, 11, 64), (1, 1, 64, 512),
     dict(window_strides=(2, 2), padding="VALID")),
    # TF32 through im2col (a slice is 32 channels): 32 inputs, 96 outputs (three slices per tap
    # of bwd_data), a 2x3 filter with asymmetric padding; 16-bit keeps the table here.
    ("im2col_tf32_32_channels", (2, 7, 11, 32), (2, 3, 32, 96),
     dict(window_strides=(1, 1), padding=((1, 0), (2, 1)))),
    ("ragged_96_inputs", (2, 10, 9, 96), (3, 3, 96, 64), dict(window_strides=(1, 1),
                                                              padding="SAME")),
    ("stem_3_channels", (2, 17, 17, 3), (7, 7, 3, 64), dict(window_strides=(2, 2),
                                                            padding=((3, 3), (3, 3)))),
    ("padded_136_outputs", (2, 9, 10, 5), (3, 3, 5, 136), dict(window_strides=(1, 1),
                                                               padding="SAME")),
    ("groups_6_channels", (2, 9, 8, 12), (3, 3, 6, 16), dict(window_strides=(1, 1),
                                                             padding="SAME",
                                                             feature_group_count=2)),
    ("depthwise", (2, 12, 13, 24), (3, 3, 1, 24), dict(window_strides=(1, 1), padding="SAME",
                                                       feature_group_count=24)),
    ("depthwise_3x3_asym_pad", (3, 9, 10, 20), (3, 3, 1, 20), dict(window_strides=(1, 1),
                                                                   padding=((0, 2), (2, 0)),
                                                                   feature_group_count=20)),
    ("depthwise_7x7_s2", (2, 15, 14, 16), (7, 7, 1, 32), dict(window_strides=(2, 2),
                                                              padding=((3, 3), (3, 3)),
                                                              feature_group_count=16)),
    ("1d", (4, 37, 24), (5, 24, 16), dict(window_strides=(1,), padding=((2, 2),),
                                          dimension_numbers=("NWC", "WIO", "NWC"))),
    ("3d", (1, 5, 6, 7, 8), (3, 3, 3, 8, 16),
     dict(window_strides=(1, 1, 1), padding="SAME",
          dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))),
]

# ResNet-50 (DESIGN.md section 6) at batch 2: (name, H=W, Cin, Cout, kernel, stride, pad).
RESNET = [
    ("conv1_7x7s2", 224, 3, 64, 7, 2, 3), ("l1_1x1_64_64", 56, 64, 64, 1, 1, 0),
    ("l1_3x3_64", 56, 64, 64, 3, 1, 1), ("l1_1x1_64_256", 56, 64, 256, 1, 1, 0),
    ("l2_3x3_128", 28, 128, 128, 3, 1, 1), ("l2_1x1_512_128", 28, 512, 128, 1, 1, 0),
    ("l3_3x3_256", 14, 256, 256, 3, 1, 1), ("l3_1x1_256_1024", 14, 256, 1024, 1, 1, 0),
    ("l4_3x3_512", 7, 512, 512, 3, 1, 1), ("l4_3x3s2_256", 28, 256, 256, 3, 2, 1),
    ("dw3x3_144", 56, 144, 144, 3, 1, 1), ("dw7x7_96", 56, 96, 96, 7, 1, 3),
]

GPU_DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16)
TF32_TOL = 3e-3  # DESIGN.md section 5


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
    fn = conv_ops._run_algorithm(name, problem.direction, problem.spec, out_dtype)
    return fn(jax.device_put(a, device), jax.device_put(b, device))


def _supported(problem):
    return [a for a in jaxdnn.conv_algorithms(problem, "cuda") if a.supported]


def _tolerance(problem):
    return TF32_TOL if problem.spec.tf32 else None


@needs_gpu
@needs_cuda_module
@pytest.mark.parametrize("precision", ["highest", "default"])
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", GRID, ids=lambda c: c[0])
def test_every_algorithm_matches_the_cpu_oracle(case, dtype, precision):
    if precision == "default" and dtype != jnp.float32:
        pytest.skip("precision only matters for float32")
    name, x_shape, w_shape, kw = case
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    for direction, problem in _problems(x_shape, w_shape, kw, dtype, precision).items():
        a, b = _operands(problem, rng, dtype)
        ref = _run("direct", problem, a.astype(np.float64), b.astype(np.float64), cpu,
                   np.float64)
        for info in _supported(problem):
            out = _run(info.name, problem, a, b, gpu)
            assert out.dtype == problem.out_dtype
            assert_close(out, ref, dtype, tol=_tolerance(problem),
                         what=f"{info.name} {direction} {name}")


@needs_gpu
@needs_cuda_module
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layer", RESNET, ids=lambda c: c[0])
def test_resnet50_layers_match_the_gpu_oracle(layer, dtype):
    name, hw, cin, cout, k, stride, pad = layer
    groups = cin if name.startswith("dw") else 1
    gpu = jax.devices("gpu")[0]
    rng = np.random.default_rng(k * 1000 + cin)
    problems = _problems((2, hw, hw, cin), (k, k, cin // groups, cout),
                         dict(window_strides=(stride, stride), padding=((pad, pad), (pad, pad)),
                              feature_group_count=groups), dtype, "highest")
    for direction, problem in problems.items():
        a, b = _operands(problem, rng, dtype)
        ref = _run("direct", problem, a.astype(np.float64), b.astype(np.float64), gpu,
                   np.float64)
        for info in _supported(problem):
            out = _run(info.name, problem, a, b, gpu)
            assert_close(out, ref, dtype, what=f"{info.name} {direction} {name}")


@needs_gpu
@needs_cuda_module
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", [c for c in GRID if c[0] in ("3x3_same", "many_tiles_split_k",
                                                                "stem_3_channels", "depthwise")],
                         ids=lambda c: c[0])
def test_deterministic_algorithms_are_bitwise_reproducible_on_gpu(case, dtype):
    name, x_shape, w_shape, kw = case
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
@needs_cuda_module
def test_mixed_precision_result_float32():
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
        assert_close(y, ref, jnp.float32, tol=1e-5, what=info.name)


# ---- registry logic: needs the CUDA module, not a GPU -------------------------------------------

def _infos(x_shape, w_shape, kw, dtype=jnp.float32, precision="highest", direction="fwd"):
    problem = _problems(x_shape, w_shape, kw, dtype, precision)[direction]
    return {a.name: a for a in jaxdnn.conv_algorithms(problem, "cuda")}, problem


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
