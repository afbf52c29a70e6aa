"""Bad input as a new user hits it: each test is one defect class found by fuzzing the public
API. Every case must raise a ValueError/TypeError naming the argument at trace time, or (for
the tuning cache) warn and carry on; nothing may crash the process. CPU only, and fast."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn
from jaxdnn import _config
from jaxdnn.selection import cache as cache_lib
from jaxdnn.selection import conv as conv_sel
from jaxdnn.selection import core
from util import subprocess_env



def _conv_in_benchmark_mode(cache_dir, x_shape):
    """jit(conv) with benchmark mode on and `cache_dir`: the warnings it gave, the result,
    and explain's reason for the same problem traced again."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal(x_shape), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((3, 3, x_shape[-1], 3)),
                    jnp.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with jaxdnn.config(benchmark=True, cache_dir=str(cache_dir)):
            y = jax.jit(lambda a, b: jaxdnn.conv(a, b, padding=1))(x, w)
            (e,) = jaxdnn.explain(partial(jaxdnn.conv, padding=1), x, w)
    ref = lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                   precision="highest")
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    return [w for w in caught if issubclass(w.category, RuntimeWarning)], e.reason


def test_unwritable_cache_warns_once_and_runs_uncached(tmp_path, monkeypatch):
    # item 1: an unusable cache directory or file must not fail the user's jit: one warning
    # naming the path and the error, and the measured result still serves this process.
    for case, shape, error in [("read_only_dir", (1, 6, 6, 2), "Permission denied"),
                               ("cache_dir_is_a_file", (1, 7, 6, 2), "Not a directory"),
                               ("cache_path_is_a_dir", (1, 6, 7, 2), "Is a directory")]:
        cache_dir = tmp_path / case  # and one problem per case: no trace is shared
        cache = cache_lib.cache_for(str(cache_dir), "conv", "cpu", jaxdnn.__version__)
        with monkeypatch.context() as m:
            if case == "read_only_dir":  # root ignores chmod, so the OS calls fail instead
                def refuse(*args, **kwargs):
                    raise PermissionError(13, "Permission denied", str(cache_dir))
                m.setattr(cache_lib.os, "makedirs", refuse)
                m.setattr(cache_lib.tempfile, "mkstemp", refuse)
            elif case == "cache_dir_is_a_file":
                cache_dir.write_text("not a directory")
            else:
                cache_dir.mkdir()
                os.mkdir(cache.path)
            caught, reason = _conv_in_benchmark_mode(cache_dir, shape)
            assert len(caught) == 1, (case, [str(w.message) for w in caught])
            message = str(caught[0].message)
            assert cache.path in message and error in message and "memory" in message, case
            assert reason == "benchmark (cached)", case
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # warned once: later writes stay quiet
                cache.put("another problem", [dict(name="direct", ok=True, time_s=1.0)])
                assert cache.get("another problem")[0]["name"] == "direct"

    # A writer killed between mkstemp and os.replace leaves a *.tmp: the next writer removes
    # this cache's old ones, and nothing else.
    cache = cache_lib.TuningCache(str(tmp_path), "conv", "cpu", "v-test", device="dev")
    name = os.path.basename(cache.path)
    stale, fresh, foreign = (tmp_path / f"{name}.dead1234.tmp", tmp_path / f"{name}.live5678.tmp",
                             tmp_path / "someone-else.tmp")
    for p in (stale, fresh, foreign):
        p.write_text("{")
    old = time.time() - 2 * 3600
    for p in (stale, foreign):
        os.utime(p, (old, old))
    cache.put("k", [dict(name="direct", ok=True, time_s=1.0)])
    assert not stale.exists()
    assert fresh.exists() and foreign.exists()
    assert json.loads(open(cache.path).read())["entries"]["k"][0]["name"] == "direct"


