"""The convolution problems of the tests and benchmarks, in one place.

A ConvCase is a named problem: operand shapes plus jax.lax.conv_general_dilated keywords
(dimension_numbers included; channels-last NWC / NHWC / NDHWC with W..IO filters unless the
keywords say otherwise).

    CORRECTNESS_GRID          the small grid of tests/test_conv.py: every layout, padding,
                              dilation and group feature on a few pixels
    KERNEL_GRID               the GPU kernel paths' grid (tests/test_conv_gpu_algorithms.py)
    ODD_SIZES                 odd sizes and channel counts, grouped and depthwise among them
    CONV1D, CONV3D            1-D and 3-D problems
    resnet50_layers(batch)    the ResNet-50 layer table (DESIGN.md section 6)
    depthwise_layers(batch)   the depthwise layers of MobileNet-like networks
    large_filter_layers(batch)  7x7 stride-1 layers, where the FFT competes (not ResNet-50)

The layer tables are 2-D, square, NHWC / HWIO, with the batch as a parameter. Tests import this
module as `problems` (pytest puts tests/ on sys.path); the benchmarks put tests/ on sys.path
themselves (benchmarks/common.py). It imports nothing beyond the standard library.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: usable as a static argument
class ConvCase:
    """A named convolution problem: shapes plus jax.lax.conv_general_dilated keywords."""

    name: str
    x_shape: tuple
    w_shape: tuple
    kw: dict

    def __str__(self):
        return self.name


def channels_last(nd: int) -> tuple[str, str, str]:
    """conv dimension_numbers for channels-last data and a W..IO filter of `nd` spatial dims."""
    return {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"),
            3: ("NDHWC", "DHWIO", "NDHWC")}[nd]


NHWC = channels_last(2)


def case(name, x_shape, w_shape, **kw) -> ConvCase:
    """A channels-last ConvCase (unless kw names other dimension_numbers)."""
    kw.setdefault("dimension_numbers", channels_last(len(x_shape) - 2))
    return ConvCase(name, tuple(x_shape), tuple(w_shape), kw)


def layer(name, batch, hw, cin, cout, k, stride, pad, groups=1) -> ConvCase:
    """A square NHWC layer: k x k filter, the same stride and padding on both sides."""
    return case(name, (batch, hw, hw, cin), (k, k, cin // groups, cout),
                window_strides=(stride, stride), padding=((pad, pad), (pad, pad)),
                feature_group_count=groups)


# (name, H=W, Cin, Cout, kernel, stride, pad)
_RESNET50 = [
    ("conv1_7x7s2", 224, 3, 64, 7, 2, 3),
    ("l1_1x1_64_64", 56, 64, 64, 1, 1, 0),
    ("l1_3x3_64", 56, 64, 64, 3, 1, 1),
    ("l1_1x1_64_256", 56, 64, 256, 1, 1, 0),
    ("l2_3x3_128", 28, 128, 128, 3, 1, 1),
    ("l2_1x1_512_128", 28, 512, 128, 1, 1, 0),
    ("l3_3x3_256", 14, 256, 256, 3, 1, 1),
    ("l3_1x1_256_1024", 14, 256, 1024, 1, 1, 0),
    ("l4_3x3_512", 7, 512, 512, 3, 1, 1),
    ("l4_3x3s2_256", 28, 256, 256, 3, 2, 1),
]


def resnet50_layers(batch: int, stem_batch: int | None = None) -> list[ConvCase]:
    """The ResNet-50 layers at `batch`; the 224x224 stem at `stem_batch` (default: `batch`)."""
    return [layer(name, batch if i or stem_batch is None else stem_batch, *geometry)
            for i, (name, *geometry) in enumerate(_RESNET50)]


def depthwise_layers(batch: int) -> list[ConvCase]:
    return [layer("dw3x3_144", batch, 56, 144, 144, 3, 1, 1, groups=144),
            layer("dw7x7_96", batch, 56, 96, 96, 7, 1, 3, groups=96)]


def large_filter_layers(batch: int) -> list[ConvCase]:
    return [layer("x_7x7_64", batch, 56, 64, 64, 7, 1, 3),
            layer("x_7x7_128", batch, 28, 128, 128, 7, 1, 3)]


# ---- the shapes users report as slowest in JAX (issue 50's tables) ----------------------------
# A transposed convolution is written as lax.conv_transpose writes it: the lhs-dilated
# convolution of x by the filter, stride s, padding (k - 1 - p, k - 1 - p + output_padding) for
# PyTorch's (kernel k, stride s, padding p).

def _transposed(name, x_shape, k, cout, stride, pad, output_padding=0) -> ConvCase:
    nd = len(x_shape) - 2
    lo, hi = k - 1 - pad, k - 1 - pad + output_padding
    return case(name, x_shape, (k,) * nd + (x_shape[-1], cout), window_strides=(1,) * nd,
                padding=((lo, hi),) * nd, lhs_dilation=(stride,) * nd)


def video_3d_layers(batch: int) -> list[ConvCase]:
    """A video / medical U-Net's 3-D convolutions at 32x64x64 voxels: 3x3x3 (32->64, 64->64),
    the factorised R(2+1)D pair (1x3x3, 3x1x1), and the decoder's transposed convolutions
    (2x2x2 and 3x3x3 at stride 2, 16x32x32 -> 32x64x64: jax#31662's gradient is their
    bwd_data)."""
    v = (batch, 32, 64, 64)
    return [case("3d_3x3x3_32_64", (*v, 32), (3, 3, 3, 32, 64), window_strides=(1, 1, 1),
                 padding=((1, 1),) * 3),
            case("3d_3x3x3_64", (*v, 64), (3, 3, 3, 64, 64), window_strides=(1, 1, 1),
                 padding=((1, 1),) * 3),
            case("3d_1x3x3_64", (*v, 64), (1, 3, 3, 64, 64), window_strides=(1, 1, 1),
                 padding=((0, 0), (1, 1), (1, 1))),
            case("3d_3x1x1_64", (*v, 64), (3, 1, 1, 64, 64), window_strides=(1, 1, 1),
                 padding=((1, 1), (0, 0), (0, 0))),
            _transposed("3d_T2x2x2s2_64_32", (batch, 16, 32, 32, 64), 2, 32, 2, 0),
            _transposed("3d_T3x3x3s2_64_32", (batch, 16, 32, 32, 64), 3, 32, 2, 1, 1)]


def grouped_layers(batch: int) -> list[ConvCase]:
    """ResNeXt-50 32x4d's grouped 3x3 convolutions: 32 groups of 4, 8, 16 and 32 channels, and
    the stride-2 one that opens stage 2 (jax#13800: grouped backward as slow as dense)."""
    return [layer("g3x3_128_32g", batch, 56, 128, 128, 3, 1, 1, groups=32),
            layer("g3x3_256_32g", batch, 28, 256, 256, 3, 1, 1, groups=32),
            layer("g3x3_512_32g", batch, 14, 512, 512, 3, 1, 1, groups=32),
            layer("g3x3_1024_32g", batch, 7, 1024, 1024, 3, 1, 1, groups=32),
            layer("g3x3s2_256_32g", batch, 56, 256, 256, 3, 2, 1, groups=32)]


def transposed_2d_layers(batch: int) -> list[ConvCase]:
    """2-D transposed convolutions: a DCGAN generator's 4x4 stride-2 layers and a U-Net
    decoder's 3x3 stride-2 ones (output_padding 1), each doubling the resolution."""
    quarter = max(1, batch // 4)  # the U-Net layers' larger images
    return [_transposed("t4x4s2_512_256", (batch, 8, 8, 512), 4, 256, 2, 1),
            _transposed("t4x4s2_256_128", (batch, 16, 16, 256), 4, 128, 2, 1),
            _transposed("t4x4s2_128_64", (batch, 32, 32, 128), 4, 64, 2, 1),
            _transposed("t3x3s2_256_128", (quarter, 32, 32, 256), 3, 128, 2, 1, 1),
            _transposed("t3x3s2_128_64", (quarter, 64, 64, 128), 3, 64, 2, 1, 1)]


def dilated_depthwise_layers(batch: int) -> list[ConvCase]:
    """Dilated depthwise 3x3 convolutions (DeepLab / MobileNet atrous blocks; jax#26266) at
    dilation 2 and 4."""
    def dw(name, hw, c, d):
        return case(name, (batch, hw, hw, c), (3, 3, 1, c), window_strides=(1, 1),
                    padding=((d, d), (d, d)), rhs_dilation=(d, d), feature_group_count=c)
    return [dw("dw3x3_d2_144", 56, 144, 2), dw("dw3x3_d4_144", 56, 144, 4),
            dw("dw3x3_d2_288", 28, 288, 2), dw("dw3x3_d4_576", 14, 576, 4)]


# The GPU benchmark's other tables (benchmarks/bench_conv_gpu.py --table): (layers at a batch,
# the default batch).
CONV_TABLES = {"3d": (video_3d_layers, 4), "grouped": (grouped_layers, 64),
               "transposed": (transposed_2d_layers, 64),
               "dilated_depthwise": (dilated_depthwise_layers, 64)}


CORRECTNESS_GRID = [
    ConvCase("2d_basic", (2, 7, 6, 5), (3, 3, 5, 4),
             dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC)),
    ConvCase("2d_stride_asym_pad", (2, 9, 8, 3), (3, 2, 3, 4),
             dict(window_strides=(2, 3), padding=[(2, 0), (1, 3)], dimension_numbers=NHWC)),
    ConvCase("2d_oversized_pad", (1, 3, 4, 2), (2, 2, 2, 3),
             dict(window_strides=(1, 1), padding=[(4, 5), (3, 3)], dimension_numbers=NHWC)),
    ConvCase("2d_negative_pad", (2, 8, 9, 3), (3, 3, 3, 2),
             dict(window_strides=(1, 2), padding=[(-1, 1), (1, -2)], dimension_numbers=NHWC)),
    ConvCase("2d_valid_even_kernel", (2, 8, 7, 4), (4, 2, 4, 3),
             dict(window_strides=(1, 1), padding="VALID", dimension_numbers=NHWC)),
    ConvCase("2d_rhs_dilation", (2, 11, 10, 3), (3, 3, 3, 4),
             dict(window_strides=(1, 1), padding="SAME", rhs_dilation=(2, 3),
                  dimension_numbers=NHWC)),
    ConvCase("2d_lhs_dilation", (2, 5, 4, 3), (3, 2, 3, 2),
             dict(window_strides=(1, 2), padding=[(1, 2), (0, 1)], lhs_dilation=(2, 3),
                  dimension_numbers=NHWC)),
    ConvCase("2d_groups", (2, 6, 5, 6), (3, 3, 2, 9),
             dict(window_strides=(1, 1), padding="SAME", feature_group_count=3,
                  dimension_numbers=NHWC)),
    ConvCase("2d_depthwise", (2, 7, 7, 8), (3, 3, 1, 8),
             dict(window_strides=(2, 2), padding="SAME", feature_group_count=8,
                  dimension_numbers=NHWC)),
    ConvCase("2d_depthwise_multiplier", (1, 6, 6, 4), (5, 5, 1, 8),
             dict(window_strides=(1, 1), padding=[(2, 2), (2, 2)], feature_group_count=4,
                  dimension_numbers=NHWC)),
    ConvCase("2d_batch_groups", (6, 5, 6, 4), (3, 2, 4, 6),
             dict(window_strides=(1, 1), padding="SAME", batch_group_count=3,
                  dimension_numbers=NHWC)),
    ConvCase("2d_nchw_oihw", (2, 3, 7, 6), (4, 3, 3, 2),
             dict(window_strides=(1, 2), padding="SAME",
                  dimension_numbers=("NCHW", "OIHW", "NCHW"))),
    ConvCase("2d_mixed_layouts", (2, 3, 7, 6), (3, 2, 3, 4),
             dict(window_strides=(2, 1), padding=[(1, 1), (0, 2)],
                  dimension_numbers=("NCHW", "HWIO", "NHWC"))),
    ConvCase("2d_default_dnums", (2, 3, 6, 5), (4, 3, 2, 3),
             dict(window_strides=(1, 1), padding="VALID")),
    ConvCase("2d_1x1_stride2", (2, 8, 8, 6), (1, 1, 6, 5),
             dict(window_strides=(2, 2), padding="VALID", dimension_numbers=NHWC)),
    ConvCase("2d_empty_spatial", (2, 0, 5, 3), (3, 3, 3, 4),
             dict(window_strides=(1, 1), padding="VALID", dimension_numbers=NHWC)),
    ConvCase("2d_empty_input_padded", (1, 0, 4, 2), (1, 3, 2, 3),
             dict(window_strides=(1, 1), padding=[(1, 1), (1, 1)], dimension_numbers=NHWC)),
    ConvCase("1d", (3, 17, 4), (5, 4, 6),
             dict(window_strides=(2,), padding=[(3, 1)], rhs_dilation=(2,),
                  dimension_numbers=channels_last(1))),
    ConvCase("1d_ncw_groups", (2, 6, 13), (6, 3, 4),
             dict(window_strides=(1,), padding="SAME", feature_group_count=2,
                  dimension_numbers=("NCW", "OIW", "NCW"))),
    ConvCase("3d", (2, 5, 6, 4, 3), (2, 3, 2, 3, 4),
             dict(window_strides=(1, 2, 1), padding="SAME", dimension_numbers=channels_last(3))),
    ConvCase("3d_dilated_groups", (1, 6, 5, 7, 4), (2, 2, 3, 2, 6),
             dict(window_strides=(2, 1, 1), padding=[(1, 0), (1, 1), (2, 2)],
                  rhs_dilation=(2, 1, 2), feature_group_count=2,
                  dimension_numbers=channels_last(3))),
    # the shape classes of the slow-in-JAX tables (CONV_TABLES), small: a U-Net decoder's 3-D
    # transposed convolutions (3x3x3 and 2x2x2, stride 2), R(2+1)D's 3x1x1, a GAN's 4x4 stride-2
    # transposed convolution, ResNeXt's grouped 3x3 (4 channels a group, stride 2) and a
    # dilation-4 depthwise 3x3
    _transposed("3d_transposed_3x3x3_s2", (2, 3, 4, 4, 5), 3, 4, 2, 1, 1),
    _transposed("3d_transposed_2x2x2_s2", (2, 3, 3, 4, 6), 2, 3, 2, 0),
    case("3d_3x1x1", (2, 5, 4, 4, 6), (3, 1, 1, 6, 5), window_strides=(1, 1, 1),
         padding=((1, 1), (0, 0), (0, 0))),
    _transposed("2d_transposed_4x4_s2", (2, 4, 5, 6), 4, 5, 2, 1),
    case("2d_grouped_cg4_s2", (2, 9, 9, 32), (3, 3, 4, 32), window_strides=(2, 2),
         padding=((1, 1), (1, 1)), feature_group_count=8),
    case("2d_depthwise_dilated4", (2, 13, 12, 8), (3, 3, 1, 8), window_strides=(1, 1),
         padding=((4, 4), (4, 4)), rhs_dilation=(4, 4), feature_group_count=8),
    ConvCase("2d_wide_channels", (2, 6, 6, 48), (3, 3, 48, 40),
             dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC)),
]

