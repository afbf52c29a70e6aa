"""Integer convolution: int8 (and every other integer dtype lax convolves) against an exact
numpy int64 reference, on the CPU and the GPU.

lax's rules, matched here: both operands of one integer dtype; the result is the input dtype,
or an integer `preferred_element_type` at least as wide (signed for signed inputs; int64
becomes int32 without jax_enable_x64), holding the exact sum modulo 2^bits (two's complement
wrap), or a float dtype, to which lax converts the operands. Integer inputs have float0 tangents and
cotangents. Only the direct algorithms run integer problems; every other one says why.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn
from jaxdnn.ops.conv import ConvSpec, _bind

from util import PLATFORMS, assert_close, by_base, error_growth, needs_cuda_module, on

NHWC = ("NHWC", "HWIO", "NHWC")


@pytest.fixture(autouse=True)
def _lax_on_the_cpu():
    """lax's own integer convolutions (the second reference, beside numpy's) run on the CPU:
    XLA:GPU implements few of them (UNIMPLEMENTED for most of these cases on an H100, jax
    0.11.2). jaxdnn's calls place their operands on the tested platform with on()."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _ref(x, w, *, strides, padding, lhs_dilation=(1, 1), rhs_dilation=(1, 1), groups=1,
         batch_groups=1):
    """Exact 2-D NHWC/HWIO convolution in numpy int64 (wrapping modulo 2^64 like the C types,
    so the low 32 bits of int32 sums stay exact)."""
    x, w = np.asarray(x).astype(np.int64), np.asarray(w).astype(np.int64)
    n, h, wd, c = x.shape
    if batch_groups > 1:  # batch group i -> feature group i, as XLA defines it
        x = x.reshape(batch_groups, n // batch_groups, h, wd, c).transpose(1, 2, 3, 0, 4)
        x = x.reshape(n // batch_groups, h, wd, batch_groups * c)
        n, c, groups = n // batch_groups, batch_groups * c, batch_groups
    ld = lhs_dilation
    xd = np.zeros((n, (h - 1) * ld[0] + 1, (wd - 1) * ld[1] + 1, c), np.int64)
    xd[:, ::ld[0], ::ld[1]] = x
    (plo, phi), (qlo, qhi) = padding
    xd = np.pad(xd, ((0, 0), (max(plo, 0), max(phi, 0)), (max(qlo, 0), max(qhi, 0)), (0, 0)))
    xd = xd[:, max(-plo, 0):xd.shape[1] - max(-phi, 0), max(-qlo, 0):xd.shape[2] - max(-qhi, 0)]
    r, s, cg, k = w.shape
    er, es = (r - 1) * rhs_dilation[0] + 1, (s - 1) * rhs_dilation[1] + 1
    p = (xd.shape[1] - er) // strides[0] + 1
    q = (xd.shape[2] - es) // strides[1] + 1
    kg = k // groups
    y = np.zeros((n, p, q, k), np.int64)
    for i in range(r):
        for j in range(s):
            a, b = i * rhs_dilation[0], j * rhs_dilation[1]
            win = xd[:, a:a + (p - 1) * strides[0] + 1:strides[0],
                     b:b + (q - 1) * strides[1] + 1:strides[1]]
            for g in range(groups):
                y[..., g * kg:(g + 1) * kg] += np.einsum(
                    "npqc,ck->npqk", win[..., g * cg:(g + 1) * cg], w[i, j, :, g * kg:(g + 1) * kg])
    return y


def _randint(rng, shape, dtype):
    """Values over the whole range of `dtype`, its extremes included."""
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, shape, dtype=np.dtype(dtype), endpoint=True)
    a.flat[0], a.flat[-1] = info.min, info.max
    return a


CASES = {
    "pad_stride": dict(window_strides=(2, 1), padding=((1, 2), (0, 1))),
    "same": dict(window_strides=(1, 1), padding="SAME"),
    "rhs_dilation": dict(window_strides=(1, 2), padding=((2, 2), (1, 1)), rhs_dilation=(2, 1)),
    "lhs_dilation": dict(window_strides=(1, 1), padding=((1, 1), (2, 0)), lhs_dilation=(2, 3)),
    "negative_pad": dict(window_strides=(1, 1), padding=((-1, 1), (0, -2))),
    "groups": dict(window_strides=(1, 1), padding=((1, 1), (1, 1)), feature_group_count=2),
    "depthwise": dict(window_strides=(2, 2), padding=((1, 1), (1, 1)), feature_group_count=4),
    "batch_groups": dict(window_strides=(1, 1), padding=((0, 0), (1, 1)), batch_group_count=2),
}


def _case_shapes(kw):
    g, bg = kw.get("feature_group_count", 1), kw.get("batch_group_count", 1)
    return (2 * bg, 7, 6, 4), (3, 3, 4 // g, 4 * bg)


def _ref_kw(kw, x_shape, w_shape):
    padding = kw["padding"]
    if padding == "SAME":
        padding = lax.padtype_to_pads(x_shape[1:3], w_shape[:2], kw["window_strides"], "SAME")
    return dict(strides=kw["window_strides"], padding=padding,
                lhs_dilation=kw.get("lhs_dilation", (1, 1)),
                rhs_dilation=kw.get("rhs_dilation", (1, 1)),
                groups=kw.get("feature_group_count", 1),
                batch_groups=kw.get("batch_group_count", 1))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("preferred", [None, jnp.int32, jnp.int16], ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_int8_conv_general_dilated(case, preferred, platform):
    kw = CASES[case]
    x_shape, w_shape = _case_shapes(kw)
    rng = np.random.default_rng(len(case))
    x, w = _randint(rng, x_shape, np.int8), _randint(rng, w_shape, np.int8)
    f = jax.jit(partial(jaxdnn.conv_general_dilated, **kw, dimension_numbers=NHWC,
                        preferred_element_type=preferred))
    y = f(*on(platform, x, w))
    out = np.dtype(preferred or np.int8)
    assert y.dtype == out
    np.testing.assert_array_equal(np.asarray(y), _ref(x, w, **_ref_kw(kw, x_shape, w_shape))
                                  .astype(out))
    want = lax.conv_general_dilated(x, w, **kw, dimension_numbers=NHWC,
                                    preferred_element_type=preferred)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("layout", ["NWC", "NCHW", "NDHWC"])
def test_int8_conv_layouts(layout, platform):
    """jaxdnn.conv in 1-D, channels-first 2-D and 3-D, int8 -> int32, against lax (whose
    integer sums on the CPU the 2-D tests hold to the numpy reference)."""
    nd = len(layout) - 2
    rng = np.random.default_rng(nd)
    spatial = (5, 6, 4)[:nd]
    x_shape = (2, 3, *spatial) if layout[1] == "C" else (2, *spatial, 3)
    w_shape = (4, 3, *(2,) * nd) if layout[1] == "C" else (*(2,) * nd, 3, 4)
    x, w = _randint(rng, x_shape, np.int8), _randint(rng, w_shape, np.int8)
    y = jax.jit(partial(jaxdnn.conv, stride=2, padding=1, dilation=1, layout=layout,
                        preferred_element_type=jnp.int32))(*on(platform, x, w))
    rhs = "OI" + layout[2:] if layout[1] == "C" else layout[1:-1] + "IO"
    want = lax.conv_general_dilated(x, w, (2,) * nd, [(1, 1)] * nd,
                                    dimension_numbers=(layout, rhs, layout),
                                    preferred_element_type=jnp.int32)
    assert y.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_int8_products_and_sums_overflow(platform):
    """-128 * -128 = 16384 needs more than 8 bits, a 3x3x64 sum of them more than 16, and a
    1x1 sum over 140000 channels more than 31: int32 wraps it, as lax does."""
    x = np.full((1, 4, 4, 64), -128, np.int8)
    w = np.full((3, 3, 64, 2), -128, np.int8)
    y = jaxdnn.conv(*on(platform, x, w), padding="VALID", preferred_element_type=jnp.int32)
    np.testing.assert_array_equal(np.asarray(y), np.full((1, 2, 2, 2), 9 * 64 * 16384))
    c = 140000
    x = np.full((1, 1, 1, c), -128, np.int8)
    w = np.full((1, 1, c, 1), -128, np.int8)
    y = jaxdnn.conv(*on(platform, x, w), preferred_element_type=jnp.int32)
    want = np.int64(c * 16384).astype(np.int32)  # 2293760000 wraps to -2001207296
    assert int(y[0, 0, 0, 0]) == int(want) == -2001207296
    lax_y = lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=NHWC,
                                     preferred_element_type=jnp.int32)
    assert int(y[0, 0, 0, 0]) == int(lax_y[0, 0, 0, 0])
    y8 = jaxdnn.conv(*on(platform, x[..., :3], w[..., :3, :]))  # 3 * 16384 = 49152: low byte 0
    assert y8.dtype == jnp.int8 and int(y8[0, 0, 0, 0]) == 0


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype, preferred", [
    (np.int16, None), (np.int16, np.int32), (np.int16, np.int64), (np.int32, None),
    (np.int64, None), (np.int8, np.int64), (np.uint8, None), (np.uint8, np.uint16),
    (np.uint8, np.int32), (np.uint8, np.int8), (np.uint16, np.uint32), (np.uint32, None),
    (np.uint64, None), (np.uint32, np.int32),
], ids=str)
def test_other_integer_dtypes(dtype, preferred, platform):
    """Every integer dtype lax convolves: exact sums modulo 2^bits of the result."""
    kw = CASES["pad_stride"]
    rng = np.random.default_rng(3)
    x, w = _randint(rng, (2, 6, 5, 3), dtype), _randint(rng, (3, 2, 3, 4), dtype)
    y = jaxdnn.conv_general_dilated(*on(platform, x, w), **kw, dimension_numbers=NHWC,
                                    preferred_element_type=preferred)
    out = np.dtype(preferred or dtype)
    assert y.dtype == out
    # Exact modulo 2^64 in int64 (numpy's casts wrap uint64), so modulo 2^bits of `out`.
    want = _ref(x, w, **_ref_kw(kw, x.shape, w.shape)).astype(out)
    np.testing.assert_array_equal(np.asarray(y), want)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(lax.conv_general_dilated(
        x, w, **kw, dimension_numbers=NHWC, preferred_element_type=preferred)))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype, preferred", [
    (np.int8, jnp.float32), (np.int8, jnp.bfloat16), (np.int8, jnp.float16),
    (np.int16, jnp.bfloat16), (np.uint8, jnp.float32), (np.int32, jnp.float64),
], ids=str)
def test_integer_inputs_float_result(dtype, preferred, platform):
    """lax converts integer operands to a float preferred_element_type (int16 -> bfloat16
    rounds them) and convolves in it."""
    rng = np.random.default_rng(4)
    x, w = _randint(rng, (2, 5, 5, 3), dtype) // 4, _randint(rng, (3, 3, 3, 2), dtype) // 4
    kw = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC)
    f = partial(jaxdnn.conv_general_dilated, **kw, preferred_element_type=preferred)
    y = f(*on(platform, x, w))
    assert y.dtype == preferred
    # The reference: the operands rounded as lax rounds them, convolved in float64. The result
    # is an integer sum, but the algorithm that runs need not sum exactly (a Winograd
    # transform's coefficients are fractions), so it meets the float result's bound, widened
    # by the chosen algorithm's known error growth.
    x64, w64 = (np.asarray(jnp.asarray(a, preferred), np.float64) for a in (x, w))
    with jax.default_device(jax.devices("cpu")[0]):
        want = lax.conv_general_dilated(x64, w64, **kw)
        scale = np.sqrt(lax.conv_general_dilated(x64 ** 2, w64 ** 2, **kw))
    growth = max(error_growth(e.algo, preferred)
                 for e in jaxdnn.explain(f, x, w, platform=platform))
    assert_close(y, want, preferred, scale=scale, k=w.size // w.shape[-1], growth=growth)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("out", [np.int8, np.int32])
def test_int8_directions(out, platform):
    """All three primitives run int8 operands with an int32 or wrapping int8 result; the
    reference is lax's float64 vjp (exact for these sums) reduced modulo 2^bits."""
    spec = ConvSpec(lhs_shape=(2, 1, 7, 6, 4), rhs_shape=(1, 3, 2, 2, 6), stride=(1, 2, 1),
                    padding=((0, 0), (1, 2), (0, 1)), lhs_dilation=(1, 1, 2),
                    rhs_dilation=(1, 1, 2), groups=2)
    rng = np.random.default_rng(5)
    x = _randint(rng, spec.lhs_shape, np.int8)
    w = _randint(rng, spec.rhs_shape, np.int8)
    dy = _randint(rng, spec.out_shape, np.int8)
    f = partial(lax.conv_general_dilated, window_strides=spec.stride, padding=spec.padding,
                lhs_dilation=spec.lhs_dilation, rhs_dilation=spec.rhs_dilation,
                dimension_numbers=("NDHWC", "DHWIO", "NDHWC"), feature_group_count=2)
    y64, vjp = jax.vjp(f, *(np.asarray(a, np.float64) for a in (x, w)))
    dx64, dw64 = vjp(np.asarray(dy, np.float64))
    kw = dict(spec=spec, algo=("direct",) * 3, out_dtype=out, policy=(False, False, -1))
    for direction, a, b, want in [("fwd", x, w, y64), ("bwd_data", dy, w, dx64),
                                  ("bwd_filter", x, dy, dw64)]:
        got = jax.jit(partial(_bind, direction, **kw))(*on(platform, a, b))
        assert got.dtype == out, direction
        np.testing.assert_array_equal(np.asarray(got),
                                      np.asarray(want).astype(np.int64).astype(out), direction)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_int8_conv_transpose(platform):
    """conv_transpose runs the backward-data kernels: int8 in, int32 out, exact."""
    rng = np.random.default_rng(6)
    x, w = _randint(rng, (2, 4, 5, 6), np.int8), _randint(rng, (3, 3, 2, 6), np.int8)
    kw = dict(stride=2, padding=1, output_padding=1)
    y = jaxdnn.conv_transpose(*on(platform, x, w), **kw, preferred_element_type=jnp.int32)
    want = jaxdnn.conv_transpose(np.asarray(x, np.float64), np.asarray(w, np.float64), **kw)
    assert y.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want).astype(np.int32))


