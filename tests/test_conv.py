"""Convolution: every registered algorithm, direction and dtype against jax.lax in float64.

The grid covers 1-D/2-D/3-D, stride, asymmetric/oversized/negative padding, SAME/VALID, lhs and
rhs dilation, feature groups (depthwise too), batch groups, empty spatial dims, even and
non-square kernels, and mixed layouts. Each case runs forward, backward-data and
backward-filter in one jitted vjp, on every algorithm of the platform's registry that supports
it, so adding an algorithm adds its tests.
"""

from __future__ import annotations

import zlib
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jaxdnn

from problems import CORRECTNESS_GRID, NHWC, channels_last
from util import (DTYPES, PLATFORMS, assert_close, by_base, device, error_growth,
                  needs_cuda_module, on, rand, rel_l2)


def _registered(platform):
    """Base names of the conv algorithms registered for a test platform."""
    device(platform)  # skips (or fails, under JAXDNN_REQUIRE_GPU=1) without a usable GPU
    probe = jaxdnn.conv_problem(jax.ShapeDtypeStruct((1, 4, 4, 1), jnp.float32),
                                jax.ShapeDtypeStruct((1, 1, 1, 1), jnp.float32))
    return list(by_base(jaxdnn.conv_algorithms(probe, {"gpu": "cuda"}.get(platform, platform))))


def _ref_all(case, x, w, ct, preferred=None):
    """(y, dx, dw) from jax.lax in float64 on the CPU."""
    cpu = jax.devices("cpu")[0]
    x64, w64, ct64 = (jax.device_put(np.asarray(a, np.float64), cpu) for a in (x, w, ct))
    f = partial(lax.conv_general_dilated, **case.kw)
    y, vjp = jax.vjp(f, x64, w64)
    dx, dw = vjp(ct64)
    return y, dx, dw


def _ours_all(case, x, w, ct, algo, preferred=None):
    # HIGHEST: float32 within the float32 tolerance (tensor-core algorithms would use TF32).
    f = partial(jaxdnn.conv_general_dilated, **case.kw, algo=algo,
                preferred_element_type=preferred, precision="highest")

    @jax.jit
    def run(x, w, ct):
        y, vjp = jax.vjp(f, x, w)
        return (y, *vjp(ct.astype(y.dtype)))

    return run(x, w, ct)


def _problem_supported(case, dtype, algo, platform, y_shape):
    """Whether `algo` supports all three directions of the case."""
    def f(x, w, ct):
        return jax.vjp(partial(jaxdnn.conv_general_dilated, **case.kw), x, w)[1](ct)

    probs = jaxdnn.conv_problems(f, *(jax.ShapeDtypeStruct(s, dtype)
                                      for s in (case.x_shape, case.w_shape, y_shape)))
    plat = {"gpu": "cuda"}.get(platform, platform)
    return all(by_base(jaxdnn.conv_algorithms(p, plat))[algo].supported
               for p in probs)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CORRECTNESS_GRID, ids=str)
def test_conv_all_algorithms_match_lax(case, dtype, platform):
    device(platform)
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    x = rand(rng, case.x_shape, dtype)
    w = rand(rng, case.w_shape, dtype)
    y_shape = jax.eval_shape(partial(lax.conv_general_dilated, **case.kw),
                             jax.ShapeDtypeStruct(x.shape, jnp.float64),
                             jax.ShapeDtypeStruct(w.shape, jnp.float64)).shape
    ct = rand(rng, y_shape, dtype)
    refs = _ref_all(case, x, w, ct)
    ran = 0
    for algo in _registered(platform):
        if not _problem_supported(case, dtype, algo, platform, y_shape):
            continue
        outs = _ours_all(case, *on(platform, x, w, ct), algo)
        for name, out, ref in zip(("y", "dx", "dw"), outs, refs):
            assert out.dtype == np.dtype(dtype)
            assert_close(out, ref, dtype, what=f"{algo} {name}", growth=error_growth(algo, dtype))
        ran += 1
    assert ran >= 1, "no algorithm supports this case"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=lambda d: np.dtype(d).name)
