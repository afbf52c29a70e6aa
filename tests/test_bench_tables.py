"""The GPU conv benchmark's tables (benchmarks/bench_conv_gpu.py --table): every layer is a
problem both sides accept with the same output shape, the transposed layers double their
input's resolution, and the FLOP count of a transposed layer is that of the forward
convolution whose gradient it is."""

from __future__ import annotations

import importlib
import math
import sys

import jax
import jax.numpy as jnp
import pytest

from problems import CONV_TABLES, case
from util import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
common = importlib.import_module("common")


@pytest.mark.parametrize("table", sorted(CONV_TABLES) + ["resnet"])
def test_tables_are_problems_of_both_sides(table):
    for layer in common.table_layers(table, 2):
        x, w, y = common.layer_shapes(layer)
        args = (jax.ShapeDtypeStruct(x, jnp.bfloat16), jax.ShapeDtypeStruct(w, jnp.bfloat16))
        ours, xla = common.conv_fns(layer)
        assert jax.eval_shape(ours, *args).shape == y == jax.eval_shape(xla, *args).shape, layer
        if layer.kw.get("lhs_dilation"):
            assert y[1:-1] == tuple(2 * d for d in x[1:-1]), layer  # stride 2 upsampling
        assert common.conv_flops(layer, "train") == 3 * common.conv_flops(layer, "fwd") > 0


def test_transposed_flops_are_the_forward_gradients():
    """A 4x4 stride-2 transposed layer counts the FLOPs of the 4x4 stride-2 convolution from
    its output back to its input (whose bwd_data it is)."""
    (layer,) = [lay for lay in common.table_layers("transposed", 2)
                if lay.name == "t4x4s2_512_256"]
    _, _, y = common.layer_shapes(layer)
    forward = case("fwd", y, (4, 4, 256, 512), window_strides=(2, 2), padding=((1, 1), (1, 1)))
    assert common.layer_shapes(forward)[2] == layer.x_shape
    assert common.conv_flops(layer, "fwd") == common.conv_flops(forward, "fwd") == (
        2.0 * math.prod(layer.x_shape[:-1]) * math.prod(layer.w_shape))
