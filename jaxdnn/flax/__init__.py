"""Flax linen modules on jaxdnn's kernels (``jaxdnn.flax.nnx`` has the nnx ones).

Each class subclasses the flax module of the same name, so it takes the same constructor
fields, creates the same variables ('params': ``kernel``/``scale``/``bias``, 'batch_stats':
``mean``/``var``, same shapes and dtypes) and promotes dtypes the same way: a checkpoint of the
stock module loads into the adapter and back. Calls the kernels cannot express (a ``mask``,
several batch-norm feature axes, ``force_float32_reductions=False``, cross-device statistics of
the per-example norms, group-norm reduction axes that are not a trailing run) run the stock
flax code.

    Conv            flax's ``conv_general_dilated`` hook set to jaxdnn.conv_general_dilated
    ConvTranspose   ``jax.lax.conv_transpose`` swapped for jaxdnn's while it traces
    BatchNorm       jaxdnn.batch_norm / batch_norm_inference; with ``axis_name`` the
                    statistics are ``lax.pmean``-averaged as in flax
    LayerNorm, RMSNorm, GroupNorm   jaxdnn.layer_norm / rms_norm / group_norm

``nn.ConvLocal`` has no counterpart: its convolution is ``lax.conv_general_dilated_local``,
patch extraction plus a per-position contraction, which jaxdnn has no kernel for.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax.numpy as jnp

from .._patch import swapped_lax
from ..ops.conv import conv_general_dilated
from ..ops.norm import batch_norm_inference, group_norm, layer_norm, rms_norm
from ._common import require, train_batch_norm

nn = require("flax.linen", "jaxdnn.flax")
canonicalize_dtype = require("flax.linen.dtypes", "jaxdnn.flax").canonicalize_dtype

__all__ = ["BatchNorm", "Conv", "ConvTranspose", "GroupNorm", "LayerNorm", "RMSNorm"]


def _axes(ndim: int, axes) -> tuple[int, ...]:
    return tuple(sorted({a % ndim for a in (axes if isinstance(axes, (tuple, list)) else
                                            (axes,))}))


def _affine(mdl, x, shape, use_scale: bool, use_bias: bool):
    """The module's scale and bias params (as flax's ``_normalize`` creates them), `x` in the
    dtype flax computes in, and the output dtype flax promotes to."""
    scale = mdl.param("scale", mdl.scale_init, shape, mdl.param_dtype) if use_scale else None
    bias = mdl.param("bias", mdl.bias_init, shape, mdl.param_dtype) if use_bias else None
    out = canonicalize_dtype(x, *(p for p in (scale, bias) if p is not None), dtype=mdl.dtype)
    return scale, bias, x.astype(jnp.promote_types(x.dtype, out)), out


class Conv(nn.Conv):
    """``flax.linen.Conv`` on :func:`jaxdnn.conv_general_dilated` (flax's own hook)."""

    conv_general_dilated: Callable | None = conv_general_dilated


class ConvTranspose(nn.ConvTranspose):
    """``flax.linen.ConvTranspose`` whose ``lax.conv_transpose`` runs jaxdnn's kernels.

    Flax calls ``jax.lax.conv_transpose`` with no hook, so the call swaps it (and
    ``jax.lax.conv_general_dilated``) for jaxdnn's while the stock module traces; the swap is
    process-wide for that moment (see :func:`jaxdnn.use_jaxdnn`).
    """

    @nn.compact
    def __call__(self, inputs):
        with swapped_lax():
            return super().__call__(inputs)


class BatchNorm(nn.BatchNorm):
    """``flax.linen.BatchNorm`` on jaxdnn's batch-norm kernels (single feature axis)."""

    @nn.compact
    def __call__(self, x, use_running_average: bool | None = None, *, mask=None):
        feature_axes = _axes(x.ndim, self.axis)
        if mask is not None or len(feature_axes) != 1 or not self.force_float32_reductions:
            return super().__call__(x, use_running_average, mask=mask)
        use_running_average = nn.merge_param("use_running_average", self.use_running_average,
                                             use_running_average)
        (axis,) = feature_axes
        shape = (x.shape[axis],)
        ra_mean = self.variable("batch_stats", "mean", lambda s: jnp.zeros(s, jnp.float32),
                                shape)
        ra_var = self.variable("batch_stats", "var", lambda s: jnp.ones(s, jnp.float32), shape)
        scale, bias, x, out = _affine(self, x, shape, self.use_scale, self.use_bias)
        if use_running_average:
            y = batch_norm_inference(x, scale, bias, ra_mean.value, ra_var.value, axis=axis,
                                     eps=self.epsilon)
        else:
            init = self.is_initializing()
            y, mean, var = train_batch_norm(x, scale, bias, axis=axis, eps=self.epsilon,
                                            axis_name=None if init else self.axis_name,
                                            axis_index_groups=self.axis_index_groups)
            if not init:
                ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * mean
                ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var
        return y.astype(out)


def _row_norm(mdl, x, use_bias: bool, norm):
    """Layer or RMS norm over ``mdl.reduction_axes`` with params over ``mdl.feature_axes``;
    jaxdnn applies them when the two agree, else they broadcast afterwards as in flax."""
    red, feat = _axes(x.ndim, mdl.reduction_axes), _axes(x.ndim, mdl.feature_axes)
    scale, bias, xc, out = _affine(mdl, x, [x.shape[a] for a in feat], mdl.use_scale, use_bias)
    if feat == red:
        return norm(xc, scale, bias, red).astype(out)
    y = norm(xc, None, None, red)
    bshape = [x.shape[a] if a in feat else 1 for a in range(x.ndim)]
    if scale is not None:
        y = y * scale.reshape(bshape)
    if bias is not None:
        y = y + bias.reshape(bshape)
    return y.astype(out)


class LayerNorm(nn.LayerNorm):
    """``flax.linen.LayerNorm`` on :func:`jaxdnn.layer_norm`."""

    @nn.compact
    def __call__(self, x, *, mask=None):
        if mask is not None or self.axis_name is not None or not self.force_float32_reductions:
            return super().__call__(x, mask=mask)
        return _row_norm(self, x, self.use_bias, lambda x, s, b, axes: layer_norm(
            x, s, b, axis=axes, eps=self.epsilon))


class RMSNorm(nn.RMSNorm):
    """``flax.linen.RMSNorm`` on :func:`jaxdnn.rms_norm`."""

    @nn.compact
    def __call__(self, x, *, mask=None):
        if mask is not None or self.axis_name is not None:
            return super().__call__(x, mask=mask)
        return _row_norm(self, x, False, lambda x, s, b, axes: rms_norm(
            x, s, axis=axes, eps=self.epsilon))


class GroupNorm(nn.GroupNorm):
    """``flax.linen.GroupNorm`` on :func:`jaxdnn.group_norm` (reduction axes: a trailing run
    ending at the channels, by default every axis but the first)."""

    def _groups(self, channels: int) -> int | None:
        """The number of groups, or None where flax's configuration check should answer."""
        if (self.num_groups is None) == (self.group_size is None):
            return None
        if self.group_size is not None:
            return channels // self.group_size if channels % self.group_size == 0 else None
        return self.num_groups if self.num_groups > 0 and channels % self.num_groups == 0 \
            else None

    @nn.compact
    def __call__(self, x, *, mask=None):
        red = (tuple(range(min(1, x.ndim - 1), x.ndim)) if self.reduction_axes is None
               else _axes(x.ndim, self.reduction_axes))
        groups = self._groups(x.shape[-1])
        if (mask is not None or self.axis_name is not None or groups is None
                or not self.force_float32_reductions or red != tuple(range(red[0], x.ndim))):
            return super().__call__(x, mask=mask)
        c = x.shape[-1]
        scale, bias, xc, out = _affine(self, x, (c,), self.use_scale, self.use_bias)
        x3 = xc.reshape(math.prod(x.shape[:red[0]]), -1, c)
        return group_norm(x3, scale, bias, groups=groups, eps=self.epsilon).reshape(
            x.shape).astype(out)