def test_preferred_element_type_float32(dtype, platform):
    """16-bit inputs with a float32 result accumulate and store in float32."""
    case = CORRECTNESS_GRID[1]
    rng = np.random.default_rng(7)
    x, w = rand(rng, case.x_shape, dtype), rand(rng, case.w_shape, dtype)
    y = jax.jit(partial(jaxdnn.conv_general_dilated, **case.kw,
                        preferred_element_type=jnp.float32))(*on(platform, x, w))
    assert y.dtype == jnp.float32
    ref = _ref_all(case, x, w, np.ones(y.shape))[0]
    assert_close(y, ref, jnp.float32)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_mixed_precision_gradient_is_as_accurate_as_lax(platform):
    """bfloat16 operands with a float32 result: the float32 cotangent is not rounded to
    bfloat16 before the backward kernels, so dx and dw (bfloat16) err against float64 no more
    than lax's, which computes the transposes in float32."""
    rng = np.random.default_rng(11)
    x = rand(rng, (4, 12, 12, 16), jnp.bfloat16)
    w = rand(rng, (3, 3, 16, 24), jnp.bfloat16)
    ct = rand(rng, (4, 6, 6, 24), jnp.float32)
    kw = dict(window_strides=(2, 2), padding="SAME", dimension_numbers=NHWC)

    def grads(conv, x, w, ct, preferred):
        y, vjp = jax.vjp(partial(conv, **kw, preferred_element_type=preferred), x, w)
        return vjp(ct.astype(y.dtype))

    cpu = jax.devices("cpu")[0]
    ref = grads(lax.conv_general_dilated, *(jax.device_put(np.asarray(a, np.float64), cpu)
                                             for a in (x, w, ct)), None)
    args = on(platform, x, w, ct)
    ours = jax.jit(partial(grads, jaxdnn.conv_general_dilated, preferred=jnp.float32))(*args)
    theirs = jax.jit(partial(grads, lax.conv_general_dilated, preferred=jnp.float32))(*args)
    for name, o, t, r in zip(("dx", "dw"), ours, theirs, ref):
        assert o.dtype == jnp.bfloat16, (name, o.dtype)
        err, lax_err = rel_l2(o, r), rel_l2(t, r)
        assert err <= 1.1 * lax_err, f"{name}: relative L2 error {err:.3e}, lax {lax_err:.3e}"
        assert_close(o, r, jnp.bfloat16, k=9 * 24 if name == "dx" else 4 * 6 * 6, what=name)


def test_preferred_element_type_float64_from_float32():
    case = CORRECTNESS_GRID[0]
    rng = np.random.default_rng(8)
    x, w = rand(rng, case.x_shape, jnp.float32), rand(rng, case.w_shape, jnp.float32)
    y = jaxdnn.conv_general_dilated(x, w, **case.kw, preferred_element_type=jnp.float64)
    assert y.dtype == jnp.float64
    assert_close(y, _ref_all(case, x, w, np.ones(y.shape))[0], jnp.float64)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_deterministic_algorithms_are_bitwise_reproducible(platform):
    case = CORRECTNESS_GRID[-1]
    rng = np.random.default_rng(3)
    x, w = rand(rng, case.x_shape), rand(rng, case.w_shape)
    ct = rand(rng, (2, 6, 6, 40))
    for algo in _registered(platform):
        if not _problem_supported(case, jnp.float32, algo, platform, ct.shape):
            continue
        outs1 = _ours_all(case, *on(platform, x, w, ct), algo)
        outs2 = _ours_all(case, *on(platform, x, w, ct), algo)
        infos = by_base(jaxdnn.conv_algorithms(
            jaxdnn.conv_problem(x, w, padding="SAME"), {"gpu": "cuda"}.get(platform, platform)))
        if infos[algo].deterministic:
            for a, b in zip(outs1, outs2):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---- the jaxdnn.conv and conv_transpose front ends --------------------------------------------

