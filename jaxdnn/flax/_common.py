"""What the linen and nnx adapters share: the import check and the training batch norm."""

from __future__ import annotations

import importlib

import jax.numpy as jnp
from jax import lax

from ..ops.norm import batch_norm, batch_norm_inference


def require(package: str, module: str):
    """Imports `package`, or raises an ImportError that names it and the extra providing it."""
    try:
        return importlib.import_module(package)
    except ImportError as err:
        raise ImportError(f"{module} needs the `{package.split('.')[0]}` package: pip install "
                          f"{package.split('.')[0]} (or jaxdnn[frameworks])") from err


def train_batch_norm(x, scale, bias, *, axis: int, eps: float, axis_name=None,
                     axis_index_groups=None):
    """``(y, mean, var)`` of a training-mode batch norm over channel `axis` (biased variance).

    Without `axis_name` jaxdnn's kernel computes the statistics. With it they are averaged over
    the named axis as flax's ``_compute_stats`` does (one ``lax.pmean`` of the local
    ``E[x]`` and ``E[x^2]``, ``var = max(0, E[x^2] - E[x]^2)``) and jaxdnn's inference kernel
    normalises with them; gradients flow through the ``pmean``.
    """
    if axis_name is None:
        return batch_norm(x, scale, bias, axis=axis, eps=eps)
    axes = tuple(a for a in range(x.ndim) if a != axis % x.ndim)
    xs = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean, mean2 = lax.pmean(jnp.stack([xs.mean(axes), jnp.square(xs).mean(axes)]), axis_name,
                            axis_index_groups=axis_index_groups)
    var = jnp.maximum(0.0, mean2 - jnp.square(mean))
    return batch_norm_inference(x, scale, bias, mean, var, axis=axis, eps=eps), mean, var
