"""Non-finite inputs against jax.lax / jnp in float64 (and float32): where max pooling's
gradient goes in windows of -inf and ties, the normalisation statistics of groups holding inf
or NaN, and the NaN that a convolution's padded taps make from infinite operands."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn
from util import PLATFORMS, assert_close, device, on

CPU = jax.devices("cpu")[0]
FLOATS = (jnp.float32, jnp.float64)


def _ids(d):
    return np.dtype(d).name


# ----------------------------------------------------------------------------------------------
# Max pooling: the gradient of windows of -inf, ties and padding
# ----------------------------------------------------------------------------------------------

def _pool_ref_vjp(x, ct, window, strides, pads):
    """jax.grad of lax.reduce_window max (padding -inf, flax's max_pool) in float64 on the
    CPU: select_and_scatter_add's gradient goes to the first maximal element in window order,
    padding counting as -inf, so a window of -inf whose first tap is padding drops it."""
    with jax.default_device(CPU):
        def f(v):
            return lax.reduce_window(v, -jnp.inf, lax.max, (1, *window, 1), (1, *strides, 1),
                                     ((0, 0), *pads, (0, 0)))
        y, vjp = jax.vjp(f, jnp.asarray(np.asarray(x, np.float64)))
        return y, vjp(jnp.asarray(np.asarray(ct, np.float64)))[0]


# (x shape, window, strides, padding): windows starting on padding and on the input, windows
# made only of padding, a window that covers the whole input (global pooling), and on the GPU
# the tile (2x2/2), strip (3x3/2) and general window kernels, with one and two output columns
# per thread.
POOL_CASES = {
    "1d_pad_only_windows": ((2, 6, 16), (3,), (1,), [(3, 2)]),
    "1d_stride2_pad": ((2, 9, 4), (2,), (2,), [(1, 1)]),
    "2d_3x3_s2_pad1": ((2, 9, 11, 16), (3, 3), (2, 2), [(1, 1), (1, 1)]),
    "2d_3x3_s1_same": ((2, 7, 6, 16), (3, 3), (1, 1), [(1, 1), (1, 1)]),
    "2d_2x2_s2_valid": ((2, 8, 10, 64), (2, 2), (2, 2), [(0, 0), (0, 0)]),
    "2d_asym_pad_scalar": ((2, 7, 5, 3), (2, 3), (1, 2), [(1, 0), (2, 1)]),
    "2d_global": ((3, 5, 7, 16), (5, 7), (1, 1), [(0, 0), (0, 0)]),
    "2d_global_long": ((2, 40, 48, 8), (40, 48), (1, 1), [(0, 0), (0, 0)]),
    "3d_overlap": ((1, 4, 5, 4, 8), (2, 3, 2), (1, 2, 1), [(1, 0), (1, 1), (0, 1)]),
}


def _pool_input(rng, shape, dtype):
    """Mostly -inf with ties: values from {-inf, 0, 1}; channel 0 all -inf, channel 1 -inf
    but for a few ones, the rest a mix (every window kind: all -inf, tied maxima)."""
    x = rng.choice(np.array([-np.inf, -np.inf, -np.inf, 0.0, 1.0]), size=shape)
    x[..., 0] = -np.inf
    if shape[-1] > 1:
        x[..., 1] = np.where(rng.random(shape[:-1]) < 0.1, 1.0, -np.inf)
    return x.astype(np.dtype(dtype))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [*FLOATS, jnp.bfloat16], ids=_ids)
@pytest.mark.parametrize("case", list(POOL_CASES), ids=str)
def test_max_pool_gradient_of_inf_windows_and_ties(case, dtype, platform):
    """y and jax.grad of max_pool equal lax's bit for bit on windows of -inf (the gradient to
    the first tap, dropped when that tap is padding) and tied maxima (the first one)."""
    device(platform)
    shape, window, strides, pads = POOL_CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    x = _pool_input(rng, shape, dtype)
    y_shape = jax.eval_shape(lambda v: jaxdnn.max_pool(v, window, strides, pads),
                             jax.ShapeDtypeStruct(shape, dtype)).shape
    ct = rng.integers(1, 5, y_shape).astype(np.dtype(dtype))  # exact sums in every dtype
    ref_y, ref_dx = _pool_ref_vjp(x, ct, window, strides, pads)

    @jax.jit
    def run(v, c):
        y, vjp = jax.vjp(lambda u: jaxdnn.max_pool(u, window, strides, pads), v)
        return y, vjp(c)[0]

    y, dx = run(*on(platform, x, ct))
    np.testing.assert_array_equal(np.asarray(y, np.float64), np.asarray(ref_y), err_msg="y")
    np.testing.assert_array_equal(np.asarray(dx, np.float64), np.asarray(ref_dx), err_msg="dx")