@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_conv_front_end(layout):
    rng = np.random.default_rng(11)
    x = rand(rng, (2, 9, 8, 6) if layout == "NHWC" else (2, 6, 9, 8), jnp.float64)
    w = rand(rng, (3, 2, 3, 4) if layout == "NHWC" else (4, 3, 3, 2), jnp.float64)
    y = jaxdnn.conv(x, w, stride=(2, 1), padding=((1, 0), (2, 1)), dilation=(1, 2), groups=2,
                    layout=layout)
    rhs = "HWIO" if layout == "NHWC" else "OIHW"
    ref = lax.conv_general_dilated(x, w, (2, 1), ((1, 0), (2, 1)), rhs_dilation=(1, 2),
                                   feature_group_count=2,
                                   dimension_numbers=(layout, rhs, layout))
    assert_close(y, ref, jnp.float64)


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_conv_default_layout_by_rank(nd):
    rng = np.random.default_rng(nd)
    x = rand(rng, (2, *[7] * nd, 3), jnp.float64)
    w = rand(rng, (*[3] * nd, 3, 5), jnp.float64)
    y = jaxdnn.conv(x, w, padding="SAME")
    ref = lax.conv_general_dilated(x, w, (1,) * nd, "SAME", dimension_numbers=channels_last(nd))
    assert_close(y, ref, jnp.float64)


