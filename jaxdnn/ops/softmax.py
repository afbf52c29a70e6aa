"""softmax and log_softmax over any axis (or axes).

Two primitives, both over the last axis of operands of any rank >= 1 (the other dimensions are
rows), lowered to the kernels of ``cc/softmax``::

    softmax_fwd_p(x; log)      -> y = softmax(x), or log_softmax(x) with log=True
    softmax_bwd_p(y, c; kind)  -> kind "softmax":          y * (c - sum(y c))
                                  kind "log_softmax_vjp":  c - exp(y) sum(c)
                                  kind "log_softmax_jvp":  c - sum(exp(y) c)

The backward primitive is linear in c. softmax's Jacobian is symmetric, so its jvp and vjp are
the same "softmax" map (self-transpose); log_softmax's jvp map ("log_softmax_jvp") and vjp map
("log_softmax_vjp") are each other's transpose. So ``jvp`` and ``grad`` both run our kernels.
The backward primitive's derivative in y (second order on) is written in jnp. Other axes are
moved last (and several axes merged into one) with a transpose and a reshape around the call.

Both primitives carry ``algo`` (an algorithm forced by the caller, or None) and ``policy`` (the
jaxdnn.config policy at trace time); the algorithm is chosen from the platform's registry at
lowering time (jaxdnn/algo.py: heuristic, forced or benchmark) and named in the custom call,
as for convolutions. The GPU registers "rows" (the row in registers, one HBM read) and
"online" (any row length); the CPU has one kernel.
"""

from __future__ import annotations

import dataclasses
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching

from .. import _checks, _ffi
from .. import _config as config_lib
from .. import algo as algo_lib

__all__ = ["log_softmax", "softmax", "softmax_algorithms"]

# Codes of the backward kernel (cc/softmax/softmax.h: Linear), and each map's transpose.
_KINDS = ("softmax", "log_softmax_vjp", "log_softmax_jvp")
_TRANSPOSE = {"softmax": "softmax", "log_softmax_vjp": "log_softmax_jvp",
              "log_softmax_jvp": "log_softmax_vjp"}


# ----------------------------------------------------------------------------------------------
# Primitives
# ----------------------------------------------------------------------------------------------

def _fwd_abstract_eval(x, *, log, algo, policy):
    if x.ndim == 0:
        raise TypeError("jaxdnn softmax fwd: the operand must have rank >= 1")
    return ShapedArray(x.shape, x.dtype)


def _bwd_abstract_eval(y, c, *, kind, algo, policy):
    if y.ndim == 0 or y.shape != c.shape or y.dtype != c.dtype:
        raise TypeError(f"jaxdnn softmax bwd: operands {y.str_short()} and {c.str_short()} must "
                        "have one shape (rank >= 1) and dtype")
    return ShapedArray(y.shape, y.dtype)


@dataclasses.dataclass(frozen=True)
class SoftmaxProblem:
    """One softmax kernel call: `direction` "fwd" (op "softmax" / "log_softmax") or "bwd" (op
    = the backward map), over `rows` rows of `cols` elements."""

    direction: str
    op: str
    rows: int
    cols: int
    dtype: np.dtype
    forced_algo: str | None = None
    policy: tuple[bool, bool, int] = (False, False, -1)

    def describe(self) -> str:
        return f"softmax {self.direction:4s} {self.op} {self.rows}x{self.cols} {self.dtype.name}"

    def key(self) -> str:
        return f"softmax|{self.direction}|{self.op}|{self.rows}x{self.cols}|{self.dtype.name}"

    def choose(self, platform: str) -> algo_lib.Choice:
        return algo_lib.select_algorithm(
            "softmax", self.direction, softmax_algorithms(self, platform), platform,
            self.forced_algo, self.policy, self.key(), lambda: _find(self, platform))


def softmax_algorithms(problem: SoftmaxProblem, platform: str | None = None):
    """"Get" for softmax: the registry of `platform` with applicability, in preference order."""
    platform = algo_lib.platform_name(platform)
    raw = _ffi.module_for(platform).softmax_algorithms(problem.rows, problem.cols,
                                                        str(problem.dtype))
    return algo_lib.registry_infos(raw, problem.direction, platform)


def _problem(direction, aval, op, algo, policy) -> SoftmaxProblem:
    cols = aval.shape[-1]
    rows = int(np.prod(aval.shape[:-1]))
    return SoftmaxProblem(direction, op, rows, cols, np.dtype(aval.dtype), algo, policy)


