"""Equinox modules on jaxdnn's kernels: ``Conv``, ``ConvTranspose`` and ``BatchNorm``.

Each subclasses the equinox module of the same name: same constructor, same fields (the
pytrees have the same leaves, so ``eqx.tree_serialise_leaves`` files load either way), same
state (``eqx.nn.State``) and, like equinox's, a call takes one example: ``jax.vmap`` it over the
batch (with ``axis_name`` for ``BatchNorm``).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ._patch import swapped_lax
from .flax._common import require
from .ops.norm import batch_norm_inference

eqx = require("equinox", "jaxdnn.equinox")

__all__ = ["BatchNorm", "Conv", "ConvTranspose"]


class Conv(eqx.nn.Conv):
    """``equinox.nn.Conv`` on jaxdnn's kernels. Equinox calls ``jax.lax.conv_general_dilated``
    with no hook, so the call swaps it for jaxdnn's while the stock code traces (process-wide
    for that moment; see :func:`jaxdnn.use_jaxdnn`)."""

    def __call__(self, x, *, key=None):
        with swapped_lax():
            return super().__call__(x, key=key)


class ConvTranspose(eqx.nn.ConvTranspose):
    """``equinox.nn.ConvTranspose`` on jaxdnn's kernels, as :class:`Conv`."""

    def __call__(self, x, *, key=None):
        with swapped_lax():
            return super().__call__(x, key=key)


class BatchNorm(eqx.nn.BatchNorm):
    """``equinox.nn.BatchNorm`` ("ema" and "batch" modes) normalising with
    :func:`jaxdnn.batch_norm_inference`. The batch statistics are equinox's: per channel over
    the example's other axes, ``lax.pmean``-averaged over ``axis_name`` (the two-pass variance),
    accumulated in float32 and returned in the input's dtype."""

    def _batch_stats(self, x):
        axes = tuple(range(1, x.ndim))
        xs = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        mean = lax.pmean(xs.mean(axes), self.axis_name)
        centred = xs - mean.reshape(mean.shape + (1,) * len(axes))
        var = jnp.maximum(0.0, lax.pmean(jnp.square(centred).mean(axes), self.axis_name))
        return mean.astype(x.dtype), var.astype(x.dtype)

    def __call__(self, x, state, *, key=None, inference: bool | None = None):
        if inference is None:
            inference = self.inference
        if self.mode == "ema":
            if inference:
                mean, var = state.get(self.ema_state_index)
            else:
                first_time = state.get(self.ema_first_time_index)
                state = state.set(self.ema_first_time_index, jnp.array(False))
                batch_mean, batch_var = self._batch_stats(x)
                running_mean, running_var = state.get(self.ema_state_index)
                mean = (1 - self.momentum) * batch_mean + self.momentum * running_mean
                var = (1 - self.momentum) * batch_var + self.momentum * running_var
                mean = lax.select(first_time, batch_mean.astype(mean.dtype), mean)
                var = lax.select(first_time, batch_var.astype(var.dtype), var)
                state = state.set(self.ema_state_index, (mean, var))
        else:
            counter = state.get(self.batch_counter)
            hidden_mean, hidden_var = state.get(self.batch_state_index)
            if inference:
                scale = jnp.where(counter == 0, 1, 1 - self.momentum ** counter)
                mean, var = hidden_mean / scale, hidden_var / scale
            else:
                mean, var = self._batch_stats(x)
                state = state.set(self.batch_counter, counter + 1)
                state = state.set(self.batch_state_index, (
                    hidden_mean * self.momentum + mean * (1 - self.momentum),
                    hidden_var * self.momentum + var * (1 - self.momentum)))
        affine = (self.weight, self.bias) if self.channelwise_affine else (None, None)
        dtype = jnp.result_type(x, mean, var, *(p for p in affine if p is not None))
        y = batch_norm_inference(x.astype(dtype), *affine, mean, var, axis=0, eps=self.eps)
        return y, state
