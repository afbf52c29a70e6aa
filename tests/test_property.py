"""Property-based tests: random valid problems for conv, pooling, the norms and softmax against
jax.lax / jax.nn / numpy in float64 on the CPU (values and gradients), and random invalid
arguments, which must raise a ValueError or TypeError that names the offending argument.

Derandomized and bounded (tests/conftest.py's CI budget): the same examples every run.
"""

from __future__ import annotations

import functools
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jax import lax

import jaxdnn

from util import assert_close

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
CPU = jax.devices("cpu")[0]
EPS = float(np.float32(1e-5))
CHANNELS_LAST = {1: "NWC", 2: "NHWC"}
CHANNELS_FIRST = {1: "NCW", 2: "NCHW"}


def _normal(seed, shape):
    """Random normal float64 values (never zeros) from a seed hypothesis draws."""
    return np.random.default_rng(seed).standard_normal(shape)


def _vjp(f, *args):
    """f(*primals) and its vjp at the cotangent, args = (*primals, cotangent)."""
    y, vjp = jax.vjp(f, *args[:-1])
    return (y, *vjp(args[-1]))


@functools.cache
def _jit_vjp(f):
    return jax.jit(partial(_vjp, f))


# ---- valid convolutions ------------------------------------------------------------------------

def _conv_out(n, k, s, d, lo, hi, ld=1):
    span = (n - 1) * ld + 1 + lo + hi - ((k - 1) * d + 1)
    return span // s + 1 if span >= 0 else 0


