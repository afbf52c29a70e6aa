"""Loading the compiled modules, registering their FFI targets, and lowering helpers.

`jaxdnn._cpu` is always built; `jaxdnn._cuda` exists when the package was built with nvcc.
Every target is registered for the CPU and, when built, for ``platform="CUDA"`` (registration
for a platform whose backend is not up yet is queued by jax, so this is safe on CPU-only jax).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir, xla

from . import _checks, _cpu

try:
    from . import _cuda
except ImportError:  # built without CUDA
    _cuda = None

PLATFORMS = ("cpu", "cuda")

# The version of every FFI target's operands, results and attributes, defined once in
# cc/ffi/handlers.h (JAXDNN_FFI_VERSION): each target is registered, and lowered, as
# "jaxdnn_<name>_v<FFI_VERSION>", so a program exported against another version fails to load
# instead of passing its handlers the wrong arguments.
FFI_VERSION = _cpu.ffi_version()
if _cuda is not None and _cuda.ffi_version() != FFI_VERSION:
    raise ImportError(
        f"jaxdnn: the CUDA module has FFI version {_cuda.ffi_version()} but the CPU module "
        f"{FFI_VERSION}; they come from different builds. Rebuild jaxdnn.")


def target_name(name: str) -> str:
    """The registered name of the FFI target `name` ("jaxdnn_<family>_<what>")."""
    return f"{name}_v{FFI_VERSION}"


def _register_all() -> tuple[str, ...]:
    """Registers every target of the built modules; returns their names."""
    names = set()
    for name, capsule in _cpu.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
        names.add(name)
    if _cuda is not None:
        for name, capsule in _cuda.registrations().items():
            jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
            names.add(name)
    return tuple(sorted(names))


# Every registered (versioned) target name, on any platform.
TARGETS = _register_all()


def module_for(platform: str):
    """The compiled module that serves `platform` ("cpu" or "cuda")."""
    if platform == "cpu":
        return _cpu
    if platform == "cuda":
        if _cuda is None:
            raise RuntimeError(
                "jaxdnn was built without CUDA support, so it cannot run on a GPU. Reinstall "
                "on a machine with nvcc (the build detects it) or with JAXDNN_CUDA=ON; see "
                "jaxdnn.build_info().")
        return _cuda
    raise NotImplementedError(f"jaxdnn has no kernels for platform {platform!r}")


def attr(value: Any):
    """Converts a Python attribute to the exact numpy type its handler decodes (XLA FFI
    attribute types are strict: a Python float would arrive as f64, an int as i64)."""
    if isinstance(value, (bool, np.bool_)):
        return np.bool_(value)
    if isinstance(value, (int, np.integer)):
        return np.int64(value)
    if isinstance(value, (float, np.floating)):
        return np.float32(value)
    if isinstance(value, (tuple, list)):
        return np.asarray(value, dtype=np.int64)
    return value


# An attrs_fn key (not an attribute): the custom call gets one more result, a uint8 buffer of
# this many bytes that XLA allocates and the handler uses as scratch; the rule drops it.
WORKSPACE = "__workspace_bytes__"


def lowering(target: str, attrs_fn):
    """Builds a per-platform lowering rule for `target` (its unversioned name: the rule calls
    ``target_name(target)``). ``attrs_fn(platform, ctx, **params)`` returns the handler
    attributes, plus optionally ``WORKSPACE`` (it may raise a Python error, which surfaces at
    trace time)."""
    registered = target_name(target)

    def make(platform: str):
        def rule(ctx, *args, **params):
            module_for(platform)
            attrs = dict(attrs_fn(platform, ctx, **params))
            workspace = attrs.pop(WORKSPACE, None)
            attrs = {k: attr(v) for k, v in attrs.items()}
            if workspace is None:
                return jax.ffi.ffi_lowering(registered)(ctx, *args, **attrs)
            scratch = jax.core.ShapedArray((int(workspace),), np.uint8)
            ctx = ctx.replace(avals_out=[*ctx.avals_out, scratch])
            return jax.ffi.ffi_lowering(registered)(ctx, *args, **attrs)[:-1]

        return rule

    return make


# prim -> its per-platform lowering maker (jaxdnn._partition lowers a partitioned primitive's
# per-shard call with it).
LOWERINGS: dict = {}


def register_lowerings(prim, make_rule) -> None:
    LOWERINGS[prim] = make_rule
    for platform in PLATFORMS:
        mlir.register_lowering(prim, make_rule(platform), platform=platform)


def _params_as_attrs(platform, ctx, **params):
    return params


def define_primitive(name: str, abstract_eval, *, attrs=_params_as_attrs,
                     multiple_results: bool = False) -> Primitive:
    """A primitive lowered to the FFI target of the same name on every platform.

    `abstract_eval(*avals, **params)` checks operands and returns the result aval(s);
    `attrs(platform, ctx, **params)` maps the primitive's params to handler attributes (by
    default they are passed through). Eager calls run through jit, like lax primitives.
    """
    prim = Primitive(name)
    prim.multiple_results = multiple_results
    prim.def_impl(partial(xla.apply_primitive, prim))
    prim.def_abstract_eval(sized_abstract_eval(name, abstract_eval))
    register_lowerings(prim, lowering(name, attrs))
    return prim


def sized_abstract_eval(name: str, abstract_eval):
    """`abstract_eval` that also rejects operands and results of more bytes than XLA can
    index (a ValueError at trace time; XLA would abort the process when compiling). The public
    functions check their arguments by name first; this catches results that only the
    arguments together make too large, e.g. a convolution's padding."""

    def rule(*avals, **params):
        for i, a in enumerate(avals):
            _checks.check_nbytes(a.shape, a.dtype, f"{name}: operand {i}")
        out = abstract_eval(*avals, **params)
        for a in out if isinstance(out, (tuple, list)) else (out,):
            _checks.check_nbytes(a.shape, a.dtype, f"{name}: the result")
        return out

    return rule