def test_zero_size_filter_and_empty_inputs_match_lax():
    # item 2: a filter with an empty spatial dimension is an error (lax rejects it when it
    # lowers); empty batch, channels and input spatial dims give lax's empty/zero results.
    x = jnp.ones((2, 5, 5, 3))
    with pytest.raises(ValueError, match=r"jaxdnn\.conv: `w` has shape \(0, 3, 3, 4\)"):
        jaxdnn.conv(x, jnp.ones((0, 3, 3, 4)))
    with pytest.raises(ValueError, match=r"jaxdnn\.conv: `w` has shape \(3, 0, 3, 4\)"):
        jaxdnn.conv(x, jnp.ones((3, 0, 3, 4)), padding="SAME")
    with pytest.raises(ValueError, match=r"jaxdnn\.conv_transpose: `w` has shape"):
        jaxdnn.conv_transpose(x, jnp.ones((3, 0, 4, 3)))
    with pytest.raises(ValueError, match=r"jaxdnn\.conv_general_dilated: `rhs` has shape"):
        jaxdnn.conv_general_dilated(jnp.ones((2, 3, 5, 5)), jnp.ones((4, 3, 3, 0)), (1, 1),
                                    "VALID")
    dn = ("NHWC", "HWIO", "NHWC")
    for xs, ws, pad, kw in [((0, 5, 5, 3), (3, 3, 3, 4), "VALID", {}),
                            ((2, 5, 5, 0), (3, 3, 0, 4), "VALID", {}),
                            ((2, 5, 5, 0), (3, 3, 0, 4), "SAME", dict(feature_group_count=2)),
                            ((2, 5, 5, 3), (3, 3, 3, 0), "VALID", {}),
                            ((2, 0, 5, 3), (3, 3, 3, 4), "VALID", {}),
                            ((2, 0, 5, 3), (3, 3, 3, 4), ((2, 2), (0, 0)), {}),
                            ((0, 5, 5, 3), (3, 3, 3, 4), "VALID", dict(batch_group_count=2))]:
        a, b = jnp.ones(xs), jnp.ones(ws)
        ref = lax.conv_general_dilated(a, b, (1, 1), pad, dimension_numbers=dn, **kw)
        out = jaxdnn.conv_general_dilated(a, b, (1, 1), pad, dimension_numbers=dn, **kw)
        assert out.shape == ref.shape and np.array_equal(out, ref), (xs, ws, pad, kw)


MALFORMED = [
    [{"name": "direct"}],  # no ok / time_s
    {"name": "direct", "ok": True, "time_s": 1.0},  # not a list
    ["direct"],  # not dicts
    [{"name": 3, "ok": True, "time_s": 1.0}],
    [{"name": "direct", "ok": "yes", "time_s": 1.0}],
    [{"name": "direct", "ok": True, "time_s": "fast"}],
    [{"name": "direct", "ok": True, "time_s": None}],
    [{"name": "direct", "ok": True, "time_s": float("nan")}],
]


@pytest.mark.parametrize("entry", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_cache_entry_is_measured_again(entry, tmp_path, monkeypatch):
    # item 3: a well-formed file with a malformed entry must not raise KeyError while tracing.
    problem = jaxdnn.conv_problem(jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32),
                                  jax.ShapeDtypeStruct((3, 3, 4, 8), jnp.float32), padding=1)
    problem = dataclasses.replace(problem, policy=(True, False, -1))
    key = conv_sel.FAMILY.key(problem)
    cache = cache_lib.TuningCache(str(tmp_path), "conv", "cpu", jaxdnn.__version__)
    with open(cache.path, "w") as f:
        json.dump({"format": cache_lib.FORMAT, "jaxdnn": jaxdnn.__version__,
                   "device": cache.device, "entries": {key: entry}}, f)
    measured = [dict(name="direct", ok=True, time_s=1e-3, error=0.0, reason="",
                     workspace_bytes=0, deterministic=True),
                dict(name="im2col_gemm", ok=True, time_s=2e-3, error=0.0, reason="",
                     workspace_bytes=0, deterministic=True)]
    monkeypatch.setattr(conv_sel.FAMILY, "find", lambda problem, platform: measured)
    with jaxdnn.config(cache_dir=str(tmp_path)):
        with pytest.warns(RuntimeWarning, match="malformed entry"):
            c = core.choose(conv_sel.FAMILY, problem, "cpu")
    assert (c.name, c.reason) == ("direct", "benchmark (measured)")
    assert json.loads(open(cache.path).read())["entries"][key] == measured  # overwritten


def test_softmax_algorithms_default_platform():
    # item 4: platform=None means jax's default backend, as for conv_algorithms.
    (e,) = jaxdnn.explain(jaxdnn.softmax, jnp.ones((4, 16)))
    default = jaxdnn.softmax_algorithms(e.problem)
    assert default and default == jaxdnn.softmax_algorithms(e.problem, jax.default_backend())
    assert all(a.platform == jax.default_backend() for a in default)
    (c,) = jaxdnn.conv_problems(jaxdnn.conv, jnp.ones((1, 5, 5, 2)), jnp.ones((3, 3, 2, 2)))
    assert jaxdnn.conv_algorithms(c) == jaxdnn.conv_algorithms(c, jax.default_backend())