@st.composite
def conv_problems(draw):
    """(jaxdnn function, lax keywords, x shape, w shape) of a random valid convolution, through
    jaxdnn.conv (layouts, SAME/VALID/int/pair padding) or jaxdnn.conv_general_dilated (lhs
    dilation, negative padding, dimension numbers)."""
    nd = draw(st.sampled_from([1, 2]))
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cin, cout = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    n = draw(st.integers(1, 2))
    spatial = tuple(draw(st.integers(1, 7)) for _ in range(nd))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dil = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    front = draw(st.sampled_from(["conv", "conv_general_dilated"]))
    channels_first = draw(st.booleans())
    lhs = (CHANNELS_FIRST if channels_first else CHANNELS_LAST)[nd]
    rhs = "OI" + lhs[2:] if channels_first else lhs[1:-1] + "IO"
    ld = (1,) * nd
    if front == "conv":
        padding = draw(st.one_of(st.sampled_from(["SAME", "VALID"]), st.integers(0, 2),
                                 st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)),
                                          min_size=nd, max_size=nd)))
        out = lhs
    else:
        ld = tuple(draw(st.integers(1, 2)) for _ in range(nd))
        padding = draw(st.lists(st.tuples(st.integers(-1, 2), st.integers(-1, 2)),
                                min_size=nd, max_size=nd))
        out = draw(st.sampled_from([CHANNELS_LAST[nd], CHANNELS_FIRST[nd]]))
    if isinstance(padding, str):
        eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
        pairs = lax.padtype_to_pads(spatial, eff, stride, padding)
    elif isinstance(padding, int):
        pairs = [(padding, padding)] * nd
    else:
        pairs = padding
    outs = [_conv_out(*a) for a in zip(spatial, kernel, stride, dil, *zip(*pairs), ld)]
    assume(all(o >= 1 for o in outs))
    letters = lhs[2:] if channels_first else lhs[1:-1]  # the spatial dims, e.g. "HW"
    x_dims = dict(N=n, C=cin, **dict(zip(letters, spatial)))
    w_dims = dict(O=cout, I=cin // groups, **dict(zip(letters, kernel)))
    x_shape, w_shape = tuple(x_dims[c] for c in lhs), tuple(w_dims[c] for c in rhs)
    kw = dict(window_strides=stride, padding=pairs if not isinstance(padding, str) else padding,
              lhs_dilation=ld, rhs_dilation=dil, dimension_numbers=(lhs, rhs, out),
              feature_group_count=groups)
    if front == "conv":
        fn = partial(jaxdnn.conv, stride=stride, padding=padding, dilation=dil, groups=groups,
                     layout=lhs)
    else:
        fn = partial(jaxdnn.conv_general_dilated, **kw)
    return fn, kw, x_shape, w_shape, draw(st.integers(0, 2 ** 31))


@SETTINGS
@given(conv_problems())
def test_conv_matches_lax(problem):
    fn, kw, x_shape, w_shape, seed = problem
    ref = partial(lax.conv_general_dilated, **kw, precision=lax.Precision.HIGHEST)
    x, w = _normal(seed, x_shape), _normal(seed + 1, w_shape)
    y_shape = jax.eval_shape(ref, x, w).shape
    ct = _normal(seed + 2, y_shape)
    ours = jax.jit(partial(_vjp, fn))(x, w, ct)
    want = _jit_vjp(ref)(x, w, ct)
    scales = [np.sqrt(s) for s in _jit_vjp(ref)(x * x, w * w, ct * ct)]
    k = math.prod(w_shape) // kw["feature_group_count"]
    for name, o, r, s in zip(("y", "dx", "dw"), ours, want, scales):
        assert o.shape == r.shape
        assert_close(o, r, np.float64, scale=s, k=k if name != "dw" else math.prod(y_shape),
                     what=f"{name} {x_shape} {w_shape} {kw}")


# ---- valid pooling -----------------------------------------------------------------------------

@st.composite
def pool_problems(draw):
    nd = draw(st.sampled_from([1, 2]))
    op = draw(st.sampled_from(["max", "avg", "avg_exclude_pad"]))
    channels_first = draw(st.booleans())
    layout = (CHANNELS_FIRST if channels_first else CHANNELS_LAST)[nd]
    spatial = tuple(draw(st.integers(1, 7)) for _ in range(nd))
    window = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    strides = draw(st.one_of(st.none(), st.tuples(*[st.integers(1, 3)] * nd)))
    padding = draw(st.one_of(st.sampled_from(["SAME", "VALID"]),
                             st.tuples(*[st.tuples(st.integers(0, w - 1), st.integers(0, w - 1))
                                         for w in window])))
    strd = window if strides is None else strides
    pairs = (lax.padtype_to_pads(spatial, window, strd, padding) if isinstance(padding, str)
             else padding)
    assume(all(n + lo + hi >= w for n, w, (lo, hi) in zip(spatial, window, pairs)))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    shape = (n, c, *spatial) if channels_first else (n, *spatial, c)
    return op, layout, shape, window, strides, padding, tuple(pairs), draw(st.integers(0, 2 ** 31))


def _ref_pool(x, op, window, strides, pairs, channels_first):
    """lax.reduce_window in float64 (channels-last)."""
    if channels_first:
        x = jnp.moveaxis(x, 1, -1)
    dims, strd, pad = (1, *window, 1), (1, *strides, 1), ((0, 0), *pairs, (0, 0))
    if op == "max":
        y = lax.reduce_window(x, -jnp.inf, lax.max, dims, strd, pad)
    else:
        y = lax.reduce_window(x, 0.0, lax.add, dims, strd, pad)
        if op == "avg":
            y = y / math.prod(window)
        else:
            y = y / lax.reduce_window(jnp.ones_like(x), 0.0, lax.add, dims, strd, pad)
    return jnp.moveaxis(y, -1, 1) if channels_first else y


@SETTINGS
@given(pool_problems())
def test_pool_matches_lax(problem):
    op, layout, shape, window, strides, padding, pairs, seed = problem
    rng = np.random.default_rng(seed)
    # Distinct values: max pooling's gradient has no ties to break.
    x = rng.permutation(math.prod(shape)).reshape(shape) / math.prod(shape) - 0.5 \
        if op == "max" else _normal(seed, shape)
    if op == "max":
        fn = partial(jaxdnn.max_pool, window=window, strides=strides, padding=padding,
                     layout=layout)
    else:
        fn = partial(jaxdnn.avg_pool, window=window, strides=strides, padding=padding,
                     layout=layout, count_include_pad=op == "avg")
    ref = partial(_ref_pool, op=op, window=window, strides=strides or window, pairs=pairs,
                  channels_first=layout[1] == "C")
    ct = _normal(seed + 1, jax.eval_shape(ref, x).shape)
    for name, o, r in zip(("y", "dx"), jax.jit(partial(_vjp, fn))(x, ct),
                          jax.jit(partial(_vjp, ref))(x, ct)):
        assert_close(o, r, np.float64, what=f"{op} {name} {shape} {window} {strides} {padding}")


# ---- valid norms -------------------------------------------------------------------------------

@st.composite
def norm_problems(draw):
    op = draw(st.sampled_from(["layer_norm", "rms_norm", "batch_norm", "group_norm"]))
    rank = draw(st.integers(2, 4))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    kw = {}
    if op in ("layer_norm", "rms_norm"):
        axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
        group = math.prod(shape[a] for a in axes)
        kw["axis"] = (axes[0] - rank if draw(st.booleans()) else axes[0]) if len(axes) == 1 \
            else tuple(axes)
    elif op == "batch_norm":
        kw["axis"] = draw(st.integers(-rank, rank - 1))
        group = math.prod(shape) // shape[kw["axis"]]
    else:
        layout = draw(st.sampled_from([None, "first"]))
        if layout == "first":
            kw["layout"] = {2: "NC", 3: "NCW", 4: "NCHW"}[rank]
        c = shape[1] if layout == "first" and rank > 2 else shape[-1]
        kw["groups"] = draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
        group = math.prod(shape[1:]) // kw["groups"]
    # A group of one value has variance 0: its gradient is pure cancellation of terms
    # 1/sqrt(eps) ~ 316x the result (tests/test_norm.py covers it with that scale).
    assume(group > 1)
    return op, shape, kw, draw(st.booleans()), draw(st.integers(0, 2 ** 31))


def _norm_axes(op, shape, kw):
    """(statistics axes of x, parameter axes), as numpy sees them, without grouping."""
    rank = len(shape)
    if op in ("layer_norm", "rms_norm"):
        a = kw["axis"]
        axes = tuple(sorted(v % rank for v in (a if isinstance(a, tuple) else (a,))))
        return axes, axes
    ax = kw["axis"] % rank
    return tuple(v for v in range(rank) if v != ax), (ax,)


def _ref_norm(op, shape, kw, x, s, b, rstd=False):
    """The norm in jnp, float64: y, and for batch norm (y, mean, var); with rstd=True,
    1/sqrt(var + eps) of each element's group instead."""
    rank = len(shape)
    if op == "group_norm":
        cf = kw.get("layout") is not None and rank > 2
        c, g = (shape[1] if cf else shape[-1]), kw["groups"]
        xg = x.reshape((shape[0], g, c // g, *shape[2:]) if cf else (*shape[:-1], g, c // g))
        axes = tuple(range(2, xg.ndim)) if cf else tuple(a for a in range(1, xg.ndim)
                                                         if a != xg.ndim - 2)
        m = xg.mean(axes, keepdims=True)
        v = jnp.square(xg - m).mean(axes, keepdims=True)
        if rstd:
            return jnp.broadcast_to(1 / jnp.sqrt(v + EPS), xg.shape).reshape(shape)
        xh = ((xg - m) / jnp.sqrt(v + EPS)).reshape(shape)
        pshape = [1] * rank
        pshape[1 if cf else -1] = c
        return xh * s.reshape(pshape) + b.reshape(pshape)
    axes, paxes = _norm_axes(op, shape, kw)
    pshape = [shape[a] if a in paxes else 1 for a in range(rank)]
    m = x.mean(axes, keepdims=True) if op != "rms_norm" else 0.0
    v = jnp.square(x - m).mean(axes, keepdims=True)
    if rstd:
        return jnp.broadcast_to(1 / jnp.sqrt(v + EPS), shape)
    y = (x - m) / jnp.sqrt(v + EPS) * s.reshape(pshape)
    if op == "rms_norm":
        return y
    y = y + b.reshape(pshape)
    return (y, m.reshape(-1), v.reshape(-1)) if op == "batch_norm" else y


@SETTINGS
@given(norm_problems())
def test_norm_matches_numpy(problem):
    op, shape, kw, affine, seed = problem
    x = 2 * _normal(seed, shape) + 0.5
    if op == "group_norm":
        pshape = ((shape[1] if kw.get("layout") and len(shape) > 2 else shape[-1]),)
    else:
        pshape = tuple(shape[a] for a in _norm_axes(op, shape, kw)[1])
    s, b = (_normal(seed + 1, pshape), _normal(seed + 2, pshape)) if affine else \
        (np.ones(pshape), np.zeros(pshape))
    fn = getattr(jaxdnn, op)
    if op == "rms_norm":
        ours = lambda x, s, b: fn(x, s if affine else None, **kw)  # noqa: E731
    else:
        ours = lambda x, s, b: fn(x, s if affine else None, b if affine else None, **kw)  # noqa
    ref = partial(_ref_norm, op, shape, kw)
    ct = _normal(seed + 3, shape)
    if op == "batch_norm":  # the statistics: y's cotangent reaches them too
        ct = (ct, _normal(seed + 4, pshape), _normal(seed + 5, pshape))
    got = jax.jit(partial(_vjp, ours))(x, s, b, ct)
    exp = jax.jit(partial(_vjp, ref))(x, s, b, ct)
    names = ("y", "dx", "dscale", "dbias")[:4 if affine and op != "rms_norm" else
                                             3 if affine else 2]
    # dx = rstd * (s ct - mean(s ct) - xhat * mean(s ct xhat)) (plus, for batch norm, the
    # statistics' cotangents): terms of rstd * |s ct| that cancel to a much smaller result
    # in small groups.
    # Batch norm's mean and variance (y's leaves 1 and 2) take the scale of their terms, x and
    # (x - mean)^2: a mean of values ~2 may be ~0.
    rstd = np.asarray(ref(x, s, b, rstd=True))
    cts = np.concatenate([np.ravel(c) for c in jax.tree.leaves(ct)])
    rms = lambda a: np.sqrt(np.mean(np.square(a)))  # noqa: E731
    scales = {"dx": rstd.max() * np.abs(s).max() * rms(cts), "y1": rms(x), "y2": 2 * rms(x) ** 2}
    for name, o, r in zip(names, got, exp):
        for i, (oo, rr) in enumerate(zip(jax.tree.leaves(o), jax.tree.leaves(r))):
            scale = scales.get(name if name == "dx" else f"{name}{i}")
            assert_close(oo, rr, np.float64, scale=scale, what=f"{op} {name}[{i}] {shape} {kw}")


# ---- valid softmax -----------------------------------------------------------------------------

@st.composite
def softmax_problems(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    axis = draw(st.one_of(st.none(), st.integers(-rank, rank - 1),
                          st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank,
                                   unique=True).map(tuple)))
    return draw(st.sampled_from(["softmax", "log_softmax"])), shape, axis, \
        draw(st.integers(0, 2 ** 31))


@SETTINGS
@given(softmax_problems())
def test_softmax_matches_jax_nn(problem):
    name, shape, axis, seed = problem
    x, ct = 3 * _normal(seed, shape), _normal(seed + 1, shape)
    ours = partial(getattr(jaxdnn, name), axis=axis)
    ref = partial(getattr(jax.nn, name), axis=axis)
    for what, o, r in zip(("y", "dx"), jax.jit(partial(_vjp, ours))(x, ct),
                          jax.jit(partial(_vjp, ref))(x, ct)):
        assert_close(o, r, np.float64, scale=1.0, what=f"{name} {what} {shape} axis={axis}")


# ---- invalid arguments -------------------------------------------------------------------------
# Each draw is (description, thunk, words): the thunk must raise ValueError or TypeError with
# one of `words` in its message. The thunks trace abstractly (jax.eval_shape): the checks run at
# trace time, before anything compiles.

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def _shapes(nd, n=2, c=4, k=6, size=5, kernel=3):
    return (n, *(size,) * nd, c), (*(kernel,) * nd, c, k)


def _conv_thunk(x_shape, w_shape, x_dtype=F32, w_dtype=F32, **kw):
    return lambda: jax.eval_shape(lambda x, w: jaxdnn.conv(x, w, **kw), S(x_shape, x_dtype),
                                  S(w_shape, w_dtype))


@st.composite
def invalid_conv(draw):
    nd = draw(st.sampled_from([1, 2, 3]))
    x_shape, w_shape = _shapes(nd, c=draw(st.sampled_from([2, 4, 6])))
    c = x_shape[-1]
    kind = draw(st.sampled_from(["w_rank", "x_rank", "channels", "groups_c", "groups_k",
                                 "groups_0", "padding", "padding_str", "stride", "stride_len",
                                 "dilation", "dtype", "dtype_mismatch", "layout",
                                 "preferred"]))
    bad = draw(st.integers(-3, 0))
    if kind == "w_rank":
        return kind, _conv_thunk(x_shape, w_shape[1:]), ["`w`"]
    if kind == "x_rank":
        r = draw(st.sampled_from([1, 2, 6]))
        return kind, _conv_thunk((2,) * r, (2,) * r), ["`x`"]
    if kind == "channels":
        return kind, _conv_thunk(x_shape, (*w_shape[:-2], c + draw(st.integers(1, 3)), 6)), \
            ["`w`"]
    if kind == "groups_c":
        g = draw(st.sampled_from([g for g in (3, 4, 5, 7) if c % g]))
        return kind, _conv_thunk(x_shape, w_shape, groups=g), ["`groups`"]
    if kind == "groups_k":  # divides C, not the 5 outputs
        return kind, _conv_thunk(x_shape, (*w_shape[:-2], c // 2, 5), groups=2), ["`groups`"]
    if kind == "groups_0":
        return kind, _conv_thunk(x_shape, w_shape, groups=bad), ["`groups`"]
    if kind == "padding":
        pad = [(draw(st.integers(-3, 2)), draw(st.integers(-3, 2))) for _ in range(nd)]
        assume(any(v < 0 for p in pad for v in p))
        return kind, _conv_thunk(x_shape, w_shape, padding=pad), ["`padding`"]
    if kind == "padding_str":
        return kind, _conv_thunk(x_shape, w_shape, padding="FULL"), ["`padding`"]
    if kind == "stride":
        return kind, _conv_thunk(x_shape, w_shape, stride=bad), ["`stride`"]
    if kind == "stride_len":
        return kind, _conv_thunk(x_shape, w_shape, stride=(1,) * (nd + 1)), ["`stride`"]
    if kind == "dilation":
        return kind, _conv_thunk(x_shape, w_shape, dilation=bad), ["`dilation`"]
    if kind == "dtype":
        dt = draw(st.sampled_from([jnp.bool_, jnp.complex64]))  # integers convolve (lax does)
        return kind, _conv_thunk(x_shape, w_shape, dt, dt), ["`x`"]
    if kind == "dtype_mismatch":
        return kind, _conv_thunk(x_shape, w_shape, F32, jnp.float64), ["`w`"]
    if kind == "layout":
        lay = draw(st.sampled_from(["NHCW", "nhwc", "CHWN", {1: "NCHW", 2: "NCW", 3: "NHWC"}[nd]]))
        return kind, _conv_thunk(x_shape, w_shape, layout=lay), ["`layout`"]
    return kind, _conv_thunk(x_shape, w_shape, preferred_element_type=jnp.int32), \
        ["`preferred_element_type`"]


@st.composite
def invalid_conv_general(draw):
    x_shape, w_shape = _shapes(2)
    dn = ("NHWC", "HWIO", "NHWC")
    kind = draw(st.sampled_from(["window_strides", "lhs_dilation", "rhs_dilation",
                                 "feature_group_count", "rhs_channels", "batch_group_count"]))
    kw = dict(window_strides=(1, 1), padding="VALID", dimension_numbers=dn)
    bad = draw(st.integers(-2, 0))
    if kind in ("window_strides", "lhs_dilation", "rhs_dilation"):
        kw[kind] = (1, bad)
        words = [f"`{kind}`"]
    elif kind == "feature_group_count":
        kw[kind] = 3
        words = ["`feature_group_count`"]
    elif kind == "batch_group_count":
        kw[kind] = 4  # does not divide the batch of 2
        words = ["`batch_group_count`"]
    else:
        w_shape = (3, 3, 5, 6)
        words = ["`rhs`"]
    thunk = lambda: jax.eval_shape(  # noqa: E731
        lambda x, w: jaxdnn.conv_general_dilated(x, w, **kw), S(x_shape, F32), S(w_shape, F32))
    return kind, thunk, words


@st.composite
def invalid_pool(draw):
    nd = draw(st.sampled_from([1, 2, 3]))
    shape = (2, *(5,) * nd, 3)
    op = draw(st.sampled_from(["max_pool", "avg_pool"]))
    kind = draw(st.sampled_from(["window", "strides", "padding", "rank", "dtype", "too_big",
                                 "layout", "count_include_pad"]))
    kw = dict(window=2)
    bad = draw(st.integers(-2, 0))
    words = [f"`{kind}`"]
    if kind == "window":
        kw["window"] = draw(st.sampled_from([bad, (2,) * nd + (bad,), (2,) * (nd + 1)]))
    elif kind == "strides":
        kw["strides"] = bad
    elif kind == "padding":
        kw["padding"] = draw(st.sampled_from([bad - 1, [(1, bad - 1)] * nd, "FULL"]))
    elif kind == "rank":
        shape = (2,) * draw(st.sampled_from([1, 2, 6]))
        words = ["`x`"]
    elif kind == "too_big":
        kw["window"] = 6
        words = ["window"]
    elif kind == "layout":
        kw["layout"] = draw(st.sampled_from(["NHCW", {1: "NCHW", 2: "NCW", 3: "NHWC"}[nd]]))
    elif kind == "count_include_pad":
        if op == "max_pool":
            kind, kw["window"], words = "window", (2,) * (nd + 1), ["`window`"]
        else:
            kw["count_include_pad"] = "yes"
    dtype = jnp.int32 if kind == "dtype" else F32
    if kind == "dtype":
        words = ["`x`"]
    fn = getattr(jaxdnn, op)
    return f"{op} {kind}", lambda: jax.eval_shape(lambda x: fn(x, **kw), S(shape, dtype)), words


@st.composite
def invalid_norm(draw):
    shape = (2, 3, 4, 6)
    op = draw(st.sampled_from(["layer_norm", "rms_norm", "batch_norm", "group_norm",
                               "batch_norm_inference"]))
    kinds = ["scale", "dtype", "eps"]
    kinds += {"group_norm": ["groups", "groups_0", "layout"]}.get(op, ["axis", "axis_type"])
    if op in ("layer_norm", "rms_norm"):
        kinds.append("axis_repeat")
    kind = draw(st.sampled_from(kinds))
    c = {"layer_norm": (6,), "rms_norm": (6,)}.get(op, (6,))
    args = dict(x=S(shape, F32), scale=np.ones(c, np.float32))
    if op not in ("rms_norm",):
        args["bias"] = np.zeros(c, np.float32)
    if op == "batch_norm_inference":
        args.update(mean=np.zeros(c, np.float32), var=np.ones(c, np.float32))
    kw = dict(groups=2) if op == "group_norm" else {}
    words = [f"`{kind}`"]
    if kind == "scale":
        which = draw(st.sampled_from([k for k in ("scale", "bias", "mean", "var") if k in args]))
        args[which] = np.ones(draw(st.sampled_from([(5,), (2, 6), (7,)])), np.float32)
        words = [f"`{which}`"]
    elif kind == "dtype":
        args["x"] = S(shape, draw(st.sampled_from([jnp.int32, jnp.uint8, jnp.bool_])))
        words = ["`x`"]
    elif kind == "eps":
        kw["eps"] = draw(st.sampled_from([-1e-5, float("nan"), float("inf")]))
    elif kind == "axis":
        kw["axis"] = draw(st.sampled_from([4, -5, 17]))
    elif kind == "axis_type":
        kw["axis"], kind = 1.5, "axis"
        words = ["`axis`"]
    elif kind == "axis_repeat":
        kw["axis"] = draw(st.sampled_from([(1, 1), (-1, 3), ()]))
        words = ["`axis`"]
    elif kind == "groups":
        kw["groups"] = draw(st.sampled_from([4, 5, 7]))
    elif kind == "groups_0":
        kw["groups"] = draw(st.integers(-2, 0))
        words = ["`groups`"]
    else:
        kw["layout"] = draw(st.sampled_from(["NCW", "NHCW", "nhwc"]))
    arrays = {k: v for k, v in args.items() if isinstance(v, S)}
    rest = {k: v for k, v in args.items() if not isinstance(v, S)}
    fn = getattr(jaxdnn, op)
    return (f"{op} {kind}",
            lambda: jax.eval_shape(lambda x: fn(x, *rest.values(), **kw), arrays["x"]), words)


@st.composite
def invalid_softmax(draw):
    op = draw(st.sampled_from(["softmax", "log_softmax"]))
    kind = draw(st.sampled_from(["axis", "axis_repeat", "axis_type", "dtype", "algo"]))
    shape, dtype, kw, words = (3, 4, 5), F32, {}, ["`axis`"]
    if kind == "axis":
        kw["axis"] = draw(st.sampled_from([3, -4, (0, 5)]))
    elif kind == "axis_repeat":
        kw["axis"] = draw(st.sampled_from([(1, 1), (0, -3)]))
    elif kind == "axis_type":
        kw["axis"] = draw(st.sampled_from([1.0, "last", (0, 1.5)]))
    elif kind == "dtype":
        dtype, words = draw(st.sampled_from([jnp.int32, jnp.bool_, jnp.uint16])), ["`x`"]
    else:
        kw["algo"], words = draw(st.sampled_from([3, ["rows"]])), ["`algo`"]
    fn = getattr(jaxdnn, op)
    return f"{op} {kind}", lambda: jax.eval_shape(lambda x: fn(x, **kw), S(shape, dtype)), words


INVALID = {"conv": invalid_conv(), "conv_general_dilated": invalid_conv_general(),
           "pool": invalid_pool(), "norm": invalid_norm(), "softmax": invalid_softmax()}


@pytest.mark.parametrize("family", INVALID)
@SETTINGS
@given(data=st.data())
def test_invalid_arguments_raise_naming_the_argument(family, data):
    what, thunk, words = data.draw(INVALID[family])
    with pytest.raises((ValueError, TypeError)) as info:
        thunk()
    message = str(info.value)
    assert any(w in message for w in words), f"{what}: {message!r} names none of {words}"
    assert message.startswith("jaxdnn"), f"{what}: {message!r} does not name the API"


# Bad input an outside fuzz found to crash or to give a wrong answer (tests/test_bad_input.py
# has one regression test each); here as fixed examples beside the drawn ones.
KNOWN = {
    "zero_size_filter_dim": (_conv_thunk((1, 5, 5, 2), (0, 3, 2, 4)), ["`w`"]),
    "negative_padding_past_the_input": (
        lambda: jax.eval_shape(lambda x, w: jaxdnn.conv_general_dilated(
            x, w, (1, 1), ((-4, -4), (0, 0)), dimension_numbers=("NHWC", "HWIO", "NHWC")),
            S((1, 5, 5, 2), F32), S((3, 3, 2, 4), F32)), ["`padding`"]),
    "malformed_conv_dimension_numbers": (
        lambda: jax.eval_shape(lambda x, w: jaxdnn.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=lax.ConvDimensionNumbers(
                (0, 3, 1, 1), (3, 2, 0, 1), (0, 3, 1, 2))),
            S((1, 5, 5, 2), F32), S((3, 3, 2, 4), F32)), ["`dimension_numbers`"]),
    "relu_of_none": (lambda: jaxdnn.relu(None), ["`x`"]),
    "global_avg_pool_names_itself": (
        lambda: jax.eval_shape(jaxdnn.global_avg_pool, S((2, 3, 3, 2), jnp.int32)),
        ["jaxdnn.global_avg_pool"]),
    "int64_overflow_shape": (_conv_thunk((2 ** 31, 2 ** 20, 2 ** 20, 2), (3, 3, 2, 4)),
                             ["`x`"]),
}


@pytest.mark.parametrize("name", KNOWN)
def test_known_bad_input(name):
    thunk, words = KNOWN[name]
    with pytest.raises((ValueError, TypeError)) as info:
        thunk()
    assert any(w in str(info.value) for w in words), str(info.value)
