"""The flax (linen, nnx) and equinox adapters against the stock modules, and
jaxdnn.use_jaxdnn: same variables both ways, same outputs, gradients and optimizer steps within
the dtype's tolerance, in float32 and bfloat16."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdnn
from util import subprocess_env

optax = pytest.importorskip("optax")

DTYPES = [jnp.float32, jnp.bfloat16]


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == jnp.float32 else dict(rtol=5e-2, atol=5e-2)


def _close(a, b, dtype):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                   **_tol(dtype))


def _uses_jaxdnn(fn, *args):
    """Whether `fn` convolves with jaxdnn's primitives only (the jaxpr's text shows nested
    jaxprs too)."""
    text = str(jax.make_jaxpr(fn)(*args))
    return "jaxdnn_conv" in text and "conv_general_dilated[" not in text


def test_import_jaxdnn_does_not_import_frameworks(tmp_path):
    code = "import sys, jaxdnn; print(sorted({'flax', 'equinox', 'optax'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=subprocess_env(), cwd=tmp_path)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module,package", [("jaxdnn.flax", "flax"),
                                            ("jaxdnn.flax.nnx", "flax"),
                                            ("jaxdnn.equinox", "equinox")])
def test_missing_framework_is_named(module, package, tmp_path):
    code = (f"import sys; sys.modules['{package}'] = None\n"
            f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=subprocess_env(), cwd=tmp_path)
    assert f"needs the `{package}` package" in out.stdout


# ----------------------------------------------------------------------------------------------
# flax linen
# ----------------------------------------------------------------------------------------------

def _linen_model(nn, mods, dtype):
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = mods.Conv(8, (3, 3), dtype=dtype)(x)
            x = mods.BatchNorm(use_running_average=not train, momentum=0.9, dtype=dtype)(x)
            x = nn.relu(x)
            x = mods.Conv(8, (3, 3), strides=2, feature_group_count=2, use_bias=False,
                          dtype=dtype)(x)
            x = mods.GroupNorm(num_groups=4, dtype=dtype)(x)
            x = mods.ConvTranspose(4, (3, 3), strides=(2, 2), dtype=dtype)(x)
            x = mods.LayerNorm(dtype=dtype)(x)
            x = mods.RMSNorm(reduction_axes=(1, 2, 3), feature_axes=-1, dtype=dtype)(x)
            return nn.Dense(3, dtype=dtype)(x.mean((1, 2)))
    return Block()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_linen_model_matches_stock(dtype):
    nn = pytest.importorskip("flax.linen")
    import jaxdnn.flax as jf

    stock, ours = _linen_model(nn, nn, dtype), _linen_model(nn, jf, dtype)
    x = jax.random.normal(jax.random.key(0), (4, 8, 8, 3), dtype)
    labels = jnp.arange(4) % 3
    v_stock = stock.init(jax.random.key(1), x, train=False)
    v_ours = ours.init(jax.random.key(1), x, train=False)
    _close(v_stock, v_ours, jnp.float32)  # same names, shapes, dtypes and initial values
    assert jax.tree.structure(v_stock) == jax.tree.structure(v_ours)

    def loss(model, params, stats):
        logits, upd = model.apply({"params": params, "batch_stats": stats}, x, train=True,
                                  mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), labels).mean(), upd["batch_stats"]

    assert _uses_jaxdnn(lambda p: loss(ours, p, v_stock["batch_stats"]), v_stock["params"])
    tx = optax.sgd(0.05, momentum=0.9)
    results = []
    for model in (stock, ours):
        params, stats = v_stock["params"], v_stock["batch_stats"]  # the stock checkpoint
        opt = tx.init(params)
        step = jax.jit(lambda p, s, o, model=model: (
            jax.value_and_grad(lambda p: loss(model, p, s), has_aux=True)(p), o))
        for _ in range(3):
            ((value, stats), grads), _ = step(params, stats, opt)
            updates, opt = tx.update(grads, opt, params)
            params = optax.apply_updates(params, updates)
        evaluated = model.apply({"params": params, "batch_stats": stats}, x, train=False)
        results.append((value, grads, params, stats, evaluated))
    _close(results[0], results[1], dtype)


def test_linen_batch_norm_axis_name_and_checkpoint_round_trip():
    nn = pytest.importorskip("flax.linen")
    import jaxdnn.flax as jf

    x = jax.random.normal(jax.random.key(0), (2, 6, 5, 4)) * 2 + 1  # 2 devices' shards
    outs = []
    for mod in (nn, jf):
        bn = mod.BatchNorm(use_running_average=False, axis_name="d", momentum=0.8)
        v = bn.init(jax.random.key(0), x[0])

        def f(v, x, bn=bn):
            y, upd = bn.apply(v, x, mutable=["batch_stats"])
            return y, upd

        y, upd = jax.vmap(f, in_axes=(None, 0), axis_name="d")(v, x)
        g = jax.grad(lambda x: jax.vmap(f, in_axes=(None, 0), axis_name="d")(v, x)[0][
            ..., 0].sum())(x)
        outs.append((y, upd, g, v))
    _close(outs[0], outs[1], jnp.float32)
    full = nn.BatchNorm(use_running_average=False).apply(outs[0][3], x.reshape(-1, 5, 4),
                                                       mutable=["batch_stats"])[0]
    _close(outs[1][0].reshape(-1, 5, 4), full, jnp.float32)  # the stats are the global ones


@pytest.mark.parametrize("module", ["BatchNorm", "LayerNorm", "GroupNorm", "RMSNorm"])
def test_linen_norm_promotes_like_flax(module):
    nn = pytest.importorskip("flax.linen")
    import jaxdnn.flax as jf

    kw = {"BatchNorm": dict(use_running_average=False), "GroupNorm": dict(num_groups=2)}
    x = jax.random.normal(jax.random.key(0), (3, 5, 4), jnp.bfloat16)
    for dtype, param_dtype in [(None, jnp.float32), (jnp.bfloat16, jnp.float32),
                               (None, jnp.bfloat16)]:
        mods = [getattr(m, module)(dtype=dtype, param_dtype=param_dtype, **kw.get(module, {}))
                for m in (nn, jf)]
        v = mods[0].init(jax.random.key(1), x)
        ys = [m.apply(v, x, mutable=True)[0] for m in mods]
        assert ys[0].dtype == ys[1].dtype
        _close(ys[0], ys[1], jnp.bfloat16)


# ----------------------------------------------------------------------------------------------
# flax nnx
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_nnx_model_matches_stock(dtype):
    nnx = pytest.importorskip("flax.nnx")
    import jaxdnn.flax.nnx as jnnx

    class Net(nnx.Module):
        def __init__(self, mods, rngs):
            self.conv = mods.Conv(3, 8, (3, 3), strides=2, dtype=dtype, rngs=rngs)
            self.bn = mods.BatchNorm(8, momentum=0.9, dtype=dtype, rngs=rngs)
            self.out = nnx.Linear(8, 3, dtype=dtype, rngs=rngs)

        def __call__(self, x):
            return self.out(nnx.relu(self.bn(self.conv(x))).mean((1, 2)))

    x = jax.random.normal(jax.random.key(0), (4, 8, 8, 3), dtype)
    labels = jnp.arange(4) % 3
    stock, ours = Net(nnx, nnx.Rngs(0)), Net(jnnx, nnx.Rngs(0))
    nnx.update(ours, nnx.state(stock))  # the stock checkpoint loads into the adapter
    assert jax.tree.structure(nnx.state(stock)) == jax.tree.structure(nnx.state(ours))

    def loss(model):
        return optax.softmax_cross_entropy_with_integer_labels(
            model(x).astype(jnp.float32), labels).mean()

    graphdef, state = nnx.split(ours)
    assert _uses_jaxdnn(lambda s: loss(nnx.merge(graphdef, s)), state)
    results = []
    for model in (stock, ours):
        opt = nnx.Optimizer(model, optax.sgd(0.05, momentum=0.9), wrt=nnx.Param)

        @nnx.jit
        def step(model, opt):
            value, grads = nnx.value_and_grad(loss)(model)
            opt.update(model, grads)
            return value, grads

        for _ in range(3):
            value, grads = step(model, opt)
        model.eval()
        results.append((value, grads, nnx.state(model), model(x)))
    _close(results[0], results[1], dtype)


# ----------------------------------------------------------------------------------------------
# equinox
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["ema", "batch"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_equinox_model_matches_stock(dtype, mode):
    eqx = pytest.importorskip("equinox")
    import jaxdnn.equinox as jeqx

    class Net(eqx.Module):
        conv: eqx.nn.Conv
        bn: eqx.nn.BatchNorm
        up: eqx.nn.ConvTranspose
        out: eqx.nn.Linear

        def __init__(self, mods, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.conv = mods.Conv(2, 1, 8, 3, stride=2, padding=1, dtype=dtype, key=k1)
            self.bn = mods.BatchNorm(8, axis_name="batch", momentum=0.9, mode=mode,
                                     dtype=jnp.float32)
            self.up = mods.ConvTranspose(2, 8, 4, 3, stride=2, padding=1, output_padding=1,
                                         dtype=dtype, key=k2)
            self.out = eqx.nn.Linear(4, 3, dtype=dtype, key=k3)

        def __call__(self, x, state):
            # Stock equinox's "ema" mode needs the input in its state's dtype.
            h, state = self.bn(self.conv(x).astype(jnp.float32), state)
            h = jax.nn.relu(h).astype(dtype)
            return self.out(self.up(h).mean((1, 2))), state

    x = jax.random.normal(jax.random.key(0), (4, 1, 8, 8), dtype)
    labels = jnp.arange(4) % 3
    stock, state0 = eqx.nn.make_with_state(Net)(eqx.nn, jax.random.key(1))
    ours = jax.tree.unflatten(jax.tree.structure(eqx.nn.make_with_state(Net)(
        jeqx, jax.random.key(1))[0]), jax.tree.leaves(stock))  # the stock leaves load

    def loss(model, state):
        logits, state = jax.vmap(model, in_axes=(0, None), out_axes=(0, None),
                                 axis_name="batch")(x, state)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), labels).mean(), state

    params = eqx.filter(ours, eqx.is_inexact_array)
    assert _uses_jaxdnn(lambda p: loss(eqx.combine(p, ours), state0)[0], params)
    tx = optax.sgd(0.05, momentum=0.9)
    results = []
    for model in (stock, ours):
        state, opt = state0, tx.init(eqx.filter(model, eqx.is_inexact_array))

        @eqx.filter_jit
        def step(model, state, opt):
            (value, state), grads = eqx.filter_value_and_grad(loss, has_aux=True)(model, state)
            updates, opt = tx.update(grads, opt, model)
            return eqx.apply_updates(model, updates), state, opt, value, grads

        for _ in range(3):
            model, state, opt, value, grads = step(model, state, opt)
        evaluated = loss(eqx.nn.inference_mode(model), state)[0]
        results.append((value, jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array)),
                        jax.tree.leaves(state), evaluated))
    _close(results[0], results[1], dtype)


# ----------------------------------------------------------------------------------------------
# use_jaxdnn
# ----------------------------------------------------------------------------------------------

def test_use_jaxdnn_routes_lax_and_is_undone():
    x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
    w = jax.random.normal(jax.random.key(1), (3, 3, 3, 4))
    dn = ("NHWC", "HWIO", "NHWC")

    @jax.jit
    def f(x, w):
        return (jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn),
                jax.lax.conv_transpose(x, w, (2, 2), "SAME", dimension_numbers=dn),
                jax.lax.conv_transpose(x, w[..., :3, :3], (2, 1), "VALID",
                                       rhs_dilation=(1, 2), dimension_numbers=dn,
                                       transpose_kernel=True))

    before = f(x, w)  # traced and cached with lax before the block
    assert not _uses_jaxdnn(f, x, w)
    with jaxdnn.use_jaxdnn():
        assert jax.lax.conv_general_dilated is jaxdnn.conv_general_dilated
        assert _uses_jaxdnn(f, x, w)
        inside = f(x, w)  # the cache was cleared: this traces again, with jaxdnn
        assert jaxdnn.explain(f, x, w)
    assert jax.lax.conv_general_dilated is not jaxdnn.conv_general_dilated
    assert not _uses_jaxdnn(f, x, w)
    _close(before, inside, jnp.float32)


def test_use_jaxdnn_routes_flax_conv_transpose_and_equinox():
    nn = pytest.importorskip("flax.linen")
    eqx = pytest.importorskip("equinox")
    x = jnp.ones((2, 5, 5, 3))
    ct = nn.ConvTranspose(4, (3, 3), strides=(2, 2))
    v = ct.init(jax.random.key(0), x)
    conv = eqx.nn.Conv2d(3, 4, 3, key=jax.random.key(0))
    with jaxdnn.use_jaxdnn():
        assert _uses_jaxdnn(lambda v: ct.apply(v, x), v)
        assert _uses_jaxdnn(jax.vmap(conv), jnp.ones((2, 3, 5, 5)))
    assert not _uses_jaxdnn(lambda v: ct.apply(v, x), v)