ODD_SIZES = [
    case("odd_3_to_24_5x5_s2", (2, 17, 15, 3), (5, 5, 3, 24), window_strides=(2, 2),
         padding=((2, 2), (2, 2))),
    case("odd_5_to_17_same", (2, 13, 11, 5), (3, 3, 5, 17), window_strides=(1, 1),
         padding="SAME"),
    case("odd_17_to_24_s2_asym", (3, 9, 7, 17), (3, 3, 17, 24), window_strides=(2, 2),
         padding=((1, 0), (0, 1))),
    case("odd_24_to_5_1x1", (2, 11, 13, 24), (1, 1, 24, 5), window_strides=(1, 1),
         padding="VALID"),
    case("odd_24_to_24_3x3", (2, 15, 13, 24), (3, 3, 24, 24), window_strides=(1, 1),
         padding="SAME"),
    case("odd_groups_3", (2, 9, 11, 24), (3, 3, 8, 9), window_strides=(1, 1), padding="SAME",
         feature_group_count=3),
    case("odd_dilated_17_to_24", (2, 15, 13, 17), (3, 3, 17, 24), window_strides=(1, 1),
         padding="SAME", rhs_dilation=(2, 2)),
    case("odd_depthwise_24_5x5_s2", (2, 15, 13, 24), (5, 5, 1, 24), window_strides=(2, 2),
         padding=((2, 2), (2, 2)), feature_group_count=24),
    case("odd_depthwise_3x3_17", (2, 13, 11, 16), (3, 3, 1, 16), window_strides=(1, 1),
         padding=((1, 1), (1, 1)), feature_group_count=16),
]