# The choice is made (and a forced algorithm checked) on every platform; the CPU handler has
# one kernel, so only the GPU's custom call names it.
def _fwd_attrs(platform, ctx, *, log, algo, policy):
    p = _problem("fwd", ctx.avals_in[0], "log_softmax" if log else "softmax", algo, policy)
    name = p.choose(platform).name
    return dict(log=log) if platform == "cpu" else dict(log=log, algo=name)


def _bwd_attrs(platform, ctx, *, kind, algo, policy):
    p = _problem("bwd", ctx.avals_in[0], kind, algo, policy)
    name = p.choose(platform).name
    return dict(kind=_KINDS.index(kind)) if platform == "cpu" else dict(kind=_KINDS.index(kind),
                                                                          algo=name)


softmax_fwd_p = _ffi.define_primitive("jaxdnn_softmax_fwd", _fwd_abstract_eval,
                                      attrs=_fwd_attrs)
softmax_bwd_p = _ffi.define_primitive("jaxdnn_softmax_bwd", _bwd_abstract_eval,
                                      attrs=_bwd_attrs)

# Relative L2 error find allows against XLA's formula, by dtype.
_FIND_TOL = {np.dtype(jnp.float64): 1e-9, np.dtype(jnp.float32): 1e-5,
             np.dtype(jnp.float16): 1e-2, np.dtype(jnp.bfloat16): 1e-2}


def _reference(p: SoftmaxProblem, a, b):
    """XLA's computation of what the kernel computes (find's oracle), in float32 or wider."""
    wide = jnp.promote_types(p.dtype, jnp.float32)
    a32, b32 = a.astype(wide), b.astype(wide)
    if p.op == "softmax" and p.direction == "fwd":
        return jax.nn.softmax(a32, axis=-1)
    if p.op == "log_softmax":
        return jax.nn.log_softmax(a32, axis=-1)
    if p.op == "softmax":
        return a32 * (b32 - _row_sum(a32 * b32))
    if p.op == "log_softmax_vjp":
        return b32 - jnp.exp(a32) * _row_sum(b32)
    return b32 - _row_sum(jnp.exp(a32) * b32)


def _find(p: SoftmaxProblem, platform: str, repeats: int = 5) -> list[dict]:
    """Times every supported algorithm for `p` (wall clock over rotating inputs) after checking
    it against XLA; plain dicts as the tuning cache stores them."""
    dev = jax.devices("gpu" if platform == "cuda" else "cpu")[0]
    rng = np.random.default_rng(0)
    shape = (p.rows, p.cols)
    rotate = 4
    inputs = [tuple(jax.device_put(rng.standard_normal(shape).astype(p.dtype), dev)
                    for _ in range(2)) for _ in range(rotate)]
    if p.direction == "bwd" and p.op.startswith("log"):  # y is a log-probability there
        inputs = [(jax.nn.log_softmax(a.astype(jnp.promote_types(p.dtype, jnp.float32)))
                   .astype(p.dtype), b) for a, b in inputs]
    ref = np.asarray(_reference(p, *inputs[0]), np.float64)
    results = []
    for info in softmax_algorithms(p, platform):
        base = dict(name=info.name, workspace_bytes=0, deterministic=info.deterministic)
        if not info.supported:
            results.append(dict(base, ok=False, time_s=float("inf"), error=float("nan"),
                                reason=info.reason))
            continue
        if p.direction == "fwd":
            fn = lambda a, b, n=info.name: softmax_fwd_p.bind(  # noqa: E731
                a, log=p.op == "log_softmax", algo=n, policy=(False, False, -1))
        else:
            fn = lambda a, b, n=info.name: softmax_bwd_p.bind(  # noqa: E731
                a, b, kind=p.op, algo=n, policy=(False, False, -1))
        out = np.asarray(jax.jit(fn)(*inputs[0]), np.float64)
        err = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))
        if not err <= _FIND_TOL[p.dtype]:
            results.append(dict(base, ok=False, time_s=float("inf"), error=err,
                                reason=f"wrong result: relative error {err:.2e}"))
            continue
        results.append(dict(base, ok=True, time_s=algo_lib.time_jitted(fn, inputs, repeats),
                            error=err, reason=""))
    return sorted(results, key=lambda r: (not r["ok"], r["time_s"], r["name"]))


def _row_sum(a):
    return jnp.sum(a, axis=-1, keepdims=True)


def _fwd_jvp(t, y, x, *, log, algo, policy):
    return softmax_bwd_p.bind(y, t, kind="log_softmax_jvp" if log else "softmax", algo=algo,
                              policy=policy)


