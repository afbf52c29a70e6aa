"""jaxdnn: deep-learning primitives for JAX on our own CPU and CUDA kernels.

Every op is a JAX primitive lowered to an XLA FFI custom call, so it works under ``jit``,
``grad``, ``jvp``, ``vmap`` and higher-order derivatives like a ``jax.lax`` op.
"""

from __future__ import annotations

from ._version import __version__
from . import _ffi  # noqa: F401  (registers every FFI target)
from .ops import activation as _activation
from .ops import norm as _norm
from .ops import pool as _pool
from .ops import softmax as _softmax
from .ops.activation import *  # noqa: F403
from ._config import config
from ._patch import use_jaxdnn
from .ops.conv import ConvSpec, conv, conv_general_dilated, conv_transpose
from .ops.norm import *  # noqa: F403
from .ops.pool import *  # noqa: F403
from .ops.softmax import *  # noqa: F403
# Importing a family's selection module registers it for lowering and explain.
from .selection.conv import (ConvProblem, FindResult, conv_algorithms, conv_problem,
                             conv_problems, find_conv_algorithms)
from .selection.core import AlgoInfo
from .selection.explain import explain
from .selection.norm import norm_algorithms
from .selection.pool import pool_algorithms
from .selection.softmax import softmax_algorithms


def build_info() -> dict:
    """How this copy of jaxdnn was built, and what it runs on."""
    import jax
    import jaxlib

    from . import _build_config

    return {
        "version": __version__,
        "cuda": _build_config.CUDA,
        "cuda_architectures": _build_config.CUDA_ARCHITECTURES,
        "cuda_compiler_version": _build_config.CUDA_COMPILER_VERSION or None,
        "ffi_api_version": tuple(_ffi._cpu.ffi_api_version()),
        "ffi_version": _ffi.FFI_VERSION,
        "ffi_targets": _ffi.TARGETS,
        "built_with_jax": _build_config.BUILD_JAX_VERSION,
        "built_with_jaxlib": _build_config.BUILD_JAXLIB_VERSION,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
    }


def export_safety_checks() -> list:
    """The safety checks :func:`jax.export.export` must skip to serialize a function that uses
    jaxdnn: one ``jax.export.DisabledSafetyCheck.custom_call`` per jaxdnn FFI target::

        exported = jax.export.export(jax.jit(f),
                                     disabled_checks=jaxdnn.export_safety_checks())(*args)
        restored = jax.export.deserialize(exported.serialize())  # then restored.call(*args)

    jax guarantees compatibility only for its own custom calls. jaxdnn's targets are named
    ``jaxdnn_<op>_v<N>``, with ``N`` the version of their operands and attributes
    (``build_info()["ffi_version"]``, ``build_info()["ffi_targets"]``): a serialized function
    runs under any jaxdnn of the same version, which must be imported (it registers the
    targets) before the function is called; under another version its custom calls have no
    implementation and compiling it fails.
    """
    import jax

    return [jax.export.DisabledSafetyCheck.custom_call(t) for t in _ffi.TARGETS]


__all__ = [
    *_activation.__all__,
    *_norm.__all__,
    *_pool.__all__,
    *_softmax.__all__,
    "AlgoInfo",
    "ConvProblem",
    "ConvSpec",
    "FindResult",
    "build_info",
    "config",
    "conv",
    "conv_algorithms",
    "conv_general_dilated",
    "conv_problem",
    "conv_problems",
    "conv_transpose",
    "explain",
    "export_safety_checks",
    "find_conv_algorithms",
    "norm_algorithms",
    "pool_algorithms",
    "softmax_algorithms",
    "use_jaxdnn",
]