@pytest.mark.parametrize("kw", [
    dict(stride=2, padding=1),
    dict(stride=(2, 3), padding=((1, 0), (0, 2)), output_padding=(1, 2)),
    dict(stride=1, padding="SAME"),
    dict(stride=2, padding="SAME"),
    dict(stride=3, padding="VALID", dilation=2),
    dict(stride=2, padding=0, groups=2),
], ids=str)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_conv_transpose_is_the_input_gradient(kw, platform):
    """conv_transpose(dy, w) == vjp of lax conv w.r.t. its input, for the implied input size."""
    rng = np.random.default_rng(5)
    groups = kw.get("groups", 1)
    x_in = rand(rng, (2, 5, 4, 6), jnp.float64)  # the conv_transpose input (dy-like)
    w = rand(rng, (3, 2, 4 // groups * 1, 6), jnp.float64)  # forward filter: I=4/g, O=6
    y = jax.jit(partial(jaxdnn.conv_transpose, **kw))(*on(platform, x_in, w))
    stride = kw["stride"] if isinstance(kw["stride"], tuple) else (kw["stride"],) * 2
    dil = kw.get("dilation", 1)
    dil = dil if isinstance(dil, tuple) else (dil,) * 2
    # Forward conv from y's spatial size back to x_in's: its input gradient must be y.
    pad = kw["padding"]
    out_sp = y.shape[1:3]
    if isinstance(pad, str):
        fwd_pad = pad if pad == "VALID" else None
    else:
        fwd_pad = [(pad, pad)] * 2 if isinstance(pad, int) else list(pad)
    if fwd_pad is None:  # SAME transpose: the forward conv with SAME padding on the output
        fwd_pad = lax.padtype_to_pads(out_sp, [(k - 1) * d + 1 for k, d in zip((3, 2), dil)],
                                      stride, "SAME")
    f = partial(lax.conv_general_dilated, window_strides=stride, padding=fwd_pad,
                rhs_dilation=dil, feature_group_count=groups, dimension_numbers=NHWC)
    xs = jax.ShapeDtypeStruct((2, *out_sp, 4), jnp.float64)
    out_shape = jax.eval_shape(f, xs, jax.ShapeDtypeStruct(w.shape, jnp.float64)).shape
    assert out_shape == x_in.shape
    _, vjp = jax.vjp(lambda a: f(a, w), jnp.zeros(xs.shape, jnp.float64))
    (ref,) = vjp(x_in)
    assert_close(y, ref, jnp.float64)


# lax-form transposed convolutions (input dilation, window stride 1): (x shape, w shape,
# keywords of lax.conv_general_dilated), channels-last. The last two keep the forward kernel:
# padding beyond (F-1) d, and a window stride besides the dilation.
LAX_TRANSPOSED = [
    ((2, 5, 4, 6), (4, 4, 6, 3), dict(padding=((2, 2), (2, 2)), lhs_dilation=(2, 2))),
    ((2, 5, 4, 6), (3, 3, 6, 4), dict(padding=((1, 2), (0, 1)), lhs_dilation=(2, 3))),
    ((2, 4, 5, 6), (3, 3, 3, 4), dict(padding=((2, 2), (4, 3)), lhs_dilation=(2, 1),
                                      rhs_dilation=(1, 2), feature_group_count=2)),
    ((1, 3, 3, 4, 4), (2, 2, 2, 4, 2), dict(padding=((1, 1),) * 3, lhs_dilation=(2, 2, 2))),
    ((3, 7, 4), (3, 4, 5), dict(padding=((2, 1),), lhs_dilation=(3,))),
    ((2, 5, 4, 6), (3, 3, 6, 4), dict(padding=((3, 1), (1, 1)), lhs_dilation=(2, 2))),
    ((2, 5, 4, 6), (3, 3, 6, 4), dict(padding=((1, 1), (1, 1)), lhs_dilation=(2, 2),
                                      window_strides=(2, 1))),
]


@pytest.mark.parametrize("case", range(len(LAX_TRANSPOSED)))
@pytest.mark.parametrize("platform", PLATFORMS)
def test_lax_transposed_runs_as_data_gradient(case, platform):
    """conv_general_dilated with input dilation and window stride 1 (lax.conv_transpose's form,
    what flax's ConvTranspose calls) runs the strided convolution's data-gradient kernel, its
    gradients that convolution's forward and filter-gradient kernels; the value and both
    gradients match lax's in float64; a pinned algorithm names the kernel by what it computes.
    With padding beyond (F-1) d or a window stride, the forward kernel runs the problem as
    given."""
    x_shape, w_shape, kw = LAX_TRANSPOSED[case]
    nd = len(x_shape) - 2
    kw = dict(kw, window_strides=kw.get("window_strides", (1,) * nd),
              dimension_numbers=channels_last(nd))
    rewritten = case < len(LAX_TRANSPOSED) - 2
    rng = np.random.default_rng(40 + case)
    x, w = rand(rng, x_shape, jnp.float64), rand(rng, w_shape, jnp.float64)
    f = partial(jaxdnn.conv_general_dilated, **kw)
    ref_f = partial(lax.conv_general_dilated, **kw)
    y_ref, back_ref = jax.vjp(ref_f, x, w)
    ct = rand(rng, y_ref.shape, jnp.float64)
    k = int(np.prod(w_shape[:-1]))
    y, back = jax.vjp(jax.jit(f), *on(platform, x, w))
    assert_close(y, y_ref, jnp.float64, k=k, what="y")
    for name, g, r in zip(("dx", "dw"), back(on(platform, ct)), back_ref(ct)):
        assert_close(g, r, jnp.float64, k=k, what=name)
    text = jax.jit(f).lower(x, w).as_text()
    assert ("jaxdnn_conv_bwd_data" in text) == rewritten
    assert ("jaxdnn_conv_fwd" in text) == (not rewritten)
    if rewritten:
        loss = lambda x, w: jnp.sum(f(x, w) * ct)  # noqa: E731
        grad = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).as_text()
        assert "jaxdnn_conv_fwd" in grad and "jaxdnn_conv_bwd_filter" in grad
        row, = jaxdnn.explain(jax.jit(f), x, w, platform="cpu")
        assert row.direction == "bwd_data" and row.problem.spec.lhs_dilation == (1, 1, 1)
        pinned = partial(f, algo={"fwd": "direct", "bwd_data": "im2col_gemm"})
        row, = jaxdnn.explain(jax.jit(pinned), x, w, platform="cpu")
        assert row.direction == "bwd_data" and row.algo == "direct"
        rows = jaxdnn.explain(jax.jit(jax.grad(lambda x, w: jnp.sum(pinned(x, w) * ct))), x, w,
                              platform="cpu")
        assert {(e.direction, e.algo.split(".")[0]) for e in rows} >= {("fwd", "im2col_gemm")}
        assert_close(jax.jit(pinned)(x, w), y_ref, jnp.float64, k=k, what="pinned y")


def test_conv_transpose_grad():
    rng = np.random.default_rng(6)
    x, w = rand(rng, (1, 4, 3, 3), jnp.float64), rand(rng, (3, 3, 2, 3), jnp.float64)
    check_grads(lambda x, w: jaxdnn.conv_transpose(x, w, stride=2, padding=1, output_padding=1),
                (x, w), order=2, modes=("fwd", "rev"))


# ---- transformations -----------------------------------------------------------------------------

GRAD_CASES = [c for c in CORRECTNESS_GRID if c.name in
              ("2d_stride_asym_pad", "2d_lhs_dilation", "2d_groups", "2d_batch_groups",
               "1d", "3d_dilated_groups", "2d_mixed_layouts")]


@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_check_grads_second_order(case):
    rng = np.random.default_rng(21)
    x, w = rand(rng, case.x_shape, jnp.float64), rand(rng, case.w_shape, jnp.float64)
    check_grads(partial(jaxdnn.conv_general_dilated, **case.kw), (x, w), order=2,
                modes=("fwd", "rev"))


def test_jacfwd_hessian_match_lax():
    rng = np.random.default_rng(22)
    case = CORRECTNESS_GRID[1]
    x, w = rand(rng, (1, 5, 4, 3), jnp.float64), rand(rng, case.w_shape, jnp.float64)
    ours = lambda x, w: jnp.sum(jnp.tanh(jaxdnn.conv_general_dilated(x, w, **case.kw)))
    ref = lambda x, w: jnp.sum(jnp.tanh(lax.conv_general_dilated(x, w, **case.kw)))
    assert_close(jax.jacfwd(ours, 1)(x, w), jax.jacfwd(ref, 1)(x, w), jnp.float64)
    # The Hessian sums tanh''(y_o) x_{o,a} x_{o,b} over the outputs o, terms of both signs, and
    # y_o carries its own rounding, ~eps * conv(|x|, |w|)_o, which moves tanh'' by up to twice
    # that (|tanh'''| <= 2): its scale is the sum of (|tanh''(y_o)| + 2 conv(|x|, |w|)_o)
    # |x_{o,a}| |x_{o,b}|, through the patch matrix of |x| (the Jacobian of conv(|x|, w) in w).
    y = lax.conv_general_dilated(x, w, **case.kw)
    y_abs = lax.conv_general_dilated(np.abs(x), np.abs(w), **case.kw)
    d2 = (np.abs(2 * np.tanh(y) * (1 - np.tanh(y) ** 2)) + 2 * y_abs).reshape(-1)
    patches = np.asarray(jax.jacfwd(lambda w: lax.conv_general_dilated(np.abs(x), w, **case.kw))(
        w)).reshape(d2.size, w.size)
    h_abs = (patches.T @ (d2[:, None] * patches)).reshape(w.shape * 2)
    assert_close(jax.hessian(ours, 1)(x, w), jax.hessian(ref, 1)(x, w), jnp.float64,
                 scale=h_abs, k=d2.size)
    t = rand(rng, w.shape, jnp.float64)
    assert_close(jax.jvp(lambda w: ours(x, w), (w,), (t,))[1],
                 jax.jvp(lambda w: ref(x, w), (w,), (t,))[1], jnp.float64)


VMAP_AXES = [(0, None), (None, 0), (0, 0), (2, 4), (None, 1)]


@pytest.mark.parametrize("in_axes", VMAP_AXES, ids=str)
@pytest.mark.parametrize("case", [CORRECTNESS_GRID[i] for i in (1, 7, 10)], ids=str)
def test_vmap_and_vmap_grad(case, in_axes):
    rng = np.random.default_rng(31)
    b = 3

    def batched(shape, ax):
        a = rand(rng, (b, *shape), jnp.float64)
        return a[0] if ax is None else jnp.moveaxis(a, 0, ax)

    x, w = batched(case.x_shape, in_axes[0]), batched(case.w_shape, in_axes[1])
    ours = partial(jaxdnn.conv_general_dilated, **case.kw)
    ref = partial(lax.conv_general_dilated, **case.kw)
    assert_close(jax.vmap(ours, in_axes)(x, w), jax.vmap(ref, in_axes)(x, w), jnp.float64)
    loss = lambda f: (lambda x, w: jnp.sum(jnp.sin(f(x, w))))
    for argnum in (0, 1):
        g_ours = jax.vmap(jax.grad(loss(ours), argnum), in_axes)(x, w)
        g_ref = jax.vmap(jax.grad(loss(ref), argnum), in_axes)(x, w)
        assert_close(g_ours, g_ref, jnp.float64, what=f"vmap(grad) arg {argnum}")


def test_vmap_never_loops():
    """Batching folds the mapped axis into the problem: one custom call per direction."""
    x = jnp.ones((4, 2, 6, 6, 3))
    w = jnp.ones((4, 3, 3, 3, 5))
    f = jax.vmap(jax.grad(lambda x, w: jnp.sum(jaxdnn.conv(x, w, padding=1)), (0, 1)))
    text = jax.jit(f).lower(x, w).as_text()
    assert text.count("jaxdnn_conv_bwd_data") == 1
    assert text.count("jaxdnn_conv_bwd_filter") == 1
    assert "while" not in text


@needs_cuda_module
def test_cuda_lowering_contains_custom_call():
    f = jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(jaxdnn.conv(x, w, padding=1)), (0, 1)))
    x, w = jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 4))
    text = f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    for target in ("jaxdnn_conv_fwd", "jaxdnn_conv_bwd_data", "jaxdnn_conv_bwd_filter"):
        assert f"custom_call @{target}" in text
    assert 'algo = "direct"' in text


