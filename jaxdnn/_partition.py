"""Partitioning rules: how XLA's SPMD partitioner may split jaxdnn's custom calls under `jit`.

A custom call is opaque to XLA: without a rule, a sharded operand is all-gathered and every
device computes the whole result. ``partitionable(prim, rule)`` gives a primitive a rule, as an
einsum-like Shardy ``sharding_rule`` (``jax.experimental.custom_partitioning``): each operand
and result dim is named by a factor; a factor shared by operands and results passes its
sharding through, a factor listed in ``need_replication`` is all-gathered first (a softmax
axis, a conv's spatial dims), a factor listed in ``reduction`` may stay sharded, and then each
shard computes a partial result that the per-shard function sums (``lax.psum`` over the mesh
axes that shard it: the data-parallel all-reduce of a filter gradient).

It applies at lowering: the primitive keeps its abstract eval, jvp, transpose and batching
rules (they run first, on global shapes), and only its lowering changes, to a
``custom_partitioning`` call of a per-shard copy of the primitive (same abstract eval, the
original FFI lowering). The partitioner calls ``partition`` with the operand shardings it
chose; each shard binds the copy with ``local_params`` (the params of the shard's shapes: a
conv's ``spec`` names its batch and channel counts). The original lowering is used as is (no
``custom_partitioning``) where there is nothing to partition: one device, inside a fully
manual ``shard_map`` (operands are already local), in ``jax.export`` (a custom partitioning
call holds a Python callback, which cannot be serialized) and without Shardy.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from functools import partial

import jax
from jax import lax
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec

from jax._src import dispatch, sharding_impls  # private: the axis contexts, devices at lowering

from . import _ffi


@dataclasses.dataclass(frozen=True)
class Rule:
    """A sharding rule: ``spec`` names every dim of every operand and result (``"n h c, k c ->
    n h k"``: operands, comma separated, then results; unnamed size-1 dims are not allowed);
    ``need_replication`` and ``reduction`` list factors (see the module docstring)."""

    spec: str
    need_replication: tuple[str, ...] = ()
    reduction: tuple[str, ...] = ()
    # Compound dims (``"(p k), k -> (p k)"``: a flat dim that is p major, k minor) take the
    # factor-assignment path of `partition`: a factor is sharded only where it leads every dim
    # that holds it (a shard of a flat dim is then a contiguous block), each result is summed
    # over the sharded `reduction` factors that it lacks. factor_sizes: (factor, size) of
    # every factor of a compound dim. scratch: indices of results that nothing reads (a
    # kernel's workspace): each shard returns zeros of the result's shard shape.
    factor_sizes: tuple[tuple[str, int], ...] = ()
    scratch: tuple[int, ...] = ()
    # For an op whose shards exchange partial results mid-computation (synchronised batch-norm
    # statistics): where a `reduction` factor is sharded, over mesh `axes` (`shards` devices
    # in all), shard_fn(axes, shards, **local_params) gives the per-shard function in place of
    # binding the primitive and summing (compound rules only; scratch results become zeros).
    shard_fn: Callable | None = None

    def operand_factors(self) -> list[list[str]]:
        return [part.split() for part in self.spec.split("->")[0].split(",")]

    def result_factors(self) -> list[list[str]]:
        return [part.split() for part in self.spec.split("->")[1].split(",")]

    @property
    def compound(self) -> bool:
        return "(" in self.spec

    def dims_of(self, side: int) -> list[list[list[str]]]:
        """Per operand (side 0) or result (side 1): its dims, each a list of factors."""
        return [[d.strip("()").split() for d in re.findall(r"\([^)]*\)|[^\s()]+", part)]
                for part in self.spec.split("->")[side].split(",")]


def _same_params(avals, **params):
    return params


def partitionable(prim: Primitive, rule: Callable, local_params: Callable = _same_params):
    """Gives `prim` (lowered by ``_ffi.register_lowerings``) a partitioning rule.

    rule(*avals_in, devices, **params): the primitive's Rule for those operands on `devices`
      devices (the mesh's size), or None to leave the call opaque (XLA gathers; correct, not
      partitioned).
    local_params(local_avals_in, **params): the params of one shard's call, from the shard's
      operand avals (default: the same params, for primitives whose params hold no shape).
    """
    make_rule = _ffi.LOWERINGS[prim]
    local = Primitive(prim.name + "_shard")
    local.multiple_results = prim.multiple_results
    local.def_effectful_abstract_eval(prim.abstract_eval)
    _ffi.register_lowerings(local, make_rule)

    def make(platform):
        direct = make_rule(platform)

        def lower(ctx, *args, **params):
            devices = _partitions(ctx)
            r = rule(*ctx.avals_in, devices=devices, **params) if devices else None
            if r is None:
                return direct(ctx, *args, **params)
            call = _custom_partitioned(local, r, local_params, params)
            return mlir.lower_fun(call, multiple_results=True)(ctx, *args)

        return lower

    for platform in _ffi.PLATFORMS:
        mlir.register_lowering(prim, make(platform), platform=platform)
    # The custom partitioning call needs the devices at lowering (as the jax primitives that
    # lower to one: custom_partitioning_p, pure_callback_p).
    dispatch.prim_requires_devices_during_lowering.add(prim)
    return prim


def _partitions(ctx) -> int:
    """The number of devices whose shards this lowering may partition (the mesh's size), or 0
    where its operands cannot be sharded."""

    module = ctx.module_context
    if getattr(module.lowering_parameters, "for_export", False):
        return 0
    if not getattr(jax.config, "jax_use_shardy_partitioner", True):
        return 0
    axis = module.axis_context
    if isinstance(axis, sharding_impls.SPMDAxisContext):
        return axis.mesh.size if set(axis.manual_axes) != set(axis.mesh.axis_names) else 0
    if isinstance(axis, sharding_impls.ShardingContext):
        devices = axis.device_assignment
        return len(devices) if devices is not None and len(devices) > 1 else 0
    return 0


def _custom_partitioned(local: Primitive, rule: Rule, local_params, params):
    from jax.experimental.custom_partitioning import custom_partitioning  # noqa: PLC0415

    def run(*args):
        out = local.bind(*args, **params)
        return tuple(out) if local.multiple_results else (out,)

    if rule.compound:
        return _custom_partitioned_compound(local, rule, local_params, params, run)
    operand_factors, result_factors = rule.operand_factors(), rule.result_factors()

    def partition(mesh, arg_shapes, result_shape):
        arg_shardings = [a.sharding for a in arg_shapes]
        result_shardings = [r.sharding for r in result_shape]
        named = all(isinstance(s, NamedSharding) for s in (*arg_shardings, *result_shardings))
        if not named:  # no mesh to name the psum's axes by: gather everything
            arg_shardings = [NamedSharding(mesh, PartitionSpec()) for _ in arg_shapes]
            result_shardings = [NamedSharding(mesh, PartitionSpec()) for _ in result_shape]
        else:  # the partitioner may hand over a need-replication dim sharded: gather it
            arg_shardings = [_replicated(s, f, rule.need_replication)
                             for s, f in zip(arg_shardings, operand_factors)]
            result_shardings = [_replicated(s, f, rule.need_replication)
                                for s, f in zip(result_shardings, result_factors)]
        axes = _reduction_axes(rule, operand_factors, arg_shardings) if named else ()
        local_avals = [ShapedArray(s.shard_shape(a.shape), a.dtype)
                       for a, s in zip(arg_shapes, arg_shardings)]
        shard_params = local_params(local_avals, **params)

        def per_shard(*args):
            out = local.bind(*args, **shard_params)
            out = tuple(out) if local.multiple_results else (out,)
            return tuple(lax.psum(o, axes) for o in out) if axes else out

        return mesh, per_shard, tuple(result_shardings), tuple(arg_shardings)

    # Shardy wants special factors in the order they first appear.
    order = list(dict.fromkeys(rule.spec.replace(",", " ").replace("->", " ").split()))
    special = lambda fs: tuple(sorted(set(fs) & set(order), key=order.index))  # noqa: E731
    cp = custom_partitioning(run)
    cp.def_partition(partition=partition, sharding_rule=rule.spec,
                     need_replication_factors=special(rule.need_replication),
                     reduction_factors=special(rule.reduction))
    return cp


def _custom_partitioned_compound(local: Primitive, rule: Rule, local_params, params, run):
    """`_custom_partitioned` for a rule with compound dims (see Rule)."""
    from jax.experimental.custom_partitioning import custom_partitioning  # noqa: PLC0415

    op_dims, res_dims = rule.dims_of(0), rule.dims_of(1)
    every = [d for dims_ in (*op_dims, *res_dims) for d in dims_]
    # a factor may be sharded only where it leads every dim that holds it
    leading = {f for d in every for f in d[:1]} - {f for d in every for f in d[1:]}
    sizes = dict(rule.factor_sizes)

    def partition(mesh, arg_shapes, result_shape):
        for dims_, a in zip(op_dims, arg_shapes):
            for d, n in zip(dims_, a.shape):
                if len(d) == 1:
                    sizes.setdefault(d[0], n)
        arg_shardings = [a.sharding for a in arg_shapes]
        named = all(isinstance(s, NamedSharding)
                    for s in (*arg_shardings, *(r.sharding for r in result_shape)))
        assign: dict[str, tuple[str, ...]] = {}
        used: set[str] = set()
        for dims_, s in zip(op_dims, arg_shardings if named else ()):
            spec = tuple(s.spec) + (None,) * len(dims_)
            for d, e in zip(dims_, spec):
                f = d[0]
                if e is None or f in assign or f in rule.need_replication or f not in leading:
                    continue
                axes = (e,) if isinstance(e, str) else tuple(e)
                n = math.prod(mesh.shape[a] for a in axes)
                if not axes or used & set(axes) or n <= 1 or sizes.get(f, 0) % n:
                    continue
                assign[f] = axes
                used.update(axes)

        def sharding(dims_):
            entries = [assign.get(d[0]) for d in dims_]
            entries = [None if e is None else e[0] if len(e) == 1 else e for e in entries]
            return NamedSharding(mesh, PartitionSpec(*entries))

        arg_shardings = [sharding(d) for d in op_dims]
        result_shardings = [sharding(d) for d in res_dims]
        sums = [tuple(a for f in rule.reduction if f in assign and not any(f in d for d in dims_)
                      for a in assign[f]) for dims_ in res_dims]
        scratch = {i: (s.shard_shape(r.shape), r.dtype) for i, (s, r)
                   in enumerate(zip(result_shardings, result_shape)) if i in rule.scratch}
        local_avals = [ShapedArray(s.shard_shape(a.shape), a.dtype)
                       for a, s in zip(arg_shapes, arg_shardings)]
        shard_params = local_params(local_avals, **params)
        reduced = tuple(a for f in rule.reduction for a in assign.get(f, ()))
        if rule.shard_fn is not None and reduced:
            shards = math.prod(mesh.shape[a] for a in reduced)
            compute = rule.shard_fn(reduced, shards, **shard_params)
            sums = [()] * len(res_dims)
        else:
            compute = partial(local.bind, **shard_params)

        def per_shard(*args):
            out = compute(*args)
            out = list(out) if local.multiple_results else [out]
            for i, (shp, dt) in scratch.items():
                out[i] = jax.numpy.zeros(shp, dt)
            return tuple(lax.psum(o, ax) if ax else o for o, ax in zip(out, sums))

        return mesh, per_shard, tuple(result_shardings), tuple(arg_shardings)

    order = [f for d in every for f in d]
    order = list(dict.fromkeys(order))
    in_results = {f for d in (x for ds in res_dims for x in ds) for f in d}
    special = lambda fs: tuple(sorted(set(fs) & set(order), key=order.index))  # noqa: E731
    only_compound = {f for d in every if len(d) > 1 for f in d} - {d[0] for d in every
                                                                     if len(d) == 1}
    cp = custom_partitioning(run)
    cp.def_partition(partition=partition, sharding_rule=rule.spec,
                     need_replication_factors=special(rule.need_replication),
                     reduction_factors=special(set(rule.reduction) - in_results),
                     **{f: n for f, n in rule.factor_sizes if f in only_compound})
    return cp


def _replicated(sharding: NamedSharding, factors, need) -> NamedSharding:
    """`sharding` with the dims of the factors in `need` replicated."""
    spec = tuple(sharding.spec) + (None,) * (len(factors) - len(sharding.spec))
    if not any(e is not None and f in need for e, f in zip(spec, factors)):
        return sharding
    spec = tuple(None if f in need else e for e, f in zip(spec, factors))
    return NamedSharding(sharding.mesh, PartitionSpec(*spec))


def _reduction_axes(rule: Rule, operand_factors, shardings) -> tuple[str, ...]:
    """The mesh axes that shard a reduction factor (in the first operand that has it)."""
    axes: list[str] = []
    for factor in rule.reduction:
        for names, sharding in zip(operand_factors, shardings):
            if factor in names:
                spec = tuple(sharding.spec) + (None,) * len(names)
                entry = spec[names.index(factor)]
                entry = () if entry is None else (entry,) if isinstance(entry, str) else entry
                axes.extend(a for a in entry if a not in axes)
                break
    return tuple(axes)


def dims(prefix: str, n: int) -> list[str]:
    """n factor names: prefix0, prefix1, ..."""
    return [f"{prefix}{i}" for i in range(n)]


def einsum(operands: Sequence[Sequence[str]], results: Sequence[Sequence[str]]) -> str:
    """The spec string of factor name lists."""
    return (", ".join(" ".join(o) for o in operands) + " -> " +
            ", ".join(" ".join(r) for r in results))


def elementwise(*avals, **params) -> Rule | None:
    """The rule of an op whose operands and result have one shape and whose every output
    element depends on the same element of each operand: every dim passes through."""
    ndim = avals[0].ndim
    if ndim == 0:
        return None
    d = dims("d", ndim)
    return Rule(einsum([d] * len(avals), [d]))

