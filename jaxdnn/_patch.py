"""Routing code that calls ``jax.lax``'s convolutions (flax's ``nn.ConvTranspose``, equinox's
convolutions) to jaxdnn's kernels, by swapping the ``jax.lax`` attributes."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import jax
import numpy as np

from .ops.conv import conv_general_dilated


def _transpose_padding(k: int, s: int, padding: str) -> tuple[int, int]:
    """``jax.lax.conv_transpose``'s padding of the dilated input for 'SAME' and 'VALID'."""
    if padding == "SAME":
        pad_len = k + s - 2
        pad_a = k - 1 if s > k - 1 else int(np.ceil(pad_len / 2))
    else:
        pad_len = k + s - 2 + max(k - s, 0)
        pad_a = k - 1
    return pad_a, pad_len - pad_a


def lax_conv_transpose(lhs, rhs, strides: Sequence[int], padding,
                       rhs_dilation: Sequence[int] | None = None, dimension_numbers=None,
                       transpose_kernel: bool = False, precision=None,
                       preferred_element_type=None):
    """Drop-in for :func:`jax.lax.conv_transpose` (same arguments and arithmetic), running
    :func:`jaxdnn.conv_general_dilated`: a convolution of the input dilated by `strides`."""
    nd = lhs.ndim - 2
    if dimension_numbers is None:
        if nd > 3:
            raise ValueError("jaxdnn: conv_transpose of rank > 5 needs `dimension_numbers`")
        spatial = "HWD"[:nd]
        dimension_numbers = (f"N{spatial}C", f"{spatial}IO", f"N{spatial}C")
    dn = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    rhs_dilation = tuple(rhs_dilation) if rhs_dilation is not None else (1,) * nd
    if isinstance(padding, str):
        if padding not in ("SAME", "VALID"):
            raise ValueError(f"jaxdnn: conv_transpose `padding` must be 'SAME', 'VALID' or "
                             f"pairs, got {padding!r}")
        k_sizes = [rhs.shape[a] for a in dn.rhs_spec[2:]]
        pads = [_transpose_padding((k - 1) * d + 1, s, padding)
                for k, d, s in zip(k_sizes, rhs_dilation, strides)]
    else:
        pads = padding
    if transpose_kernel:  # flip the spatial dims and swap the kernel's I and O axes
        rhs = jax.numpy.flip(rhs, dn.rhs_spec[2:]).swapaxes(dn.rhs_spec[0], dn.rhs_spec[1])
    return conv_general_dilated(lhs, rhs, (1,) * nd, pads, tuple(strides), rhs_dilation, dn,
                                precision=precision,
                                preferred_element_type=preferred_element_type)


_SWAPS = {"conv_general_dilated": conv_general_dilated, "conv_transpose": lax_conv_transpose}


@contextlib.contextmanager
def swapped_lax():
    """``jax.lax.conv_general_dilated`` and ``jax.lax.conv_transpose`` are jaxdnn's while the
    block runs (process-wide); the previous functions come back on exit."""
    saved = {name: getattr(jax.lax, name) for name in _SWAPS}
    try:
        for name, fn in _SWAPS.items():
            setattr(jax.lax, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(jax.lax, name, fn)


@contextlib.contextmanager
def use_jaxdnn():
    """Runs code that calls ``jax.lax.conv_general_dilated`` / ``jax.lax.conv_transpose`` on
    jaxdnn's kernels: flax's ``nn.Conv`` (without its own ``conv_general_dilated``) and
    ``nn.ConvTranspose``, equinox's ``Conv`` and ``ConvTranspose``, any user code that looks
    the functions up on ``jax.lax`` when it traces.

    The swap is process-wide, for the duration of the block. Functions traced before the block
    keep their compiled lax convolutions, so JAX's caches are cleared on entry, and again on
    exit so that functions traced inside do not keep jaxdnn afterwards. Not covered: code
    holding its own reference taken before the block (``from jax.lax import
    conv_general_dilated``, flax nnx's ``nnx.Conv`` whose default is bound at import; use
    :mod:`jaxdnn.flax` there) and lax functions that call convolutions internally
    (``lax.conv``, ``lax.conv_general_dilated_local`` behind ``nn.ConvLocal``).
    """
    jax.clear_caches()
    try:
        with swapped_lax():
            yield
    finally:
        jax.clear_caches()