def test_jit_and_eager_agree():
    rng = np.random.default_rng(41)
    x, w = rand(rng, (2, 6, 6, 3)), rand(rng, (3, 3, 3, 4))
    np.testing.assert_array_equal(np.asarray(jaxdnn.conv(x, w, padding=1)),
                                  np.asarray(jax.jit(partial(jaxdnn.conv, padding=1))(x, w)))


# ---- algorithm registry (no GPU needed) ------------------------------------------------------

def test_registry_reports_algorithms_on_every_platform():
    p = jaxdnn.conv_problem(jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32),
                            jax.ShapeDtypeStruct((3, 3, 4, 8), jnp.float32), padding="SAME")
    platforms = ["cpu"] + (["cuda"] if jaxdnn.build_info()["cuda"] else [])
    for platform in platforms:
        infos = jaxdnn.conv_algorithms(p, platform)
        names = [a.name for a in infos]
        assert "direct" in names
        assert infos[0].supported and infos[0].rank == 0
        direct = infos[names.index("direct")]
        assert direct.deterministic and direct.workspace_bytes == 0 and not direct.tensor_cores


def test_forced_unknown_algorithm_names_the_alternatives():
    x, w = jnp.ones((1, 5, 5, 2)), jnp.ones((3, 3, 2, 2))
    with pytest.raises(ValueError, match="unknown conv algorithm 'winograd_f99'.*direct"):
        jax.jit(partial(jaxdnn.conv, algo="winograd_f99")).lower(x, w)