@pytest.mark.parametrize("pad, lhs_dilation", [
    ((-10, -10), 1), ((-6, 0), 1), ((0, -6), 1), ((-3, -3), 1), ((-5, 0), 1), ((-3, -2), 1),
    ((-6, 6), 1), ((-10, 0), 2), ((-9, 0), 2), ((-5, -5), 2),
])
def test_negative_padding_larger_than_input(pad, lhs_dilation):
    # item 5: lax raises when the (dilated) input size plus both paddings is negative; it
    # returns an empty result when it is zero.
    x, w = jnp.ones((2, 5, 5, 3)), jnp.ones((1, 1, 3, 4))
    kw = dict(window_strides=(1, 1), padding=(pad, (0, 0)), lhs_dilation=(lhs_dilation, 1),
              dimension_numbers=("NHWC", "HWIO", "NHWC"))
    try:
        ref = jax.eval_shape(partial(lax.conv_general_dilated, **kw), x, w)
    except ValueError:
        with pytest.raises(ValueError, match=r"jaxdnn\.conv_general_dilated: `padding`"):
            jaxdnn.conv_general_dilated(x, w, **kw)
    else:
        assert jaxdnn.conv_general_dilated(x, w, **kw).shape == ref.shape


def test_workspace_limit_env_not_finite(tmp_path):
    # item 6: a non-finite byte count is a ValueError naming the variable, also at import.
    for value in ("inf", "1e400", "-inf", "nan", "infM"):
        with pytest.raises(ValueError, match=f"JAXDNN_WORKSPACE_LIMIT='{value}'"):
            _config.from_environment({"JAXDNN_WORKSPACE_LIMIT": value})
    env = subprocess_env(JAXDNN_WORKSPACE_LIMIT="inf", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", "import jaxdnn"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "ValueError: JAXDNN_WORKSPACE_LIMIT='inf'" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("dnums, match", [
    (lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 9)), "out_spec"),
    (lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1)), "out_spec"),
    (lax.ConvDimensionNumbers((0, 3, 1, 1), (3, 2, 0, 1), (0, 3, 1, 2)), "lhs_spec"),
    (lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, -1), (0, 3, 1, 2)), "rhs_spec"),
    (lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1.0), (0, 3, 1, 2)), "rhs_spec"),
    (lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0), (0, 3, 1, 2)), "rank"),
], ids=range(6))
def test_conv_dimension_numbers_are_validated(dnums, match):
    # item 7: a ConvDimensionNumbers that is not three permutations of the operands' axes.
    x, w = jnp.ones((2, 5, 5, 3)), jnp.ones((3, 3, 3, 4))
    if match == "rank":
        w = jnp.ones((3, 3, 3))
    with pytest.raises(ValueError, match=rf"jaxdnn\.conv_general_dilated: .*{match}"):
        jaxdnn.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=dnums)
    good = lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))
    assert jaxdnn.conv_general_dilated(jnp.ones((2, 5, 5, 3)), jnp.ones((3, 3, 3, 4)), (1, 1),
                                       "VALID", dimension_numbers=good).shape == (2, 3, 3, 4)


def test_find_repeats_is_validated():
    # item 11: repeats=0 gave ok=True with NaN times; 1.5 failed deep inside.
    p = jaxdnn.conv_problem(jnp.ones((1, 5, 5, 2)), jnp.ones((3, 3, 2, 2)))
    for bad, exc in ((0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError),
                     ("3", TypeError), (None, TypeError)):
        with pytest.raises(exc, match=r"jaxdnn\.find_conv_algorithms: `repeats`"):
            jaxdnn.find_conv_algorithms(p, repeats=bad)
    results = jaxdnn.find_conv_algorithms(p, repeats=np.int64(1))
    assert all(np.isfinite(r.time_s) for r in results if r.ok)
    # The timer behind every find (softmax's too) checks it as well.
    with pytest.raises(ValueError, match="`repeats`"):
        core.time_jitted(jnp.negative, [(jnp.ones(3),)], 0)