CONV1D = [
    case("1d_24_to_17", (4, 37, 24), (5, 24, 17), window_strides=(1,), padding=((2, 2),)),
    case("1d_s2_dilated_5_to_24", (3, 61, 5), (7, 5, 24), window_strides=(2,),
         padding=((3, 4),), rhs_dilation=(2,)),
    case("1d_64_to_128", (2, 129, 64), (3, 64, 128), window_strides=(1,), padding="SAME"),
]

CONV3D = [
    case("3d_16_to_24", (2, 7, 9, 8, 16), (3, 3, 3, 16, 24), window_strides=(1, 1, 1),
         padding="SAME"),
    case("3d_odd_3_to_5", (1, 5, 6, 7, 3), (3, 3, 3, 3, 5), window_strides=(1, 2, 1),
         padding=((1, 1), (1, 1), (0, 2))),
    case("3d_64_to_64_1x1x1", (2, 4, 6, 5, 64), (1, 1, 1, 64, 64), window_strides=(1, 1, 1),
         padding="VALID"),
]

KERNEL_GRID = [
    case("3x3_same", (2, 9, 11, 16), (3, 3, 16, 24), window_strides=(1, 1), padding="SAME"),
    case("3x3_stride2_asym", (3, 13, 10, 8), (3, 3, 8, 16), window_strides=(2, 2),
         padding=((1, 2), (0, 1))),
    case("classes_stride3_empty", (2, 10, 11, 16), (1, 1, 16, 32), window_strides=(3, 3),
         padding="VALID"),
    case("1x1_two_n_tiles", (2, 7, 9, 32), (1, 1, 32, 136), window_strides=(1, 1),
         padding="VALID"),
    case("dilated", (1, 12, 12, 8), (3, 3, 8, 8), window_strides=(1, 1), padding="SAME",
         rhs_dilation=(2, 2)),
    case("lhs_dilated", (2, 6, 5, 8), (3, 2, 8, 16), window_strides=(1, 2),
         padding=((1, 2), (0, 1)), lhs_dilation=(2, 3)),
    case("groups", (2, 8, 8, 32), (3, 3, 16, 48), window_strides=(1, 1), padding="SAME",
         feature_group_count=2),
    case("many_tiles_split_k", (4, 30, 30, 64), (3, 3, 64, 64), window_strides=(1, 1),
         padding="SAME"),
    case("wide_reduction", (8, 16, 16, 64), (3, 3, 64, 128), window_strides=(1, 1),
         padding="SAME"),
    case("halo_3x3_asym", (3, 28, 21, 128), (3, 3, 128, 192), window_strides=(1, 1),
         padding=((2, 0), (0, 2))),
    case("halo_2x5", (2, 30, 15, 64), (2, 5, 64, 128), window_strides=(1, 1),
         padding=((1, 0), (2, 2))),
    case("im2col_s2_dilated", (3, 15, 13, 64), (3, 3, 64, 128), window_strides=(2, 2),
         padding=((1, 2), (0, 1)), rhs_dilation=(1, 2)),
    case("im2col_groups", (2, 9, 10, 128), (3, 3, 64, 128), window_strides=(1, 1),
         padding="SAME", feature_group_count=2),
    case("im2col_256_columns", (2, 9, 7, 256), (3, 3, 256, 256), window_strides=(1, 1),
         padding=((1, 0), (0, 2))),
    case("im2col_512_outputs_s2", (3, 5, 11, 64), (1, 1, 64, 512), window_strides=(2, 2),
         padding="VALID"),
    case("im2col_tf32_32_channels", (2, 7, 11, 32), (2, 3, 32, 96), window_strides=(1, 1),
         padding=((1, 0), (2, 1))),
    case("ragged_96_inputs", (2, 10, 9, 96), (3, 3, 96, 64), window_strides=(1, 1),
         padding="SAME"),
    case("stem_3_channels", (2, 17, 17, 3), (7, 7, 3, 64), window_strides=(2, 2),
         padding=((3, 3), (3, 3))),
    case("padded_136_outputs", (2, 9, 10, 5), (3, 3, 5, 136), window_strides=(1, 1),
         padding="SAME"),
    case("groups_6_channels", (2, 9, 8, 12), (3, 3, 6, 16), window_strides=(1, 1),
         padding="SAME", feature_group_count=2),
    case("depthwise", (2, 12, 13, 24), (3, 3, 1, 24), window_strides=(1, 1), padding="SAME",
         feature_group_count=24),
    case("depthwise_3x3_asym_pad", (3, 9, 10, 20), (3, 3, 1, 20), window_strides=(1, 1),
         padding=((0, 2), (2, 0)), feature_group_count=20),
    case("depthwise_7x7_s2", (2, 15, 14, 16), (7, 7, 1, 32), window_strides=(2, 2),
         padding=((3, 3), (3, 3)), feature_group_count=16),
]