def test_forced_algorithm_is_recorded_in_the_program():
    x, w = jnp.ones((1, 5, 5, 2)), jnp.ones((3, 3, 2, 2))
    text = jax.jit(partial(jaxdnn.conv, algo="direct")).lower(x, w).as_text()
    assert 'algo = "direct"' in text


def test_algo_dict_and_validation():
    x, w = jnp.ones((1, 5, 5, 2)), jnp.ones((3, 3, 2, 2))
    jaxdnn.conv(x, w, algo={"fwd": "direct"})
    with pytest.raises(ValueError, match="algo"):
        jaxdnn.conv(x, w, algo={"forward": "direct"})
    with pytest.raises(TypeError, match="algo"):
        jaxdnn.conv(x, w, algo=3)


# ---- bad input: clear errors at trace time -------------------------------------------------

X, W = jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32), jax.ShapeDtypeStruct((3, 3, 4, 6),
                                                                              jnp.float32)


def _trace(fn, *args):
    return jax.eval_shape(fn, *args)


@pytest.mark.parametrize("kwargs, shapes, exc, match", [
    ({}, ((2, 8, 8, 4), (3, 4, 6)), ValueError, "`x` has rank 4 but `w` has rank 3"),
    ({}, ((2, 8), (3, 4)), ValueError, "rank 3, 4 or 5"),
    ({}, ((2, 8, 8, 4), (3, 3, 5, 6)), ValueError, "channel mismatch.*`w` needs 4"),
    ({"groups": 3}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "`groups`=3 must divide"),
    ({"groups": 2}, ((2, 8, 8, 4), (3, 3, 2, 5)), ValueError, "`groups`=2 must divide the 5"),
    ({"groups": 0}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "`groups` must be a positive"),
    ({"stride": -1}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "`stride` entries must be >= 1"),
    ({"stride": (1, 0)}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "`stride`"),
    ({"stride": (1, 1, 1)}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "`stride` must have 2"),
    ({"dilation": -2}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "`dilation` entries"),
    ({"padding": -1}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "`padding` must not be negative"),
    ({"padding": "FULL"}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "`padding` string"),
    ({"padding": ((1, 1),)}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "`padding` must have 2"),
    ({"layout": "NHCW"}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "`layout` must be one of"),
    ({"layout": "NWC"}, ((2, 8, 8, 4), (3, 3, 4, 6)), ValueError, "does not match the rank"),
    ({"precision": 5}, ((2, 8, 8, 4), (3, 3, 4, 6)), TypeError, "`precision`"),
    ({"preferred_element_type": jnp.int32}, ((2, 8, 8, 4), (3, 3, 4, 6)), TypeError,
     "preferred_element_type"),
    ({"preferred_element_type": jnp.float16}, ((2, 8, 8, 4), (3, 3, 4, 6)), TypeError,
     "narrower"),
], ids=lambda v: str(v)[:40])
def test_conv_bad_input(kwargs, shapes, exc, match):
    x = jax.ShapeDtypeStruct(shapes[0], jnp.float32)
    w = jax.ShapeDtypeStruct(shapes[1], jnp.float32)
    with pytest.raises(exc, match=match):
        _trace(partial(jaxdnn.conv, **kwargs), x, w)


