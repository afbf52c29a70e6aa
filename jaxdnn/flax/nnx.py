"""Flax nnx modules on jaxdnn's kernels: ``Conv`` and ``BatchNorm``.

Each subclasses the nnx module of the same name: same constructor arguments, same variables
(``kernel``/``bias``, ``scale``/``bias`` Params, ``mean``/``var`` BatchStats) and the same dtype
promotion (``promote_dtype``), so states move between the stock module and the adapter.
"""

from __future__ import annotations

from jax import lax

from ..ops.conv import conv_general_dilated
from ..ops.norm import batch_norm_inference
from ._common import require, train_batch_norm

nnx = require("flax.nnx", "jaxdnn.flax.nnx")

__all__ = ["BatchNorm", "Conv"]


class Conv(nnx.Conv):
    """``flax.nnx.Conv`` on :func:`jaxdnn.conv_general_dilated` (nnx's own argument)."""

    def __init__(self, *args, conv_general_dilated=conv_general_dilated, **kwargs):
        super().__init__(*args, conv_general_dilated=conv_general_dilated, **kwargs)


class BatchNorm(nnx.BatchNorm):
    """``flax.nnx.BatchNorm`` on jaxdnn's batch-norm kernels; a ``mask`` runs the stock code.
    With ``axis_name`` the statistics are ``lax.pmean``-averaged as in flax."""

    def __call__(self, x, use_running_average: bool | None = None, *, mask=None):
        if use_running_average is None:
            use_running_average = self.use_running_average
        if mask is not None or use_running_average is None:  # flax answers a missing flag
            return super().__call__(x, use_running_average, mask=mask)
        scale = self.scale[...] if self.scale is not None else None
        bias = self.bias[...] if self.bias is not None else None
        x, mean, var, scale, bias = self.promote_dtype(
            (x, self.mean[...], self.var[...], scale, bias), dtype=self.dtype)
        if use_running_average:
            return batch_norm_inference(x, scale, bias, mean, var, axis=self.axis,
                                        eps=self.epsilon)
        y, mean, var = train_batch_norm(x, scale, bias, axis=self.axis, eps=self.epsilon,
                                        axis_name=self.axis_name,
                                        axis_index_groups=self.axis_index_groups)
        # The running averages are state, never differentiated (flax's stop_gradient).
        self.mean[...] = lax.stop_gradient(self.momentum * self.mean[...]
                                           + (1 - self.momentum) * mean)
        self.var[...] = lax.stop_gradient(self.momentum * self.var[...]
                                          + (1 - self.momentum) * var)
        return y
