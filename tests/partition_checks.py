"""Checks of jaxdnn's partitioning rules, run by tests/test_partition.py in a subprocess with 8
forced CPU devices: ``python partition_checks.py FAMILY`` runs one family's checks (each
compares plain-jit results on sharded operands with the single-device results, and asserts
the collectives of the compiled HLO) and prints "FAMILY ok"."""

from __future__ import annotations

import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxdnn
from util import assert_close

try:
    from jax import shard_map
except ImportError:  # jax < 0.7
    from jax.experimental.shard_map import shard_map

assert len(jax.devices()) == 8, jax.devices()
DEV = np.array(jax.devices())
MESH1 = Mesh(DEV, ("data",))
MESH2 = Mesh(DEV.reshape(4, 2), ("data", "model"))
RNG = np.random.default_rng(0)
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def rand(*shape):
    return jnp.asarray(RNG.standard_normal(shape), jnp.float32)


def collectives(compiled_text: str) -> dict:
    """How many of each collective the compiled HLO runs (the -start of async pairs)."""
    out = {}
    for c in COLLECTIVES:
        n = len(re.findall(rf"= [^=]*? {c}(-start)?\(", compiled_text))
        if n:
            out[c] = n
    return out


def put(mesh, spec, x):
    return jax.device_put(x, NamedSharding(mesh, spec))


def check(f, args, mesh, specs, *, k=1, tol=None, gathers=None, what=""):
    """f(*args) under jit with args sharded by `specs` on `mesh` matches the single-device
    result (itself float32, hence growth=2); with `gathers` given, the compiled HLO has
    exactly that many all-gathers."""
    ref = jax.jit(f)(*args)
    sharded = [put(mesh, s, a) for s, a in zip(specs, args)]
    jf = jax.jit(f)
    out = jf(*sharded)
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        assert_close(o, np.asarray(r, np.float64), jnp.float32, k=k, tol=tol, growth=2,
                     what=f"{what} {specs}")
    counts = collectives(jf.lower(*sharded).compile().as_text())
    if gathers is not None:
        assert counts.get("all-gather", 0) == gathers, (what, specs, counts)
    return counts


def grad_of(f, argnums):
    return jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums=argnums)


def check_activation():
    x = rand(8, 6, 4)
    for name, fn in [("relu", jaxdnn.relu), ("gelu", jaxdnn.gelu), ("elu", jaxdnn.elu)]:
        for mesh, spec in [(MESH1, P("data")), (MESH2, P("data", None, "model")),
                           (MESH1, P(None, None, "data") if x.shape[2] % 8 == 0 else P()),
                           (MESH1, P())]:
            check(fn, [x], mesh, [spec], gathers=0, what=name)
            check(grad_of(fn, 0), [x], mesh, [spec], gathers=0, what=f"grad {name}")
        # vmap (its batching rule runs before partitioning) of a sharded stack
        check(jax.vmap(fn, in_axes=1, out_axes=1), [x], MESH2, [P("data", "model")],
              gathers=0, what=f"vmap {name}")


def check_softmax():
    x = rand(8, 4, 16)
    for fn in (jaxdnn.softmax, jaxdnn.log_softmax):
        for mesh, spec in [(MESH1, P("data")), (MESH2, P("data", "model")), (MESH1, P())]:
            check(fn, [x], mesh, [spec], gathers=0, what=fn.__name__)
            check(grad_of(fn, 0), [x], mesh, [spec], gathers=0, what=f"grad {fn.__name__}")
        # the softmax axis sharded: the rule replicates it, the result is right
        for mesh, spec in [(MESH1, P(None, None, "data")), (MESH2, P("data", None, "model"))]:
            check(fn, [x], mesh, [spec], what=fn.__name__)
            check(grad_of(fn, 0), [x], mesh, [spec], what=f"grad {fn.__name__}")


