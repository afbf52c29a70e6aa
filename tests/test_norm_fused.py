"""The fused batch-norm epilogue (``activation=``, ``residual=``: BN + add + ReLU) against float64
references written with numpy and jax.nn, on every platform: forward, gradients (the masked
backward kernels and the residual's gradient), agreement with the unfused jaxdnn chain,
second-order check_grads, vmap, the registry's support, and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jax.test_util import check_grads

import jaxdnn
from jaxdnn.selection.norm import NormProblem
from jaxdnn.ops.norm import NormShape
from util import PLATFORMS, assert_close, on, rand

EPS = float(np.float32(1e-5))

# (shape, channel axis). Channels-last (the column path): 16 and 64 channels take the vector
# kernels (CUDA: 16-byte packs, the flat and single-pass forwards), 3 and 5 the scalar ones;
# (2, 9, 7, 16) has rows that are not a multiple of the CPU's super-row width. Channels-first
# (the segment path): segments of 30 values (scalar kernels), 64 (vectors: the single-pass
# forward) and 520 (the CUDA split forward: statistics, table, flat apply).
SHAPES = [((4, 5, 6, 16), -1), ((3, 7, 5, 3), -1), ((2, 8, 8, 64), -1), ((2, 9, 7, 16), -1),
          ((40, 5), -1), ((3, 6, 5, 6), 1), ((2, 16, 8, 8), 1), ((3, 8, 520), 1)]
# (activation, residual?) of every epilogue: relu alone, relu with the add, the add alone.
EPILOGUES = [("relu", False), ("relu", True), (None, True)]


def _ids(v):
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], tuple):
        return "x".join(map(str, v[0])) + ("" if v[1] == -1 else f"_axis{v[1]}")
    return str(v)


def _inputs(shape, dtype, seed=0, axis=-1):
    rng = np.random.default_rng(seed)
    c = shape[axis]
    x = rand(rng, shape, dtype, scale=2.0, offset=0.5)
    res = rand(rng, shape, dtype)
    pd = np.float64 if dtype == jnp.float64 else np.float32  # parameters: the statistics'
    s = rand(rng, (c,), pd, scale=0.5, offset=1.0)
    b = rand(rng, (c,), pd, scale=0.5)
    mean = rand(rng, (c,), pd, scale=0.3)
    var = np.abs(rand(rng, (c,), pd)) + 0.5
    return x, res, s, b, mean, var


def _expand(p, ndim, axis):
    shape = [1] * ndim
    shape[axis] = -1
    return np.asarray(p, np.float64).reshape(shape)


def _reference(x, res, s, b, activation, *, mean=None, var=None, axis=-1):
    """numpy float64: y = act(normalised + res); training statistics when mean is None."""
    x64 = np.asarray(x, np.float64)
    axes = tuple(a for a in range(x.ndim) if a != axis % x.ndim)
    if mean is None:
        mean, var = x64.mean(axes), x64.var(axes)
    e = lambda p: _expand(p, x.ndim, axis)  # noqa: E731
    z = (x64 - e(mean)) / np.sqrt(e(var) + EPS) * e(s) + e(b)
    if res is not None:
        z = z + np.asarray(res, np.float64)
    return np.maximum(z, 0) if activation == "relu" else z


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.float16, jnp.bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("activation,with_res", EPILOGUES, ids=_ids)
@pytest.mark.parametrize("case", SHAPES, ids=_ids)
def test_forward(case, activation, with_res, dtype, platform):
    shape, axis = case
    x, res, s, b, mean, var = _inputs(shape, dtype, axis=axis)
    r = res if with_res else None
    xd, sd, bd, md, vd = on(platform, x, s, b, mean, var)
    rd = on(platform, r) if with_res else None
    y, m, v = jax.jit(lambda x, s, b, r: jaxdnn.batch_norm(
        x, s, b, axis=axis, activation=activation, residual=r))(xd, sd, bd, rd)
    assert y.dtype == x.dtype
    assert_close(y, _reference(x, r, s, b, activation, axis=axis), dtype, what="training y")
    axes = tuple(a for a in range(x.ndim) if a != axis % x.ndim)
    assert_close(m, np.asarray(x, np.float64).mean(axes), jnp.float32, what="mean")
    y = jax.jit(lambda x, s, b, m, v, r: jaxdnn.batch_norm_inference(
        x, s, b, m, v, axis=axis, activation=activation, residual=r))(xd, sd, bd, md, vd, rd)
    assert_close(y, _reference(x, r, s, b, activation, mean=mean, var=var, axis=axis), dtype,
                 what="inference y")


def _train_loss(activation, with_res, f=None):
    """A loss of the fused op's three outputs (or of `f`, a reference with the same outputs),
    so that every cotangent is nonzero and varied."""
    def loss(x, s, b, r):
        y, m, v = (f or jaxdnn.batch_norm)(x, s, b, activation=activation,
                                           residual=r if with_res else None)
        return jnp.sum(jnp.sin(y.astype(jnp.float32)) * 1.5) + jnp.sum(m * v)
    return loss


def _jnp_batch_norm(x, s, b, *, activation, residual, axis=-1):
    """jax.nn / jnp float64 twin of the fused batch norm (the independent reference)."""
    x = x.astype(jnp.float64)
    axes = tuple(a for a in range(x.ndim) if a != axis % x.ndim)
    mean, var = x.mean(axes), x.var(axes)
    shape = [1] * x.ndim
    shape[axis] = -1
    e = lambda p: p.reshape(shape)  # noqa: E731
    z = (x - e(mean)) * jax.lax.rsqrt(e(var) + EPS) * e(s) + e(b)
    if residual is not None:
        z = z + residual.astype(jnp.float64)
    return (jax.nn.relu(z) if activation == "relu" else z), mean, var


def _vjp(f, args, cts):
    _, vjp = jax.vjp(f, *args)
    return vjp(cts)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.bfloat16],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("activation,with_res", EPILOGUES, ids=_ids)
@pytest.mark.parametrize("case", SHAPES[:4] + SHAPES[5:], ids=_ids)
def test_gradients(case, activation, with_res, dtype, platform):
    """d(x), d(scale), d(bias), d(residual) of the training op for random cotangents of its
    three outputs, against the vjp of the float64 jnp twin on the same (rounded) values."""
    shape, axis = case
    x, res, s, b, _, _ = _inputs(shape, dtype, seed=1, axis=axis)
    rng = np.random.default_rng(2)
    sd = np.float64 if dtype == jnp.float64 else np.float32  # the statistics' dtype
    cts = (rand(rng, shape, dtype), rand(rng, s.shape, sd), rand(rng, s.shape, sd))

    def fused(x, s, b, r):
        return jaxdnn.batch_norm(x, s, b, axis=axis, activation=activation, residual=r)

    def twin(x, s, b, r):
        return _jnp_batch_norm(x, s, b, activation=activation, residual=r, axis=axis)

    got = jax.jit(lambda a, c: _vjp(fused, a, c))(on(platform, x, s, b, res),
                                                  on(platform, *cts))
    f64 = lambda a: jnp.asarray(np.asarray(a, np.float64))
    with jax.default_device(jax.devices("cpu")[0]):
        want = _vjp(twin, [f64(a) for a in (x, s, b, res)], tuple(f64(c) for c in cts))
    n = int(np.prod(shape)) // shape[axis]
    for name, g, w in zip(("dx", "dscale", "dbias", "dresidual"), got, want):
        if name == "dresidual" and not with_res:
            continue
        x_like = name in ("dx", "dresidual")
        assert g.dtype == (np.dtype(dtype) if x_like else sd), name
        assert_close(g, w, dtype, k=1 if x_like else n, what=name)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("activation,with_res", EPILOGUES, ids=_ids)
def test_inference_gradients(activation, with_res, axis, platform):
    shape = (4, 5, 6, 16) if axis == -1 else (4, 16, 5, 6)
    x, res, s, b, mean, var = _inputs(shape, jnp.float64, seed=2, axis=axis)

    def loss(f):
        def run(x, s, b, m, v, r):
            y = f(x, s, b, m, v, r)
            return jnp.sum(jnp.sin(y) * 1.5)
        return run

    def fused(x, s, b, m, v, r):
        return jaxdnn.batch_norm_inference(x, s, b, m, v, axis=axis, activation=activation,
                                           residual=r if with_res else None)

    def twin(x, s, b, m, v, r):
        shape = [1] * x.ndim
        shape[axis] = -1
        e = lambda p: p.reshape(shape)  # noqa: E731
        z = (x - e(m)) * jax.lax.rsqrt(e(v) + EPS) * e(s) + e(b) + (r if with_res else 0)
        return jax.nn.relu(z) if activation == "relu" else z

    argnums = tuple(range(6))
    args = [np.asarray(a, np.float64) for a in (x, s, b, mean, var, res)]
    got = jax.jit(jax.grad(loss(fused), argnums=argnums))(*on(platform, *args))
    with jax.default_device(jax.devices("cpu")[0]):
        want = jax.grad(loss(twin), argnums=argnums)(*args)
    for i, (g, w) in enumerate(zip(got, want)):
        if i == 5 and not with_res:
            continue
        assert_close(g, w, jnp.float64,
                     k=1 if i in (0, 5) else int(np.prod(shape)) // shape[axis],
                     what=f"d(argument {i})")


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: np.dtype(d).name)
def test_matches_unfused_chain(dtype, platform):
    """The fused op and jaxdnn's own unfused chain (batch_norm, +, relu) agree within the
    dtype's tolerance. Gradients are compared in float32: in 16 bits the chain's ReLU sees the
    normalised values rounded to the dtype, so its mask differs from the fused op's (which
    rounds once, at the end) wherever z is within a rounding step of zero."""
    shape = (4, 6, 5, 32)
    x, res, s, b, _, _ = _inputs(shape, dtype, seed=3)

    def chain(x, s, b, *, activation, residual):
        y, m, v = jaxdnn.batch_norm(x, s, b)
        return jaxdnn.relu(y + residual), m, v

    args = on(platform, x, s, b, res)
    fused_y = jax.jit(lambda *a: jaxdnn.batch_norm(*a[:3], activation="relu",
                                                   residual=a[3])[0])(*args)
    chain_y = jax.jit(lambda *a: chain(*a[:3], activation="relu", residual=a[3])[0])(*args)
    assert_close(fused_y, np.asarray(chain_y, np.float64), dtype)
    if dtype == jnp.float32:
        fused, ours = (jax.jit(jax.grad(_train_loss("relu", True, f), argnums=(0, 1, 2, 3)))(
            *args) for f in (None, chain))
        for a, c in zip(fused, ours):
            assert_close(a, np.asarray(c, np.float64), dtype, k=int(np.prod(shape[:-1])))


def _away_from_kink(normalised, rng):
    """A residual r such that normalised + r is at least 0.5 from zero (so that check_grads'
    finite differences never cross the ReLU's kink)."""
    u = rng.standard_normal(normalised.shape)
    return -normalised + np.sign(u) * (0.5 + np.abs(u))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_check_grads(platform):
    """Second order, forward and reverse, in float64: training and inference with the add and
    the ReLU, and the add alone, in one loss over one raveled vector."""
    shape = (3, 4, 5, 8)
    epilogues = [("relu", True), (None, True)]
    rng = np.random.default_rng(11)
    cases = []
    for i, _ in enumerate(epilogues):
        x, _, s, b, mean, var = (np.asarray(a, np.float64)
                                 for a in _inputs(shape, jnp.float64, seed=10 + i))
        r_train = _away_from_kink(_reference(x, None, s, b, None), rng)
        r_infer = _away_from_kink(_reference(x, None, s, b, None, mean=mean, var=var), rng)
        cases.append((x, s, b, mean, var, r_train, r_infer))

    def loss(cases):
        total = 0.0
        for (activation, _), (x, s, b, m, v, rt, ri) in zip(epilogues, cases):
            y, bm, bv = jaxdnn.batch_norm(x, s, b, activation=activation, residual=rt)
            yi = jaxdnn.batch_norm_inference(x, s, b, m, v, activation=activation, residual=ri)
            total = total + jnp.sum(jnp.sin(y) + jnp.cos(yi)) + jnp.sum(bm * bv)
        return total

    flat, unravel = ravel_pytree(cases)
    check_grads(jax.jit(lambda v: loss(unravel(v))), (on(platform, flat),), order=2,
                modes=("fwd", "rev"))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_vmap_and_vmap_grad(platform):
    """A mapped axis keeps its own statistics per index; the residual mapped with x."""
    shape = (3, 4, 6, 16)
    rng = np.random.default_rng(7)
    xs, rs = rand(rng, (3, *shape)), rand(rng, (3, *shape))
    _, _, s, b, _, _ = _inputs(shape, jnp.float32)
    xs, rs, s, b = on(platform, xs, rs, s, b)
    loss = _train_loss("relu", True)
    grad = jax.jit(jax.grad(lambda x, r: loss(x, s, b, r), argnums=(0, 1)))
    f = jax.jit(lambda x, r: jaxdnn.batch_norm(x, s, b, activation="relu", residual=r)[0])
    got = jax.jit(jax.vmap(f))(xs, rs)
    assert_close(got, np.stack([f(xs[i], rs[i]) for i in range(3)]), jnp.float32)
    got = jax.jit(jax.vmap(grad))(xs, rs)
    want = [grad(xs[i], rs[i]) for i in range(3)]
    for g, w in zip(got, zip(*want)):
        assert_close(g, np.stack(w), jnp.float32)


def test_grad_runs_masked_backward_kernel():
    """The backward is one norm_bwd call with the ReLU in it: no activation kernel, no separate
    pass for the mask or the add."""
    x, res, s, b, _, _ = _inputs((4, 5, 6, 16), jnp.float32)
    text = jax.jit(jax.grad(_train_loss("relu", True), argnums=(0, 1, 2, 3))).lower(
        x, s, b, res).as_text()
    assert text.count("jaxdnn_norm_bwd") == 1
    assert "jaxdnn_activation" not in text
    assert "relu = true" in text


def test_registry_support():
    """The column and segment paths' algorithms take the epilogue; the row path's decline it
    by name."""
    shapes = {"column": NormShape(P=1, A=30, C=16, K=1, T=1),
              "segment": NormShape(P=1, A=3, C=16, K=1, T=20),
              "row": NormShape(P=1, A=1, C=16, K=1, T=1)}
    for direction in ("fwd", "infer", "bwd"):
        for path, shape in shapes.items():
            infos = {a.name: a for a in jaxdnn.norm_algorithms(
                NormProblem(direction, shape, np.dtype(np.float32), relu=True, residual=True),
                "cpu")}
            assert infos[path].supported == (path != "row"), (direction, path)
            if path == "row":
                assert "epilogue" in infos[path].reason


@pytest.mark.parametrize("call,match", [
    (lambda x, s: jaxdnn.batch_norm(x, s, s, activation="gelu"), "activation"),
    (lambda x, s: jaxdnn.batch_norm(x, s, s, residual=x[:1]), "residual"),
    (lambda x, s: jaxdnn.batch_norm(x, s, s, residual=x.astype(jnp.bfloat16)), "residual"),
    (lambda x, s: jaxdnn.batch_norm(x[:1, :1, :1], s, s, activation="relu"),
     "more than one value per channel"),
    (lambda x, s: jaxdnn.batch_norm_inference(x, s, s, s, s + 1, activation="tanh"),
     "activation"),
    (lambda x, s: jaxdnn.batch_norm(x, s, s, residual="shortcut"), "residual"),
])
def test_bad_input(call, match):
    x = jnp.ones((2, 3, 4, 8), jnp.float32)
    s = jnp.ones((8,), jnp.float32)
    with pytest.raises((ValueError, TypeError), match=match):
        jax.jit(call)(x, s)