def test_int8_autodiff_and_vmap_like_lax():
    """Integer operands have float0 cotangents and tangents, and grad refuses them, as in lax;
    vmap folds the batch like any convolution."""
    x = jnp.ones((1, 4, 4, 2), jnp.int8)
    w = jnp.ones((3, 3, 2, 2), jnp.int8)
    ours = partial(jaxdnn.conv, padding=1, preferred_element_type=jnp.int32)
    ref = partial(lax.conv_general_dilated, window_strides=(1, 1), padding=((1, 1), (1, 1)),
                  dimension_numbers=NHWC, preferred_element_type=jnp.int32)
    for f in (ours, ref):
        y, vjp = jax.vjp(f, x, w)
        cts = vjp(np.zeros(y.shape, jax.dtypes.float0))
        assert [(c.dtype, c.shape) for c in cts] == [(jax.dtypes.float0, x.shape),
                                                     (jax.dtypes.float0, w.shape)]
        _, t = jax.jvp(f, (x, w), (np.zeros(x.shape, jax.dtypes.float0),
                                   np.zeros(w.shape, jax.dtypes.float0)))
        assert t.dtype == jax.dtypes.float0 and t.shape == y.shape
        with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
            jax.grad(lambda x: f(x, w).sum().astype(jnp.float32))(x)
    xs = jnp.stack([x, -x, 2 * x])
    np.testing.assert_array_equal(jax.vmap(lambda x: ours(x, w))(xs),
                                  jnp.stack([ref(xi, w) for xi in xs]))


