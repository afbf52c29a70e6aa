"""Routing code that calls ``jax.lax``'s convolutions (flax's ``nn.ConvTranspose``, equinox's
convolutions) to jaxdnn's kernels, by swapping the ``jax.lax`` attributes."""

from __future__ import annotations

import contextlib

import jax
import jax._src.lax  # noqa: F401 - private: jax's own callers of conv_general_dilated
import jax._src.lax.convolution  # noqa: F401

from .ops.conv import conv_general_dilated


# Where jax looks conv_general_dilated up: the public name, and the modules whose own functions
# call it (lax.conv_transpose and lax.conv, jnp.convolve, jax.scipy.signal, lax's transpose
# rules), so that those run on jaxdnn too.
_MODULES = (jax.lax, jax._src.lax, jax._src.lax.convolution)


@contextlib.contextmanager
def swapped_lax():
    """``jax.lax.conv_general_dilated`` is jaxdnn's while the block runs (process-wide), also
    where jax's own functions call it (``lax.conv_transpose``, ``lax.conv``); the previous
    functions come back on exit."""
    saved = [(m, m.conv_general_dilated) for m in _MODULES if hasattr(m, "conv_general_dilated")]
    try:
        for module, _ in saved:
            module.conv_general_dilated = conv_general_dilated
        yield
    finally:
        for module, fn in saved:
            module.conv_general_dilated = fn


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
    (``lax.conv_general_dilated_local`` behind ``nn.ConvLocal``).
    """
    jax.clear_caches()
    try:
        with swapped_lax():
            yield
    finally:
        jax.clear_caches()
