"""jaxdnn.conv_general_dilated as a drop-in for jax.lax.conv_general_dilated: the same
parameters, accepted by libraries that pass them all (flax.nnx.Conv) and by jax's own callers
(jnp.convolve, jax.scipy.signal.convolve2d, lax's convolution transpose rules) when it replaces
lax's function, and `out_sharding` with lax's meaning."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn

from util import assert_close, rand, subprocess_env


def test_signature_accepts_every_lax_parameter():
    ours = inspect.signature(jaxdnn.conv_general_dilated).parameters
    theirs = inspect.signature(lax.conv_general_dilated).parameters
    for i, (name, p) in enumerate(theirs.items()):
        assert name in ours, f"lax's parameter {name!r} is missing"
        q = ours[name]
        assert q.kind == p.kind, (name, q.kind, p.kind)
        assert q.default == p.default, (name, q.default, p.default)
        if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD:
            assert list(ours).index(name) == i, f"{name!r} is not lax's positional argument {i}"
    extra = [n for n, q in ours.items() if n not in theirs]
    assert all(ours[n].kind == inspect.Parameter.KEYWORD_ONLY for n in extra), extra


def _uses_jaxdnn(f, *args) -> bool:
    text = str(jax.make_jaxpr(f)(*args))
    return "jaxdnn_conv_fwd" in text and "conv_general_dilated" not in text


def test_flax_nnx_conv_forward_and_grad():
    nnx = pytest.importorskip("flax.nnx")
    rng = np.random.default_rng(0)
    x = jnp.asarray(rand(rng, (2, 9, 9, 3)))

    def model(conv):
        return nnx.Conv(3, 5, kernel_size=(3, 3), strides=(2, 1), padding="SAME",
                        kernel_dilation=(1, 2), conv_general_dilated=conv, rngs=nnx.Rngs(0))

    def loss(m, x):
        return jnp.sum(jnp.sin(m(x)))

    ours, stock = model(jaxdnn.conv_general_dilated), model(lax.conv_general_dilated)
    assert _uses_jaxdnn(lambda x: ours(x), x)
    assert_close(ours(x), stock(x), jnp.float32, k=27)
    g_ours, g_stock = nnx.grad(loss)(ours, x), nnx.grad(loss)(stock, x)
    for name in ("kernel", "bias"):
        assert_close(getattr(g_ours, name)[...], getattr(g_stock, name)[...], jnp.float32,
                     k=2 * 5 * 9, what=name)


def _value_and_grads(f, *args):
    loss = lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
    return f(*args), jax.grad(loss, argnums=tuple(range(len(args))))(*args)


@pytest.mark.parametrize("mode", ["full", "same", "valid"])
def test_jax_callers_under_substitution(mode):
    """With lax's conv_general_dilated swapped for jaxdnn's (jaxdnn.use_jaxdnn: in jax.lax and
    where jax's own callers look it up), jnp.convolve and jax.scipy.signal.convolve2d run on
    jaxdnn and match float64 stock lax."""
    rng = np.random.default_rng(1)
    cases = [(jnp.convolve, (rand(rng, (23,)), rand(rng, (6,))), 6),
             (jax.scipy.signal.convolve2d, (rand(rng, (11, 9)), rand(rng, (4, 3))), 12)]
    fns = [(lambda x, y, f=f: f(x, y, mode=mode), args, k) for f, args, k in cases]
    # float64 references from the stock functions
    refs = [_value_and_grads(fn, *(np.asarray(a, np.float64) for a in args))
            for fn, args, _ in fns]
    with jaxdnn.use_jaxdnn():
        for (fn, args, k), (ref_y, ref_g) in zip(fns, refs):
            assert _uses_jaxdnn(fn, *args)
            y, g = _value_and_grads(fn, *args)
            assert_close(y, ref_y, jnp.float32, k=k, what="value")
            for a, b in zip(g, ref_g):
                assert_close(a, b, jnp.float32, k=k * 4, what="grad")


def test_lax_transpose_rules_under_substitution():
    """lax's own convolution transpose rules call the substituted function with
    `out_sharding=` (and negative padding, ConvDimensionNumbers, batch groups)."""
    stock = lax.conv_general_dilated
    rng = np.random.default_rng(2)
    x, w = rand(rng, (2, 9, 8, 6)), rand(rng, (3, 2, 3, 4))
    f = lambda x, w: stock(x, w, (2, 1), "SAME", rhs_dilation=(1, 2),  # noqa: E731
                           dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=2)
    ref_y, ref_g = _value_and_grads(f, np.asarray(x, np.float64), np.asarray(w, np.float64))
    with jaxdnn.use_jaxdnn():
        jaxpr = str(jax.make_jaxpr(jax.grad(lambda x, w: jnp.sum(f(x, w)), (0, 1)))(x, w))
        assert "conv_general_dilated" in jaxpr and "jaxdnn_conv" in jaxpr
        y, g = _value_and_grads(f, x, w)
        assert_close(y, ref_y, jnp.float32, k=18)
        for a, b in zip(g, ref_g):
            assert_close(a, b, jnp.float32, k=2 * 5 * 8 * 2, what="grad")


def test_out_sharding_bad_value():
    x, w = jnp.ones((1, 4, 4, 2)), jnp.ones((1, 1, 2, 3))
    dn = ("NHWC", "HWIO", "NHWC")
    with pytest.raises(TypeError, match="out_sharding"):
        jaxdnn.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn,
                                    out_sharding="batch")
    with pytest.raises(ValueError, match="out_sharding"):  # a spec needs a mesh in context
        jaxdnn.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn,
                                    out_sharding=jax.sharding.PartitionSpec("batch"))


def test_out_sharding_sets_the_result_sharding(tmp_path):
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax import lax
        from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
        import jaxdnn

        assert len(jax.devices()) == 4
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((8, 6, 6, 4)), jnp.float32)
        w = jnp.asarray(rng.standard_normal((3, 3, 4, 8)), jnp.float32)
        kw = dict(window_strides=(1, 1), padding="SAME",
                  dimension_numbers=("NHWC", "HWIO", "NHWC"), precision="highest")
        ref = lax.conv_general_dilated(x, w, **kw)

        def check(y, sharding):
            assert y.sharding.is_equivalent_to(sharding, y.ndim), (y.sharding, sharding)
            np.testing.assert_allclose(np.asarray(y), np.asarray(ref), rtol=1e-5, atol=1e-5)

        # Auto axes (lax rejects them): a sharding constraint, under jit and eagerly.
        auto = jax.make_mesh((2, 2), ("b", "c"), axis_types=(AxisType.Auto,) * 2)
        for spec in (P("b"), P(None, None, None, "c"), P(("b", "c"))):
            s = NamedSharding(auto, spec)
            conv = lambda x, w: jaxdnn.conv_general_dilated(x, w, **kw, out_sharding=s)
            check(jax.jit(conv)(x, w), s)
            check(conv(x, w), s)
        # Explicit axes: lax's meaning, the sharding is the result's type.
        explicit = jax.make_mesh((4,), ("b",), axis_types=(AxisType.Explicit,))
        with jax.set_mesh(explicit):
            f = jax.jit(lambda x, w: jaxdnn.conv_general_dilated(x, w, **kw, out_sharding=P("b")))
            y = f(x, w)
            assert jax.typeof(y).sharding.spec == P("b", None, None, None), jax.typeof(y)
            check(y, NamedSharding(explicit, P("b")))
            lax_y = jax.jit(lambda x, w: lax.conv_general_dilated(x, w, **kw,
                                                                  out_sharding=P("b")))(x, w)
            assert jax.typeof(lax_y).sharding == jax.typeof(y).sharding
        print("out_sharding ok")
    """)
    env = subprocess_env(JAX_PLATFORMS="cpu",
                         XLA_FLAGS="--xla_force_host_platform_device_count=4")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "out_sharding ok" in out.stdout