def test_small_ones():
    # item 12.
    # None (or anything not an array) as the input: TypeError naming the function and `x`.
    calls = {f"jaxdnn.{n}": getattr(jaxdnn, n)
             for n in ("relu", "relu6", "leaky_relu", "elu", "sigmoid", "tanh", "gelu", "silu",
                       "softplus", "softmax", "log_softmax")}
    calls.update({
        "jaxdnn.max_pool": lambda v: jaxdnn.max_pool(v, 2),
        "jaxdnn.avg_pool": lambda v: jaxdnn.avg_pool(v, 2),
        "jaxdnn.global_avg_pool": jaxdnn.global_avg_pool,
        "jaxdnn.layer_norm": lambda v: jaxdnn.layer_norm(v, None, None),
        "jaxdnn.rms_norm": lambda v: jaxdnn.rms_norm(v, None),
        "jaxdnn.batch_norm": lambda v: jaxdnn.batch_norm(v, None, None),
        "jaxdnn.batch_norm_inference":
            lambda v: jaxdnn.batch_norm_inference(v, None, None, jnp.zeros(3), jnp.ones(3)),
        "jaxdnn.group_norm": lambda v: jaxdnn.group_norm(v, None, None, groups=1),
        "jaxdnn.conv": lambda v: jaxdnn.conv(v, jnp.ones((3, 3, 3, 3))),
        "jaxdnn.conv_transpose": lambda v: jaxdnn.conv_transpose(v, jnp.ones((3, 3, 3, 3))),
    })
    for api, fn in calls.items():
        for bad in (None, [1.0, None]):
            with pytest.raises(TypeError, match=rf"{api}: `x` must be an array, got"):
                fn(bad)
    with pytest.raises(TypeError, match=r"jaxdnn\.conv: `w` must be an array, got NoneType"):
        jaxdnn.conv(jnp.ones((1, 5, 5, 3)), None)
    with pytest.raises(TypeError, match=r"jaxdnn\.conv_general_dilated: `rhs` must be an array"):
        jaxdnn.conv_general_dilated(jnp.ones((1, 3, 5, 5)), None, (1, 1), "VALID")
    with pytest.raises(TypeError, match=r"jaxdnn\.layer_norm: `scale` must be an array"):
        jaxdnn.layer_norm(jnp.ones((2, 3)), object(), None)

    # global_avg_pool's errors name it, not avg_pool.
    with pytest.raises(TypeError, match=r"jaxdnn\.global_avg_pool: `x` has dtype int32"):
        jaxdnn.global_avg_pool(jnp.ones((2, 4, 4, 3), jnp.int32))
    with pytest.raises(ValueError, match=r"jaxdnn\.global_avg_pool: `layout`"):
        jaxdnn.global_avg_pool(jnp.ones((2, 4, 4, 3)), "NHCW")

    # numpy scalars in jaxdnn.config, normalised to Python types.
    with jaxdnn.config(benchmark=np.bool_(False), deterministic=np.True_,
                       workspace_limit=np.int64(1 << 20)) as s:
        assert (s.benchmark, s.deterministic, s.workspace_limit) == (False, True, 1 << 20)
        assert type(s.deterministic) is bool and type(s.workspace_limit) is int
    for bad in ("5", 5.0, True, np.True_, np.float32(5)):
        with pytest.raises(ValueError, match="`workspace_limit`"):
            jaxdnn.config(workspace_limit=bad)
    with pytest.raises(TypeError, match="`benchmark` must be a bool"):
        jaxdnn.config(benchmark=np.int64(1))

    # Arrays of more bytes than int64 can count: a ValueError at trace time, not an abort in
    # XLA. By argument where the argument is too large ...
    big = jax.ShapeDtypeStruct((2**40, 2**30), jnp.float32)
    nbytes = str(2**72)
    for api, fn in (("relu", jaxdnn.relu), ("softmax", jaxdnn.softmax),
                    ("layer_norm", lambda v: jaxdnn.layer_norm(v, None, None))):
        with pytest.raises(ValueError, match=rf"jaxdnn\.{api}: `x` .* {nbytes} bytes"):
            jax.jit(fn).lower(big)
    big4 = jax.ShapeDtypeStruct((2**34, 2**34, 4, 1), jnp.float32)  # 2**72 bytes too
    with pytest.raises(ValueError, match=rf"jaxdnn\.max_pool: `x` .* {nbytes} bytes"):
        jax.eval_shape(lambda v: jaxdnn.max_pool(v, 2), big4)
    with pytest.raises(ValueError, match=rf"jaxdnn\.conv: `x` .* {nbytes} bytes"):
        jax.eval_shape(jaxdnn.conv, big4, jax.ShapeDtypeStruct((1, 1, 1, 1), jnp.float32))
    # ... and by primitive where only the result is (here through the padding).
    one = jax.ShapeDtypeStruct((1, 1, 1, 1), jnp.float32)
    with pytest.raises(ValueError, match="jaxdnn_conv_fwd: the result .* bytes"):
        jax.eval_shape(partial(jaxdnn.conv, padding=2**40), one, one)
    with pytest.raises(ValueError, match="jaxdnn_pool_max_fwd: the result .* bytes"):
        jax.eval_shape(lambda v: jaxdnn.max_pool(v, 1, padding=2**40), one)


@pytest.mark.parametrize("kw, name", [(dict(stride=True), "stride"), (dict(groups=True), "groups"),
                                      (dict(dilation=(1, False)), "dilation"),
                                      (dict(groups=1.0), "groups")])
def test_conv_window_sizes_are_ints_not_bools(kw, name):
    # A bool is not a size (pooling rejects them too): TypeError naming the argument.
    x, w = jnp.ones((1, 5, 5, 2)), jnp.ones((3, 3, 2, 4))
    with pytest.raises(TypeError, match=f"`{name}`"):
        jaxdnn.conv(x, w, **kw)
    if name == "groups":
        with pytest.raises(TypeError, match="`groups`"):
            jaxdnn.conv_transpose(x, jnp.ones((3, 3, 4, 2)), **kw)