def _int8_problem():
    return jaxdnn.conv_problem(jax.ShapeDtypeStruct((2, 8, 8, 16), jnp.int8),
                               jax.ShapeDtypeStruct((3, 3, 16, 16), jnp.int8), padding=1,
                               preferred_element_type=jnp.int32)


def _assert_direct_only(infos):
    bases = by_base(infos)
    assert bases["direct"].supported and bases["direct"].rank == 0
    others = [a for a in infos if a.base != "direct"]
    assert others
    for a in others:
        assert not a.supported and a.reason == "integer inputs: direct only", (a.name, a.reason)


def test_int8_listing_cpu():
    problem = _int8_problem()
    assert (problem.dtype, problem.out_dtype) == (np.int8, np.int32)
    _assert_direct_only(jaxdnn.conv_algorithms(problem, "cpu"))
    (found_direct,) = [r for r in jaxdnn.find_conv_algorithms(problem, "cpu", repeats=1) if r.ok]
    assert found_direct.name == "direct" and found_direct.error == 0


@needs_cuda_module
def test_int8_listing_cuda():
    _assert_direct_only(jaxdnn.conv_algorithms(_int8_problem(), "cuda"))


def test_int8_explain_and_forced_algorithm():
    x = jnp.ones((2, 8, 8, 16), jnp.int8)
    w = jnp.ones((3, 3, 16, 16), jnp.int8)
    report = str(jaxdnn.explain(partial(jaxdnn.conv, padding=1), x, w))
    assert "direct" in report and "int8->int8" in report
    with pytest.raises(ValueError, match="integer inputs: direct only"):
        jax.jit(partial(jaxdnn.conv, padding=1, algo="im2col_gemm")).lower(x, w)