def check_pool():
    x = rand(8, 8, 8, 16)
    pools = [("max", lambda x: jaxdnn.max_pool(x, (2, 2), strides=(2, 2))),
             ("max3", lambda x: jaxdnn.max_pool(x, (3, 3), strides=(1, 1), padding="SAME")),
             ("avg", lambda x: jaxdnn.avg_pool(x, (3, 3), strides=(2, 2), padding="SAME"))]
    for name, fn in pools:
        for mesh, spec in [(MESH1, P("data")), (MESH1, P(None, None, None, "data")),
                           (MESH2, P("data", None, None, "model")), (MESH1, P())]:
            check(fn, [x], mesh, [spec], gathers=0, what=name)
            check(grad_of(fn, 0), [x], mesh, [spec], gathers=0, what=f"grad {name}")
        # spatial dims sharded: replicated by the rule, still right
        check(fn, [x], MESH1, [P(None, "data")], what=name)
        check(grad_of(fn, 0), [x], MESH2, [P(None, "data", "model")], what=f"grad {name}")


def check_conv():
    x, w = rand(8, 8, 8, 16), rand(3, 3, 16, 16)
    conv = lambda x, w: jaxdnn.conv(x, w, padding="SAME")  # noqa: E731
    k = 3 * 3 * 16
    cases = [  # (mesh, x spec, w spec, all-gathers of the forward)
        (MESH1, P("data"), P(), 0),                                # data parallel
        (MESH2, P("data"), P(None, None, None, "model"), 0),       # + output channels
        (MESH1, P(None, None, None, "data"), P(None, None, "data"), 0),  # input channels
        (MESH1, P(), P(), 0),
    ]
    for mesh, xs, ws, gathers in cases:
        check(conv, [x, w], mesh, [xs, ws], k=k, gathers=gathers, what="conv")
        for argnums in (0, 1):
            check(grad_of(conv, argnums), [x, w], mesh, [xs, ws], k=k, tol=1e-5,
                  what=f"conv grad {argnums}")
    # spatial dims sharded: replicated, still right
    check(conv, [x, w], MESH1, [P(None, "data"), P()], k=k, what="conv spatial")
    # grouped convolution (channels replicated by the rule), batch sharded
    wg = rand(3, 3, 8, 16)
    grouped = lambda x, w: jaxdnn.conv(x, w, padding="SAME", groups=2)  # noqa: E731
    for mesh, xs, ws in [(MESH1, P("data"), P()), (MESH2, P("data"), P(None, None, None, "model"))]:
        check(grouped, [x, wg], mesh, [xs, ws], k=72, what="grouped conv")
        check(grad_of(grouped, (0, 1)), [x, wg], mesh, [xs, ws], k=72, tol=1e-5,
              what="grouped conv grad")


def check_norm():
    """layer/RMS/group norm pass rows (samples) through and batch_norm_inference every dim:
    batch sharded, nothing is gathered; a normalised axis sharded is gathered, still right.
    batch_norm's training statistics are global over the batch: no rule, gathered, right."""
    x, s, b = rand(8, 4, 16), rand(16), rand(16)
    m, v = rand(16), jnp.abs(rand(16)) + 0.5
    fns = [("layer_norm", lambda x, s, b: jaxdnn.layer_norm(x, s, b), 0),
           ("layer_norm2", lambda x, s, b: jaxdnn.layer_norm(x, s[:4, None] * s, b[:4, None] * b,
                                                           axis=(1, 2)), 0),
           ("rms_norm", lambda x, s, b: jaxdnn.rms_norm(x, s), 0),
           ("group_norm", lambda x, s, b: jaxdnn.group_norm(x, s, b, groups=4), 0),
           ("group_norm NCW", lambda x, s, b: jaxdnn.group_norm(x, s[:4], b[:4], groups=2,
                                                                layout="NCW"), 0),
           ("batch_norm", lambda x, s, b: jaxdnn.batch_norm(x, s, b)[0], None),
           ("batch_norm_inference",
            lambda x, s, b: jaxdnn.batch_norm_inference(x, s, b, m, v), 0)]
    for name, fn, gathers in fns:
        for mesh, spec, g in [(MESH1, P("data"), gathers), (MESH2, P("data"), gathers),
                              (MESH2, P("data", None, "model"), None),
                              (MESH1, P(None, None, "data"), None)]:
            specs = [spec, P(), P()]
            check(fn, [x, s, b], mesh, specs, k=64, gathers=g, what=name)
            check(grad_of(fn, (0, 1, 2)), [x, s, b], mesh, specs, k=64, tol=1e-5, gathers=g,
                  what=f"grad {name}")