def _bwd_jvp_y(t, y, c, *, kind, algo, policy):
    if kind == "softmax":  # d/dy [y (c - sum(y c))]
        return t * (c - _row_sum(y * c)) - y * _row_sum(t * c)
    if kind == "log_softmax_vjp":  # d/dy [c - exp(y) sum(c)]
        return -jnp.exp(y) * t * _row_sum(c)
    return jnp.broadcast_to(-_row_sum(jnp.exp(y) * t * c), y.shape)  # d/dy [c - sum(exp(y) c)]


def _bwd_jvp_c(t, y, c, *, kind, algo, policy):
    return softmax_bwd_p.bind(y, t, kind=kind, algo=algo, policy=policy)


def _bwd_transpose(ct, y, c, *, kind, algo, policy):
    # Linear in c only; y is always a known value when this is transposed.
    if type(ct) is ad.Zero:
        return None, ad.Zero(c.aval)
    return None, softmax_bwd_p.bind(y, ct, kind=_TRANSPOSE[kind], algo=algo, policy=policy)


ad.defjvp2(softmax_fwd_p, _fwd_jvp)
ad.defjvp(softmax_bwd_p, _bwd_jvp_y, _bwd_jvp_c)
ad.primitive_transposes[softmax_bwd_p] = _bwd_transpose


# Batching: the mapped axis joins the rows. It can stay where it is unless it is the last
# axis (the reduced one); then, or when the two backward operands are mapped differently, the
# mapped axis moves to the front (an unmapped operand is broadcast).

def _fwd_batch(args, dims, **params):
    x, d = args[0], dims[0]
    if d == x.ndim - 1:
        x, d = jnp.moveaxis(x, d, 0), 0
    return softmax_fwd_p.bind(x, **params), d


def _bwd_batch(args, dims, **params):
    y, c = args
    if dims[0] == dims[1] and dims[0] != y.ndim - 1:
        return softmax_bwd_p.bind(y, c, **params), dims[0]
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    y, c = (jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
            for a, d in zip(args, dims))
    return softmax_bwd_p.bind(y, c, **params), 0


batching.primitive_batchers[softmax_fwd_p] = _fwd_batch
batching.primitive_batchers[softmax_bwd_p] = _bwd_batch


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def _axes(axis, ndim, api):
    """`axis` (an int, a sequence of ints or None for all) as a sorted tuple of non-negative
    axes."""
    if axis is None:
        return tuple(range(ndim))
    seq = axis if isinstance(axis, (tuple, list)) else (axis,)
    try:
        seq = [operator.index(a) for a in seq]
    except TypeError as e:
        raise TypeError(f"jaxdnn.{api}: `axis` must be an int, a sequence of ints or None, got "
                        f"{axis!r}") from e
    out = []
    for a in seq:
        if not -ndim <= a < ndim:
            raise ValueError(f"jaxdnn.{api}: `axis` {a} is out of range for `x` of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"jaxdnn.{api}: `axis` has repeated axes: {axis!r}")
    return tuple(sorted(out))


def _apply(x, axis, log, api, algo):
    x = _checks.operand(x, "x", f"jaxdnn.{api}")
    axes = _axes(axis, x.ndim, api)
    if algo is not None and not isinstance(algo, str):
        raise TypeError(f"jaxdnn.{api}: `algo` must be None or an algorithm name, got {algo!r}")
    params = dict(log=log, algo=algo, policy=config_lib.settings().policy())
    if axes == (x.ndim - 1,):
        return softmax_fwd_p.bind(x, **params)
    # Reduced axes last, merged into one (a reshape of the moved array).
    last = tuple(range(x.ndim - len(axes), x.ndim))
    moved = jnp.moveaxis(x, axes, last)
    rows_shape = moved.shape[:x.ndim - len(axes)]
    y = softmax_fwd_p.bind(moved.reshape(*rows_shape, int(np.prod(moved.shape[len(rows_shape):]))),
                           **params)
    return jnp.moveaxis(y.reshape(moved.shape), last, axes)


def softmax(x, axis=-1, *, algo=None):
    """exp(x) / sum(exp(x)) along `axis` (an int, a sequence of ints, or None for all axes),
    computed stably; a row holding +inf or NaN, or only -inf, gives NaN (as ``jax.nn``).
    `algo` forces a kernel of the platform's registry (see :func:`softmax_algorithms`)."""
    return _apply(x, axis, False, "softmax", algo)


def log_softmax(x, axis=-1, *, algo=None):
    """x - log(sum(exp(x))) along `axis`, computed stably (``x - max - log(sum(exp(x - max)))``).
    """
    return _apply(x, axis, True, "log_softmax", algo)