@pytest.mark.parametrize("dx, dw, match", [
    (jnp.bool_, jnp.bool_, "`x` has dtype bool"),
    (jnp.complex64, jnp.complex64, "`x` has dtype complex64"),
    (jnp.float32, jnp.float16, "same dtype"),
    (jnp.float32, jnp.int8, "same dtype"),
    (jnp.float32, jnp.complex64, "`w` has dtype complex64"),
])
def test_conv_bad_dtypes(dx, dw, match):
    with pytest.raises(TypeError, match=match):
        _trace(jaxdnn.conv, jax.ShapeDtypeStruct((2, 8, 8, 4), dx),
               jax.ShapeDtypeStruct((3, 3, 4, 6), dw))


@pytest.mark.parametrize("kwargs, match", [
    (dict(feature_group_count=2, batch_group_count=2), "at most one"),
    (dict(batch_group_count=4), "`batch_group_count`=4 must divide the batch size 2"),
    (dict(batch_group_count=3), "`batch_group_count`=3 must divide the 4 output"),
    (dict(lhs_dilation=(2, 1)), "string padding"),
    (dict(dimension_numbers=("NHWC",)), "dimension_numbers"),
    (dict(window_strides=(0, 1)), "`window_strides` entries must be >= 1"),
], ids=str)
def test_conv_general_dilated_bad_input(kwargs, match):
    kw = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC) | kwargs
    x = jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32)
    w = jax.ShapeDtypeStruct((3, 3, 4, 4), jnp.float32)
    with pytest.raises((ValueError, TypeError), match=match):
        _trace(partial(jaxdnn.conv_general_dilated, **kw), x, w)


def test_conv_transpose_bad_input():
    x = jax.ShapeDtypeStruct((2, 5, 5, 6), jnp.float32)
    with pytest.raises(ValueError, match="channel mismatch"):
        _trace(jaxdnn.conv_transpose, x, jax.ShapeDtypeStruct((3, 3, 4, 5), jnp.float32))
    with pytest.raises(ValueError, match="output_padding"):
        _trace(partial(jaxdnn.conv_transpose, stride=2, output_padding=2), x,
               jax.ShapeDtypeStruct((3, 3, 4, 6), jnp.float32))