def net(x, w):
    y = jaxdnn.relu(jaxdnn.conv(x, w, padding="SAME"))
    y = jaxdnn.max_pool(y, (2, 2), strides=(2, 2))
    return jaxdnn.log_softmax(y.reshape(y.shape[0], -1))


def loss(w, x):
    return jnp.sum(net(x, w) * jnp.arange(net(x, w).shape[-1], dtype=x.dtype))


def network_counts():
    """The collectives of the test network's forward and weight gradient, batch sharded."""
    x, w = rand(16, 8, 8, 4), rand(3, 3, 4, 8)
    xs = put(MESH1, P("data"), x)
    fwd = collectives(jax.jit(net).lower(xs, w).compile().as_text())
    grad = collectives(jax.jit(jax.grad(loss)).lower(w, xs).compile().as_text())
    return fwd, grad


def check_network():
    x, w = rand(16, 8, 8, 4), rand(3, 3, 4, 8)
    check(net, [x, w], MESH1, [P("data"), P()], k=36, gathers=0, what="net")
    check(jax.grad(loss), [w, x], MESH1, [P(), P("data")], k=36 * 16, tol=1e-5, what="grad")
    fwd, grad = network_counts()
    print("network collectives", fwd, grad)
    assert fwd == {}, fwd
    assert grad == {"all-reduce": 1}, grad  # the filter gradient's, nothing gathered

    # remat and lax.scan over layers, batch sharded
    ws = 0.3 * rand(3, 3, 3, 4, 4)

    def scanned(x, ws):
        def layer(h, w):
            return jaxdnn.relu(jaxdnn.conv(h, w, padding="SAME")), None
        return jnp.sum(jax.lax.scan(jax.checkpoint(layer), x, ws)[0] * jnp.arange(4.0))

    check(jax.grad(scanned, argnums=(0, 1)), [x, ws], MESH1, [P("data"), P()], k=36 * 16,
          tol=1e-5, gathers=0, what="scan remat")

    # inside shard_map each op runs on its shard: no custom partitioning call is emitted
    def local(x, w):
        return jax.lax.psum(jax.grad(loss)(w, x), "data")

    smap = jax.jit(shard_map(local, mesh=MESH1, in_specs=(P("data"), P()), out_specs=P()))
    xs = put(MESH1, P("data"), x)
    assert "CustomSPMDPartitioning" not in smap.lower(xs, w).as_text()
    assert_close(smap(xs, w), np.asarray(jax.grad(loss)(w, x), np.float64), jnp.float32,
                 k=36 * 16, tol=1e-5, what="shard_map")
    # partially manual shard_map (auto "model"): ops partition over the auto axis only
    try:
        smap2 = jax.jit(shard_map(lambda x, w: net(x, w), mesh=MESH2, in_specs=(P("data"), P()),
                                  out_specs=P("data"), axis_names={"data"}))
    except TypeError:  # older shard_map spells it auto=
        smap2 = None
    if smap2 is not None:
        assert_close(smap2(put(MESH2, P("data"), x), w), np.asarray(net(x, w), np.float64),
                     jnp.float32, k=36, what="partial shard_map")


if __name__ == "__main__":
    for family in sys.argv[1:]:
        if family == "counts":
            print("network collectives", *network_counts())
            continue
        globals()[f"check_{family}"]()
        print(f"{family} ok")
