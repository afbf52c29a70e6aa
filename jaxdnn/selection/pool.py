"""The pool family of selection: problems, the registry and find.

The primitives are ``jaxdnn.ops.pool``'s; their lowering rules choose through
``core.choose_for_call``, which reads a call's problem with ``PoolFamily.problem``.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _ffi
from ..ops.pool import (PoolSpec, pool_avg_bwd_p, pool_avg_fwd_p, pool_max_fwd_index_p,
                        pool_max_fwd_p, pool_max_gather_p, pool_max_scatter_p)
from . import core

_FWD_OPS = ("max_fwd", "max_fwd_index", "avg_fwd")


@dataclasses.dataclass(frozen=True)
class PoolProblem:
    """One pooling kernel call: `op` (max_fwd, max_fwd_index, avg_fwd: direction "fwd";
    max_gather, max_scatter, avg_bwd: "bwd") on `spec`, operands of `dtype`."""

    op: str
    spec: PoolSpec
    dtype: np.dtype
    count_include_pad: bool = True
    forced_algo: str | None = None
    policy: tuple[bool, bool, int] = (False, False, -1)

    @property
    def direction(self) -> str:
        return "fwd" if self.op in _FWD_OPS else "bwd"

    def encode(self) -> list[int]:
        """N, C, then in, out, window, stride, pad_lo, pad_hi (3 each; cc/pool/pool.h)."""
        n, *spatial, c = self.spec.in_shape
        k = 3 - len(spatial)
        a = self.spec.attrs()
        out = self.spec.out_shape[1:-1]
        return [n, c, *(1,) * k, *spatial, *(1,) * k, *out, *a["window"], *a["stride"],
                *a["pad_lo"], *a["pad_hi"]]

    def describe(self) -> str:
        return f"pool {self.op} {'x'.join(map(str, self.encode()))} {self.dtype.name}"

    def choose(self, platform: str) -> core.Choice:
        return core.choose(FAMILY, self, platform)


def pool_algorithms(problem: PoolProblem, platform: str | None = None):
    """"Get" for pooling: the registry of `platform` for the problem's direction, with
    applicability, in preference order."""
    platform = core.platform_name(platform)
    raw = _ffi.module_for(platform).pool_algorithms(problem.op, problem.encode(),
                                                     problem.dtype.name,
                                                     problem.count_include_pad)
    return core.registry_infos(raw, problem.direction, platform)


# Relative L2 error find allows against XLA's reduce_window, by dtype.
_FIND_TOL = {np.dtype(jnp.float64): 1e-9, np.dtype(jnp.float32): 1e-5,
             np.dtype(jnp.float16): 1e-2, np.dtype(jnp.bfloat16): 1e-2}


def _lax_pool(p: PoolProblem, x):
    """XLA's pooling of x (find's oracle for the forward ops), in float32 or wider."""
    x = x.astype(jnp.promote_types(p.dtype, jnp.float32))
    dims, strides = (1, *p.spec.window, 1), (1, *p.spec.stride, 1)
    pads = ((0, 0), *p.spec.padding, (0, 0))
    if p.op.startswith("max"):
        return lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, pads)
    total = lax.reduce_window(x, 0.0, lax.add, dims, strides, pads)
    if p.count_include_pad:
        return total / np.prod(p.spec.window)
    return total / lax.reduce_window(jnp.ones_like(x), 0.0, lax.add, dims, strides, pads)


def _find_case(p: PoolProblem, x, c):
    """(the problem's primitive on operands built from x and c, taking the algorithm name; the
    operands; XLA's result) for find. The backward ops' oracles are the derivatives of
    reduce_window (random data: no ties)."""
    params = dict(spec=p.spec, policy=(False, False, -1))
    if p.op == "avg_fwd":
        return (lambda n, a: pool_avg_fwd_p.bind(a, count_include_pad=p.count_include_pad,
                                                 algo=n, **params), (x,), _lax_pool(p, x))
    if p.op in ("max_fwd", "max_fwd_index"):
        prim = pool_max_fwd_p if p.op == "max_fwd" else pool_max_fwd_index_p
        first = (lambda out: out) if p.op == "max_fwd" else (lambda out: out[0])
        return (lambda n, a: first(prim.bind(a, algo=n, **params)), (x,), _lax_pool(p, x))
    fwd = dataclasses.replace(p, op="max_fwd" if p.op.startswith("max") else "avg_fwd")
    if p.op == "avg_bwd":
        dy = c[tuple(slice(0, d) for d in p.spec.out_shape)]
        ref = jax.linear_transpose(lambda a: _lax_pool(fwd, a), x.astype(
            jnp.promote_types(p.dtype, jnp.float32)))(dy.astype(jnp.promote_types(p.dtype,
                                                                                  jnp.float32)))
        return (lambda n, a: pool_avg_bwd_p.bind(a, count_include_pad=p.count_include_pad,
                                                 algo=n, **params), (dy,), ref[0])
    _, idx = pool_max_fwd_index_p.bind(x, algo=None, **params)
    if p.op == "max_gather":
        t = c[tuple(slice(0, d) for d in p.spec.in_shape)]
        ref = jax.jvp(lambda a: _lax_pool(fwd, a), (x,), (t,))[1]
        return (lambda n, t, i: pool_max_gather_p.bind(t, i, algo=n, **params), (t, idx), ref)
    dy = c[tuple(slice(0, d) for d in p.spec.out_shape)]
    _, vjp = jax.vjp(lambda a: _lax_pool(fwd, a), x)
    return (lambda n, d, i: pool_max_scatter_p.bind(d, i, algo=n, **params), (dy, idx),
            vjp(dy.astype(jnp.promote_types(p.dtype, jnp.float32)))[0])


def _find(p: PoolProblem, platform: str, repeats: int = 5) -> list[dict]:
    """Times every supported algorithm for `p` (wall clock over rotating inputs) after checking
    it against XLA; plain dicts as the tuning cache stores them."""
    dev = core.find_device(platform)
    rng = np.random.default_rng(0)
    big = tuple(max(a, b) for a, b in zip(p.spec.in_shape, p.spec.out_shape))
    cases = [_find_case(p, *(jax.device_put(rng.standard_normal(shape).astype(p.dtype), dev)
                             for shape in (p.spec.in_shape, big)))
             for _ in range(4)]
    run, _, ref = cases[0]
    return core.find_checked(pool_algorithms(p, platform), lambda name: partial(run, name),
                             [ops for _, ops, _ in cases], ref, _FIND_TOL[p.dtype], repeats)


# The op of each primitive.
_OPS = {pool_max_fwd_p: "max_fwd", pool_max_fwd_index_p: "max_fwd_index",
        pool_max_gather_p: "max_gather", pool_max_scatter_p: "max_scatter",
        pool_avg_fwd_p: "avg_fwd", pool_avg_bwd_p: "avg_bwd"}


class PoolFamily:
    """Pooling's side of selection (core.Family): one problem per kernel call, on the spec the
    call carries."""

    name = "pool"
    primitives = tuple(_OPS)

    def problem(self, primitive, avals, params) -> PoolProblem:
        return PoolProblem(_OPS[primitive], params["spec"], np.dtype(avals[0].dtype),
                           params.get("count_include_pad", True), params["algo"],
                           params["policy"])

    def algorithms(self, problem: PoolProblem, platform: str) -> list[core.AlgoInfo]:
        return pool_algorithms(problem, platform)

    def key(self, problem: PoolProblem) -> str:
        return (f"pool|{problem.op}|{','.join(map(str, problem.encode()))}|"
                f"{problem.dtype.name}|{int(problem.count_include_pad)}")

    def find(self, problem: PoolProblem, platform: str) -> list[dict]:
        return _find(problem, platform)


FAMILY = PoolFamily()
core.register_family(FAMILY)