@pytest.mark.parametrize("dx, dw, preferred, match", [
    (jnp.int8, jnp.float32, None, "same dtype"),
    (jnp.float32, jnp.int8, None, "same dtype"),
    (jnp.int8, jnp.int16, None, "same dtype"),
    (jnp.float32, jnp.float32, jnp.int32, "`preferred_element_type` int32 does not suit"),
    (jnp.int8, jnp.int8, jnp.uint32, "`preferred_element_type` uint32 must be signed"),
    (jnp.int16, jnp.int16, jnp.uint16, "must be signed"),
    (jnp.int32, jnp.int32, jnp.int8, "narrower"),
    (jnp.int32, jnp.int32, jnp.float16, "narrower"),
    (jnp.int8, jnp.int8, jnp.complex64, "`preferred_element_type` complex64 does not suit"),
    (jnp.int8, jnp.int8, jnp.bool_, "`preferred_element_type` bool does not suit"),
], ids=str)
def test_bad_integer_combinations(dx, dw, preferred, match):
    """What lax refuses raises a TypeError naming the argument."""
    x = jax.ShapeDtypeStruct((2, 8, 8, 4), dx)
    w = jax.ShapeDtypeStruct((3, 3, 4, 6), dw)
    with pytest.raises(TypeError):
        jax.eval_shape(partial(lax.conv_general_dilated, window_strides=(1, 1), padding="SAME",
                               dimension_numbers=NHWC, preferred_element_type=preferred), x, w)
    with pytest.raises(TypeError, match=match):
        jax.eval_shape(partial(jaxdnn.conv, preferred_element_type=preferred), x, w)


def test_bool_operands_refused():
    """lax's boolean convolution (an OR of ANDs) is not offered: a TypeError names `x`."""
    x = jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.bool_)
    w = jax.ShapeDtypeStruct((3, 3, 4, 6), jnp.bool_)
    with pytest.raises(TypeError, match="`x` has dtype bool"):
        jax.eval_shape(jaxdnn.conv, x, w)
