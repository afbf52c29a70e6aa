"""Algorithm selection: config, policy filters, benchmark mode and its persistent cache, find,
explain. Fake registries and timings make the logic testable without a GPU."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdnn
from jaxdnn import _config, _ffi
from jaxdnn.ops.norm import NormShape
from jaxdnn.ops.pool import PoolSpec
from jaxdnn.selection import cache, core
from jaxdnn.selection import conv as conv_sel
from jaxdnn.selection import explain as explain_lib
from jaxdnn.selection import norm as norm_sel
from jaxdnn.selection import pool as pool_sel
from jaxdnn.selection import softmax as softmax_sel

from util import by_base, has_gpu, needs_cuda_module, needs_gpu

SPEC = jaxdnn.conv_problem(jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32),
                           jax.ShapeDtypeStruct((3, 3, 4, 8), jnp.float32), padding=1).spec


def fake_registry(monkeypatch, entries):
    """Replaces the compiled registry with `entries`: (name, supported, ws, deterministic)."""
    def fake(problem, platform, variants=True):
        return [core.AlgoInfo(name=n, direction=problem.direction, platform=platform,
                              supported=s, reason="" if s else "not for this problem",
                              workspace_bytes=ws, deterministic=d, tensor_cores=False,
                              rank=i if s else None, base=n)
                for i, (n, s, ws, d) in enumerate(entries)]
    monkeypatch.setattr(conv_sel, "conv_algorithms", fake)


ENTRIES = [("fast_nondet", True, 1 << 20, False), ("medium", True, 4096, True),
           ("direct", True, 0, True), ("unsupported", False, 0, True)]


def select(policy=(False, False, -1), forced=None):
    f32 = np.dtype(np.float32)
    return core.choose(conv_sel.FAMILY, conv_sel.ConvProblem("fwd", SPEC, f32, f32, forced, policy),
                       "cpu")


def test_heuristic_takes_the_first_ranked(monkeypatch):
    fake_registry(monkeypatch, ENTRIES)
    c = select()
    assert (c.name, c.reason, c.workspace_bytes) == ("fast_nondet", "heuristic", 1 << 20)


@pytest.mark.parametrize("x, w, pad, dtype, direction, first", [
    # fwd and bwd_data of l1's 3x3: implicit_precomp_gemm's im2col path beats the halo path
    ((64, 56, 56, 64), (3, 3, 64, 64), 1, jnp.bfloat16, "fwd", "implicit_precomp_gemm"),
    ((64, 56, 56, 128), (3, 3, 128, 64), 1, jnp.float16, "bwd_data", "implicit_precomp_gemm"),
    ((64, 56, 56, 64), (3, 3, 64, 64), 1, jnp.bfloat16, "bwd_filter", "implicit_gemm_splitk"),
    ((64, 14, 14, 256), (3, 3, 256, 256), 1, jnp.float16, "bwd_filter", "implicit_gemm_splitk"),
    ((64, 14, 14, 256), (3, 3, 256, 96), 1, jnp.bfloat16, "bwd_filter", "implicit_precomp_gemm"),
    ((64, 56, 56, 64), (1, 1, 64, 64), 0, jnp.bfloat16, "bwd_filter", "implicit_precomp_gemm"),
    ((64, 56, 56, 64), (3, 3, 64, 64), 1, jnp.float32, "fwd", "implicit_precomp_gemm"),
    ((64, 28, 28, 128), (3, 3, 128, 128), 1, jnp.bfloat16, "fwd", "implicit_precomp_gemm"),
    ((64, 56, 56, 64), (3, 3, 64, 96), 1, jnp.bfloat16, "fwd", "implicit_precomp_gemm"),
    ((64, 7, 7, 64), (3, 3, 64, 64), 1, jnp.bfloat16, "fwd", "implicit_precomp_gemm"),  # 38%
])
def test_gpu_heuristic_sends_3x3_bwd_filter_to_the_halo_path(x, w, pad, dtype, direction,
                                                              first):
    """On Hopper (the default variants' options say which fast paths apply: halo, im2col_tma);
    elsewhere implicit_gemm_splitk would gather per tap, and implicit_precomp_gemm leads."""
    problem = _direction_problem(x, w, dtype, direction, padding=pad)
    assert conv_sel._cuda_preference(direction, problem.spec, np.dtype(dtype), False,
                                     {})[0] == "implicit_precomp_gemm"
    _assert_gpu_first(problem, first)


@pytest.mark.parametrize("x, w, dtype, precision, direction, first", [
    ((64, 56, 56, 64), (7, 7, 64, 64), jnp.bfloat16, None, "fwd", "implicit_precomp_gemm"),
    ((64, 28, 28, 128), (7, 7, 128, 128), jnp.float16, None, "bwd_filter",
     "implicit_precomp_gemm"),
    ((64, 28, 28, 128), (7, 7, 128, 96), jnp.bfloat16, None, "bwd_data", "fft"),  # K % 64
    ((64, 28, 28, 96), (7, 7, 96, 128), jnp.float32, None, "fwd", "implicit_precomp_gemm"),
    ((64, 28, 28, 96), (7, 7, 96, 128), jnp.float32, None, "bwd_filter", "fft"),  # TF32
    ((64, 28, 28, 96), (7, 7, 96, 128), jnp.float32, "highest", "fwd", "fft"),  # exact
])
def test_gpu_heuristic_7x7_im2col_or_fft(x, w, dtype, precision, direction, first):
    """On Hopper, where implicit_precomp_gemm reads A through TMA's im2col mode; without it the
    GEMMs gather through tables and the FFT leads."""
    problem = _direction_problem(x, w, dtype, direction, padding=3, precision=precision)
    assert conv_sel._cuda_preference(direction, problem.spec, np.dtype(dtype), False,
                                     {})[0] == "fft"
    _assert_gpu_first(problem, first)


def _direction_problem(x, w, dtype, direction, **kw):
    def f(x, w):
        y, vjp = jax.vjp(lambda x, w: jaxdnn.conv(x, w, **kw), x, w)
        return vjp(y)

    (problem,) = [p for p in jaxdnn.conv_problems(f, jax.ShapeDtypeStruct(x, dtype),
                                                  jax.ShapeDtypeStruct(w, dtype))
                  if p.direction == direction]
    return problem


def _assert_gpu_first(problem, first):
    """The heuristic's first choice from the CUDA registry, on a Hopper GPU."""
    if not has_gpu() or not str(jax.devices("gpu")[0].compute_capability).startswith("9"):
        return  # the ranking above covers the facts' absence; Hopper's needs one
    infos = conv_sel.conv_algorithms(problem, "cuda", variants=False)
    assert infos[0].base == first, [a.name for a in infos if a.supported]


def test_deterministic_and_workspace_limits(monkeypatch):
    fake_registry(monkeypatch, ENTRIES)
    c = select((False, True, -1))
    assert c.name == "medium" and ("fast_nondet", "not deterministic") in c.excluded
    c = select((False, False, 10_000))
    assert c.name == "medium" and c.excluded[0][0] == "fast_nondet"
    c = select((False, False, 0))
    assert c.name == "direct" and c.workspace_bytes == 0
    assert "needs 4096 workspace bytes > limit 0" in c.describe()


def test_forced_errors(monkeypatch):
    fake_registry(monkeypatch, ENTRIES)
    assert select(forced="medium").reason == "forced"
    with pytest.raises(ValueError, match="cannot run.*not for this problem.*Algorithms that can: "
                                         "fast_nondet, medium, direct"):
        select(forced="unsupported")
    with pytest.raises(ValueError, match="unknown conv algorithm 'nope'"):
        select(forced="nope")
    with pytest.raises(ValueError, match="excluded by jaxdnn.config: not deterministic"):
        select((False, True, -1), forced="fast_nondet")


def fake_finder(monkeypatch, times, calls=None):
    """Makes the conv family's find return `times` ({name: seconds, or None for a wrong
    result}), and record each call's direction in `calls`."""
    def finder(problem, platform):
        if calls is not None:
            calls.append(problem.direction)
        return [dict(name=n, time_s=t, ok=t is not None, error=0.0, reason="",
                     workspace_bytes=0, deterministic=True) if t is not None else
                dict(name=n, time_s=float("inf"), ok=False, error=1.0, reason="wrong result",
                     workspace_bytes=0, deterministic=True) for n, t in times.items()]
    monkeypatch.setattr(conv_sel.FAMILY, "find", finder)


def test_benchmark_mode_picks_the_fastest_and_caches(monkeypatch, tmp_path):
    fake_registry(monkeypatch, ENTRIES)
    calls = []
    fake_finder(monkeypatch, {"fast_nondet": 3e-3, "medium": 1e-3, "direct": 2e-3}, calls)
    with jaxdnn.config(cache_dir=str(tmp_path)):
        c = select((True, False, -1))
        assert (c.name, c.reason) == ("medium", "benchmark (measured)")
        c = select((True, False, -1))
        assert (c.name, c.reason) == ("medium", "benchmark (cached)")
        assert calls == ["fwd"]
        # The cached timings serve other policies too: the workspace limit leaves direct.
        assert select((True, False, 0)).name == "direct"
        assert calls == ["fwd"]
    (path,) = tmp_path.glob("conv-cpu-*.json")
    doc = json.loads(path.read_text())
    assert doc["jaxdnn"] == jaxdnn.__version__ and len(doc["entries"]) == 1


def test_benchmark_mode_skips_wrong_algorithms(monkeypatch, tmp_path):
    fake_registry(monkeypatch, ENTRIES)
    fake_finder(monkeypatch, {"fast_nondet": None, "medium": 2e-3, "direct": 1e-2})
    with jaxdnn.config(cache_dir=str(tmp_path)):
        assert select((True, False, -1)).name == "medium"


def test_config_is_global_and_a_context_manager():
    before = _config.settings()
    with jaxdnn.config(deterministic=True, workspace_limit=0) as s:
        assert s.deterministic and s.workspace_limit == 0
        assert _config.settings().policy() == (before.benchmark, True, 0)
    assert _config.settings() == before
    jaxdnn.config(benchmark=True)
    try:
        assert _config.settings().benchmark
    finally:
        jaxdnn.config(benchmark=before.benchmark)
    with pytest.raises(TypeError, match="`benchmark` must be a bool"):
        jaxdnn.config(benchmark="yes")
    with pytest.raises(ValueError, match="workspace_limit"):
        jaxdnn.config(workspace_limit=-5)


def test_config_from_environment():
    s = _config.from_environment({"JAXDNN_BENCHMARK": "1", "JAXDNN_DETERMINISTIC": "true",
                                  "JAXDNN_WORKSPACE_LIMIT": "512M", "JAXDNN_CACHE_DIR": "/x"})
    assert (s.benchmark, s.deterministic, s.workspace_limit, s.cache_dir) == (
        True, True, 512 << 20, "/x")
    assert _config.from_environment({}).workspace_limit is None
    with pytest.raises(ValueError, match="JAXDNN_BENCHMARK"):
        _config.from_environment({"JAXDNN_BENCHMARK": "maybe"})
    with pytest.raises(ValueError, match="JAXDNN_WORKSPACE_LIMIT"):
        _config.from_environment({"JAXDNN_WORKSPACE_LIMIT": "lots"})


def test_policy_is_recorded_at_trace_time():
    x, w = jnp.ones((1, 6, 6, 2)), jnp.ones((3, 3, 2, 2))
    with jaxdnn.config(deterministic=True, workspace_limit=0):
        (p,) = jaxdnn.conv_problems(partial(jaxdnn.conv, padding=1), x, w)
    assert p.policy == (_config.settings().benchmark, True, 0)


# ---- the per-family interface ---------------------------------------------------------------

def _conv_softmax_loss(x, w):
    return jnp.sum(jaxdnn.log_softmax(jaxdnn.conv(x, w, padding=1), axis=-1) ** 2)


def test_families_read_a_problem_from_each_primitive():
    """Every primitive of the conv and softmax families, from the jaxpr of a gradient: the
    family's problem has the direction, shapes and dtypes of the call (the fused convolution's
    is a forward), and other equations have none."""
    x, w = jnp.ones((2, 6, 6, 3), jnp.float32), jnp.ones((3, 3, 3, 4), jnp.float32)

    def loss(x, w):
        fused = jaxdnn.conv(x, w, padding=1, bias=jnp.ones(4), activation="relu")
        return _conv_softmax_loss(x, w) + jnp.sum(fused)

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w).jaxpr
    seen = {}
    for eqn in jaxpr.eqns:
        problem = explain_lib.problem_from_eqn(eqn)
        family = core.family_of(eqn.primitive)
        assert (problem is None) == (family is None), eqn.primitive
        if family is not None:
            assert eqn.primitive in family.primitives
            seen[eqn.primitive] = problem
    assert set(seen) == {*conv_sel.FAMILY.primitives, *softmax_sel.FAMILY.primitives}
    for prim in conv_sel.FAMILY.primitives:
        p = seen[prim]
        assert isinstance(p, jaxdnn.ConvProblem)
        assert prim.name in (f"jaxdnn_conv_{p.direction}", f"jaxdnn_conv_{p.direction}_fused")
        assert p.spec.lhs_shape == (2, 1, 6, 6, 3) and p.spec.rhs_shape == (1, 3, 3, 3, 4)
        assert p.dtype == p.out_dtype == np.float32 and p.forced_algo is None
    fwd, bwd = (seen[prim] for prim in softmax_sel.FAMILY.primitives)
    assert (fwd.direction, fwd.op, fwd.rows, fwd.cols) == ("fwd", "log_softmax", 72, 4)
    assert (bwd.direction, bwd.op, bwd.rows, bwd.cols) == ("bwd", "log_softmax_vjp", 72, 4)
    # The problem keys the family's tuning cache; the registry answers for it.
    for family, p in ((conv_sel.FAMILY, seen[conv_sel.FAMILY.primitives[0]]),
                      (softmax_sel.FAMILY, fwd)):
        assert family.key(p) and family.algorithms(p, "cpu")[0].rank == 0


def test_explain_walks_nested_jaxprs_of_every_family():
    """Calls inside remat, scan and cond are found, for both families, in program order."""
    x, w = jnp.ones((2, 6, 6, 3)), jnp.ones((3, 3, 3, 4))

    def f(x, w):
        y = jax.checkpoint(lambda x: jaxdnn.conv(x, w, padding=1))(x)
        y, _ = lax.scan(lambda c, _: (jaxdnn.softmax(c), None), y, None, length=2)
        return lax.cond(True, lambda v: jaxdnn.log_softmax(v), lambda v: v, y)

    rows = jaxdnn.explain(jax.jit(f), x, w, platform="cpu")
    assert [(type(r.problem).__name__, r.direction) for r in rows] == [
        ("ConvProblem", "fwd"), ("SoftmaxProblem", "fwd"), ("SoftmaxProblem", "fwd")]
    assert [r.problem.op for r in rows[1:]] == ["softmax", "log_softmax"]
    assert all(r.reason == "heuristic" for r in rows)


def _norm_pool_loss(x, scale, bias):
    y = jaxdnn.layer_norm(x, scale, bias)
    y, _, _ = jaxdnn.batch_norm(y.reshape(2, 4, 4, 8), scale, bias)
    return jnp.sum(jaxdnn.max_pool(y, 2) ** 2)


def test_explain_lists_norm_and_pool_calls():
    """A gradient through layer norm, batch norm and max pooling: a row per kernel call, in
    program order, each naming the algorithm its custom call lowers with."""
    args = (jnp.arange(256.0, dtype=jnp.float32).reshape(32, 8) % 7, jnp.ones(8), jnp.zeros(8))
    f = jax.jit(jax.grad(_norm_pool_loss, argnums=(0, 1)))
    rows = jaxdnn.explain(f, *args, platform="cpu")
    assert [(type(r.problem).__name__, r.direction, r.algo) for r in rows] == [
        ("NormProblem", "fwd", "row"), ("NormProblem", "fwd", "column"),
        ("PoolProblem", "fwd", "window"), ("PoolProblem", "bwd", "gather"),
        ("NormProblem", "bwd", "column"), ("NormProblem", "bwd", "row")]
    assert [r.problem.op for r in rows[2:4]] == ["max_fwd_index", "max_scatter"]
    assert all(r.reason == "heuristic" and r.workspace_bytes == 0 for r in rows)
    assert "norm fwd   32x1x1x8x1x1 float32" in str(rows)
    assert "pool max_scatter 2x8x1x4x4x1x2x2x1x2x2x1x2x2x0x0x0x0x0x0 float32" in str(rows)
    lowered = re.findall(r'custom_call @jaxdnn_(norm|pool)_(\w+)\(.*algo = "(\w+)"',
                         f.lower(*args).as_text())
    assert sorted(a for _, _, a in lowered) == sorted(r.algo for r in rows)
    # The problem keys its family's tuning cache; the family's registry answers for it.
    families = {norm_sel.NormProblem: norm_sel.FAMILY, pool_sel.PoolProblem: pool_sel.FAMILY}
    for r in rows:
        family = families[type(r.problem)]
        assert family.key(r.problem) and family.algorithms(r.problem, "cpu")[0].name == r.algo


def test_explain_names_forced_norm_and_pool_algorithms():
    x = jnp.ones((2, 4, 4, 8), jnp.float32)
    f = lambda x: jaxdnn.max_pool(jaxdnn.layer_norm(x, None, None, algo="row"), 2,  # noqa: E731
                                  algo="window")
    rows = jaxdnn.explain(f, x, platform="cpu")
    assert [(r.algo, r.reason) for r in rows] == [("row", "forced"), ("window", "forced")]
    with pytest.raises(ValueError, match="unknown pool algorithm 'tiles' for fwd on cpu"):
        jaxdnn.explain(lambda x: jaxdnn.max_pool(x, 2, algo="tiles"), x, platform="cpu")


class _NegFamily:
    """A family for jax's own neg primitive: enough to show what a new family provides."""

    name = "neg_test"
    primitives = (lax.neg_p,)

    @dataclasses.dataclass(frozen=True)
    class Problem:
        size: int
        direction: str = "fwd"
        forced_algo: str | None = None
        policy: tuple = (False, False, -1)

        def describe(self):
            return f"neg {self.size}"

    def problem(self, primitive, avals, params):
        return self.Problem(int(np.prod(avals[0].shape)))

    def algorithms(self, problem, platform):
        return [core.AlgoInfo(name=n, direction="fwd", platform=platform, supported=True,
                              reason="", workspace_bytes=0, deterministic=True,
                              tensor_cores=False, rank=i) for i, n in enumerate(("xla", "other"))]

    def key(self, problem):
        return str(problem.size)

    def find(self, problem, platform):
        return [dict(name="other", ok=True, time_s=1.0), dict(name="xla", ok=True, time_s=2.0)]


def test_a_registered_family_is_explained_and_cached_in_its_own_file(monkeypatch, tmp_path):
    monkeypatch.setattr(core, "_families", dict(core._families))
    monkeypatch.setattr(core, "_by_primitive", dict(core._by_primitive))
    core.register_family(_NegFamily())
    with pytest.raises(ValueError, match="'neg_test' is registered"):
        core.register_family(_NegFamily())
    f = lambda x: -jaxdnn.softmax(x)  # noqa: E731
    rows = jaxdnn.explain(f, jnp.ones((4, 8), jnp.float32), platform="cpu")
    assert [(r.summary(), r.algo, r.reason) for r in rows] == [
        ("softmax fwd  softmax 4x8 float32", "rows", "heuristic"),
        ("neg 32", "xla", "heuristic")]
    family = core.family_of(lax.neg_p)
    with jaxdnn.config(cache_dir=str(tmp_path)):
        problem = dataclasses.replace(family.problem(lax.neg_p, [jnp.ones(5)], {}),
                                      policy=(True, False, -1))
        assert core.choose(family, problem, "cpu").name == "other"
    assert [p.name.split("-")[0] for p in tmp_path.glob("*.json")] == ["neg_test"]


def test_one_cache_file_per_family_and_device(monkeypatch, tmp_path):
    """Benchmark results of two families land in two files, and another device's in a third."""
    infos = [core.AlgoInfo(name=n, direction="fwd", platform="cpu", supported=True, reason="",
                           workspace_bytes=0, deterministic=True, tensor_cores=False, rank=i)
             for i, n in enumerate(("a", "b"))]
    measured = [dict(name="b", ok=True, time_s=1.0), dict(name="a", ok=True, time_s=2.0)]
    monkeypatch.setattr(cache, "device_identity", lambda platform: "Some CPU x2")
    with jaxdnn.config(cache_dir=str(tmp_path)):
        for op in ("conv", "softmax"):
            c = core.select_algorithm(op, "fwd", infos, "cpu", None, (True, False, -1),
                                      key=f"{op} problem", find=lambda: measured)
            assert (c.name, c.reason) == ("b", "benchmark (measured)")
    other = cache.TuningCache(str(tmp_path), "conv", "cpu", jaxdnn.__version__,
                              device="Other CPU x8")
    other.put("conv problem", measured)
    docs = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(docs) == ["conv-cpu-Other_CPU_x8.json", "conv-cpu-Some_CPU_x2.json",
                            "softmax-cpu-Some_CPU_x2.json"]
    assert list(docs["conv-cpu-Some_CPU_x2.json"]["entries"]) == ["conv problem"]
    assert list(docs["softmax-cpu-Some_CPU_x2.json"]["entries"]) == ["softmax problem"]
    assert docs["conv-cpu-Other_CPU_x8.json"]["device"] == "Other CPU x8"


# ---- the cache file --------------------------------------------------------------------------

def test_cache_survives_processes_and_concurrent_writers(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from jaxdnn.selection import cache
        c = cache.TuningCache({str(tmp_path)!r}, "conv", "cpu", "v-test", device="dev")
        for i in range(20):
            c.put(f"{{sys.argv[1]}}-{{i}}", [dict(name="a", time_s=float(i))])
    """)
    # cwd outside the source tree: `python -c` puts the cwd first on sys.path.
    procs = [subprocess.Popen([sys.executable, "-c", script, f"w{k}"], cwd=tmp_path)
             for k in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    fresh = cache.TuningCache(str(tmp_path), "conv", "cpu", "v-test", device="dev")
    for k in range(4):
        for i in range(20):
            assert fresh.get(f"w{k}-{i}") == [dict(name="a", time_s=float(i))]
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("content, match", [
    ("{not json", "unreadable"),
    (json.dumps({"format": 1, "jaxdnn": "v-test", "device": "other", "entries": {}}), "another"),
    (json.dumps({"format": 1, "jaxdnn": "v-old", "device": "dev", "entries": {}}), "another"),
    (json.dumps([1, 2]), "malformed"),
])
def test_corrupt_or_foreign_cache_is_rebuilt(tmp_path, content, match):
    c = cache.TuningCache(str(tmp_path), "conv", "cpu", "v-test", device="dev")
    with open(c.path, "w") as f:
        f.write(content)
    with pytest.warns(RuntimeWarning, match=match):
        assert c.get("k") is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c.put("k", [{"name": "a"}])
    doc = json.loads(open(c.path).read())
    assert doc["device"] == "dev" and doc["entries"] == {"k": [{"name": "a"}]}


def test_cache_file_name_carries_the_device(tmp_path):
    c = cache.TuningCache(str(tmp_path), "conv", "cuda", "v", device="NVIDIA H200 sm_90")
    assert os.path.basename(c.path) == "conv-cuda-NVIDIA_H200_sm_90.json"


# ---- find and explain on the real CPU registry ------------------------------------------------

def test_find_times_and_checks_every_algorithm():
    p = jaxdnn.conv_problem(jax.ShapeDtypeStruct((2, 10, 10, 8), jnp.float32),
                            jax.ShapeDtypeStruct((3, 3, 8, 8), jnp.float32), padding=1)
    results = jaxdnn.find_conv_algorithms(p, "cpu", repeats=2)
    names = {r.name for r in results}
    assert names == {a.name for a in jaxdnn.conv_algorithms(p, "cpu")}
    assert all(r.ok and r.time_s > 0 and r.error < 1e-5 for r in results)
    assert [r.time_s for r in results] == sorted(r.time_s for r in results)


@needs_gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=lambda d: np.dtype(d).name)
def test_find_on_the_gpu_times_with_cuda_events(dtype):
    """Every supported CUDA algorithm runs, agrees with the oracle and is timed on the device
    (CUDA events on its own stream); the sorted list is fastest first."""
    p = jaxdnn.conv_problem(jax.ShapeDtypeStruct((8, 16, 16, 32), dtype),
                            jax.ShapeDtypeStruct((3, 3, 32, 64), dtype), padding=1)
    results = jaxdnn.find_conv_algorithms(p, "cuda", repeats=3)
    ran = [r for r in results if r.timer]
    supported = {a.name for a in jaxdnn.conv_algorithms(p, "cuda") if a.supported}
    assert {r.name for r in ran} == supported and len(ran) >= 3
    assert all(r.ok and r.timer == "cuda events" and 0 < r.time_s < 1 for r in ran)
    assert [r.time_s for r in ran] == sorted(r.time_s for r in ran)


def test_find_rejects_a_wrong_algorithm(monkeypatch):
    """An injected algorithm that is 1% off is measured but rejected, never chosen."""
    real = conv_sel._run_algorithm
    fake_registry(monkeypatch, [("broken", True, 0, True), ("direct", True, 0, True)])

    def run(name, direction, spec, out_dtype):
        fn = real("direct", direction, spec, out_dtype)
        return (lambda a, b: fn(a, b) * 1.01) if name == "broken" else fn

    monkeypatch.setattr(conv_sel, "_run_algorithm", run)
    p = jaxdnn.conv_problem(jax.ShapeDtypeStruct((1, 6, 6, 2), jnp.float32),
                            jax.ShapeDtypeStruct((3, 3, 2, 2), jnp.float32), padding=1)
    results = {r.name: r for r in jaxdnn.find_conv_algorithms(p, "cpu", repeats=1)}
    assert not results["broken"].ok and "wrong result" in results["broken"].reason
    assert results["broken"].error == pytest.approx(0.01, rel=1e-3)
    assert results["direct"].ok


F32 = np.dtype(np.float32)
POOL_SPEC = PoolSpec((2, 6, 6, 4), (3, 3), (2, 2), ((1, 1), (1, 1)))


@pytest.mark.parametrize("family,problem", [
    (softmax_sel.FAMILY, softmax_sel.SoftmaxProblem("bwd", "log_softmax_vjp", 8, 16, F32)),
    (norm_sel.FAMILY, norm_sel.NormProblem("fwd", NormShape(1, 8, 4, 1, 1), F32)),
    (norm_sel.FAMILY, norm_sel.NormProblem("bwd", NormShape(6, 1, 1, 8, 1), F32, centered=False)),
    (pool_sel.FAMILY, pool_sel.PoolProblem("avg_fwd", POOL_SPEC, F32, False)),
    (pool_sel.FAMILY, pool_sel.PoolProblem("max_scatter", POOL_SPEC, F32))],
    ids=lambda v: v.describe() if hasattr(v, "describe") else v.name)
def test_family_find_checks_and_times_every_listed_algorithm(family, problem):
    """softmax's, norm's and pool's find (core.find_checked): every algorithm of the listing,
    the supported ones checked against the reference and timed, as the tuning cache keeps
    them."""
    results = family.find(problem, "cpu")
    listing = {a.name: a for a in family.algorithms(problem, "cpu")}
    assert [r["name"] for r in results][:1] == [next(iter(listing))]
    assert {r["name"] for r in results} == set(listing) and core._valid_results(results)
    for r in results:
        if listing[r["name"]].supported:
            assert r["ok"] and r["time_s"] > 0 and r["error"] < 1e-5, r
        else:
            assert not r["ok"] and r["reason"] == listing[r["name"]].reason


def test_find_checked_rejects_a_wrong_result():
    infos = [core.AlgoInfo(name=n, direction="fwd", platform="cpu", supported=s, reason=why,
                           workspace_bytes=0, deterministic=True, tensor_cores=False,
                           rank=None, base=n)
             for n, s, why in (("off", True, ""), ("none", False, "no"), ("exact", True, ""))]
    inputs = [(jnp.arange(1.0, 9.0) * k,) for k in (1, 2)]
    results = core.find_checked(infos, lambda n: (lambda a: a * 1.01) if n == "off" else
                                (lambda a: a), inputs, inputs[0][0], 1e-3, repeats=1)
    assert [(r["name"], r["ok"]) for r in results] == [("exact", True), ("none", False),
                                                      ("off", False)]
    assert results[2]["reason"] == "wrong result: relative error 1.00e-02"
    assert results[1]["reason"] == "no" and results[0]["error"] == 0


def test_explain_lists_every_call_with_reasons():
    x, w = jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 4))
    f = jax.value_and_grad(lambda w, x: jnp.sum(jaxdnn.conv(x, w, padding=1)))
    rows = jaxdnn.explain(f, w, x, platform="cpu")
    assert [r.direction for r in rows] == ["fwd", "bwd_filter"]
    assert all(r.reason.startswith("heuristic") for r in rows)
    with jaxdnn.config(workspace_limit=0):
        rows = jaxdnn.explain(f, w, x, platform="cpu")
    assert all(r.workspace_bytes == 0 for r in rows)
    forced = jaxdnn.explain(lambda x, w: jaxdnn.conv(x, w, algo="direct"), x, w, platform="cpu")
    assert forced[0].reason == "forced" and "direct" in str(forced)


def test_deterministic_training_step_is_bitwise_reproducible():
    """deterministic=True: a CNN training step (every conv direction, batch norm, pooling,
    activations, softmax) gives the same bits twice."""
    from jaxdnn.examples import models

    init, apply = models.MODELS["cnn"]
    params, state = init(jax.random.key(0), (8, 8, 1), 10, width=8)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, 16)
    with jaxdnn.config(deterministic=True):
        step = jax.jit(jax.value_and_grad(
            partial(models.loss_fn, apply, models.jaxdnn_ops(), jnp.float32), has_aux=True))
        first = jax.tree.leaves(step(params, state, x, y))
        again = jax.tree.leaves(step(params, state, x, y))
        rows = jaxdnn.explain(step, params, state, x, y, platform="cpu")
        listing = {"ConvProblem": jaxdnn.conv_algorithms, "NormProblem": jaxdnn.norm_algorithms,
                   "PoolProblem": jaxdnn.pool_algorithms,
                   "SoftmaxProblem": jaxdnn.softmax_algorithms}
        assert {type(r.problem).__name__ for r in rows} == set(listing)
        for r in rows:
            get = listing[type(r.problem).__name__]
            assert r.reason.startswith(("heuristic", "forced"))
            assert {a.name: a for a in get(r.problem, "cpu")}[r.algo].deterministic
    for a, b in zip(first, again):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---- the policy on the CUDA registry (needs the CUDA module, not a GPU) ------------------------
# The heuristic's first choice is deterministic on every problem of the CUDA registry (the one
# non-deterministic algorithm, implicit_gemm_splitk_atomic, always trails a deterministic one),
# so `deterministic` changes a choice in benchmark mode, where the measured fastest leads: these
# tests inject the measurements (on the GPU, find's own; test_gpu_deterministic_* below) and
# take everything else (support, determinism, workspace) from the CUDA registry.

X32 = jax.ShapeDtypeStruct((2, 56, 56, 64), jnp.float32)
W32 = jax.ShapeDtypeStruct((3, 3, 64, 64), jnp.float32)
X16 = jax.ShapeDtypeStruct((2, 56, 56, 64), jnp.bfloat16)
W16 = jax.ShapeDtypeStruct((3, 3, 64, 64), jnp.bfloat16)
ATOMIC = "implicit_gemm_splitk_atomic"


def _conv_fn(precision=None):
    """A new function each call: jax.jit caches traces by function, and jaxdnn.config's policy is
    recorded at trace time."""
    return lambda x, w: jaxdnn.conv(x, w, padding=1, precision=precision)


def _train_fn():
    return jax.grad(lambda w, x: jnp.sum(jaxdnn.conv(x, w, padding=1).astype(jnp.float32) ** 2))


def _lowered_algos(fn, *args):
    """{custom call target: [algo attribute]} of fn lowered for CUDA (runs on the CPU)."""
    import re

    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    found = {}
    call = rf"custom_call @jaxdnn_conv_(\w+)_v{_ffi.FFI_VERSION}\(.*?algo = \"([\w.]+)\""
    for direction, name in re.findall(call, text):
        found.setdefault(direction, []).append(name)
    return found


def _cuda_infos(problem):
    return {a.name: a for a in jaxdnn.conv_algorithms(problem, "cuda")}


def _base(name: str) -> str:
    """The algorithm of a concrete variant's name (cc/conv/variant.h)."""
    return name.split(".")[0]


def _first(problem, ok=lambda a: True):
    """The registry's first supported algorithm in heuristic order that satisfies `ok`."""
    return next(a for a in jaxdnn.conv_algorithms(problem, "cuda") if a.supported and ok(a))


@pytest.fixture
def atomic_fastest(monkeypatch):
    """Benchmark mode's measurements: implicit_gemm_splitk_atomic fastest wherever it runs, the
    others in heuristic order behind it (as on the GPU, where it often wins bwd_filter)."""
    calls = []

    def finder(problem, platform):
        calls.append((problem.direction, platform))
        infos = conv_sel.conv_algorithms(problem, platform)
        return [dict(name=a.name, time_s=1e-6 if a.base == ATOMIC else 1e-3 * (1 + a.rank),
                     ok=True, error=0.0, reason="", workspace_bytes=a.workspace_bytes,
                     deterministic=a.deterministic, timer="cuda events")
                for a in infos if a.supported]

    monkeypatch.setattr(conv_sel.FAMILY, "find", finder)
    # The tuning cache's file is named after the device, which needs no GPU here.
    monkeypatch.setattr(cache, "device_identity", lambda platform: f"injected {platform}")
    return calls


@needs_cuda_module
def test_cuda_deterministic_excludes_the_fastest(atomic_fastest, tmp_path):
    """bf16 training step of a 3x3 64->64 layer on the CUDA registry, in benchmark mode with
    implicit_gemm_splitk_atomic measured fastest: it is chosen wherever it runs, and
    deterministic=True replaces it by the fastest deterministic algorithm, says so in explain and
    lowers that algorithm into the custom call."""
    problems = {p.direction: p for p in jaxdnn.conv_problems(_train_fn(), W16, X16)}
    atomic = by_base(jaxdnn.conv_algorithms(problems["bwd_filter"], "cuda"))[ATOMIC]
    assert atomic.supported and not atomic.deterministic
    with jaxdnn.config(benchmark=True, cache_dir=str(tmp_path)):
        rows = jaxdnn.explain(_train_fn(), W16, X16, platform="cuda")
        lowered = _lowered_algos(_train_fn(), W16, X16)
    assert atomic_fastest and all(p == "cuda" for _, p in atomic_fastest)
    chosen = {r.direction: r.algo for r in rows}
    assert _base(chosen["bwd_filter"]) == ATOMIC
    assert [_base(n) for n in lowered["bwd_filter"]] == [ATOMIC]

    with jaxdnn.config(benchmark=True, deterministic=True, cache_dir=str(tmp_path)):
        rows = jaxdnn.explain(_train_fn(), W16, X16, platform="cuda")
        lowered = _lowered_algos(_train_fn(), W16, X16)
    for r in rows:
        infos = _cuda_infos(r.problem)
        # The fastest deterministic one: the measurements rank the rest in heuristic order.
        want = _first(r.problem, lambda a: a.deterministic)
        assert r.algo == want.name and infos[r.algo].deterministic, r
        assert lowered[r.direction] == [r.algo]
        assert r.reason.startswith("benchmark (cached)")  # the first run's measurements
        if by_base(infos.values())[ATOMIC].supported:
            assert f"excluded {ATOMIC}." in r.reason and "(not deterministic)" in r.reason, r
    assert _base({r.direction: r.algo for r in rows}["bwd_filter"]) != ATOMIC


@needs_cuda_module
def test_cuda_deterministic_rejects_a_forced_nondeterministic_algorithm():
    fn = partial(jaxdnn.conv, padding=1, algo=ATOMIC)
    assert [_base(n) for n in _lowered_algos(fn, X16, W16)["fwd"]] == [ATOMIC]
    with jaxdnn.config(deterministic=True):
        with pytest.raises(ValueError, match=f"{ATOMIC}' is excluded by jaxdnn.config: not "
                                             "deterministic"):
            jaxdnn.explain(partial(jaxdnn.conv, padding=1, algo=ATOMIC), X16, W16,
                           platform="cuda")
        with pytest.raises(ValueError, match="not deterministic"):
            _lowered_algos(partial(jaxdnn.conv, padding=1, algo=ATOMIC), X16, W16)


@needs_cuda_module
@pytest.mark.parametrize("limit", [1 << 20, 0])
def test_cuda_workspace_limit_changes_the_heuristic_choice(limit):
    """float32 HIGHEST 3x3 stride 1: the heuristic's first choice (winograd_nonfused on the CUDA
    registry) needs ~8.8 MB of workspace. A limit takes the first algorithm within it, lists
    every algorithm it passed over with its workspace in explain, and is what lowers."""
    (problem,) = jaxdnn.conv_problems(_conv_fn("highest"), X32, W32)
    default = _first(problem)
    assert default.workspace_bytes > (1 << 20), "the heuristic's first choice needs workspace"
    rows = jaxdnn.explain(_conv_fn("highest"), X32, W32, platform="cuda")
    assert [(r.algo, r.reason) for r in rows] == [(default.name, "heuristic")]

    with jaxdnn.config(workspace_limit=limit):
        (row,) = jaxdnn.explain(_conv_fn("highest"), X32, W32, platform="cuda")
        lowered = _lowered_algos(_conv_fn("highest"), X32, W32)
    want = _first(problem, lambda a: a.workspace_bytes <= limit)
    assert row.algo == want.name != default.name
    assert row.workspace_bytes == want.workspace_bytes <= limit
    assert lowered == {"fwd": [want.name]}
    assert (f"excluded {default.name} (needs {default.workspace_bytes} workspace bytes > limit "
            f"{limit})") in row.reason
    # (heuristic mode chooses among the default variants)
    skipped = [a for a in jaxdnn.conv_algorithms(problem, "cuda", variants=False)
               if a.supported and a.workspace_bytes > limit]
    for a in skipped:
        assert f"{a.name} (needs {a.workspace_bytes} workspace bytes" in row.reason


@needs_cuda_module
def test_config_change_reaches_an_already_traced_function():
    """jaxdnn.config's settings are part of jax.jit's cache key: a function jitted and lowered
    before a change is lowered again under it, with the algorithm the new policy chooses."""
    f = _conv_fn("highest")
    before = _lowered_algos(f, X32, W32)
    with jaxdnn.config(workspace_limit=0):
        (row,) = jaxdnn.explain(f, X32, W32, platform="cuda")
        assert _lowered_algos(f, X32, W32) == {"fwd": [row.algo]} != before


@needs_gpu
@pytest.mark.parametrize("injected", [True, False], ids=["atomic_fastest", "measured"])
def test_gpu_deterministic_runs_the_lowered_algorithm_bitwise(injected, request, tmp_path):
    """On the GPU, in benchmark mode (measurements injected with implicit_gemm_splitk_atomic
    fastest, or find's own) with deterministic=True: the algorithm in each custom call is the
    one explain names and a deterministic one, and two runs of the compiled training step give
    the same bits."""
    if injected:
        request.getfixturevalue("atomic_fastest")
    gpu = jax.devices("gpu")[0]
    rng = np.random.default_rng(4)
    w = jax.device_put(rng.standard_normal(W16.shape).astype(jnp.bfloat16), gpu)
    x = jax.device_put(rng.standard_normal(X16.shape).astype(jnp.bfloat16), gpu)
    with jaxdnn.config(benchmark=True, cache_dir=str(tmp_path)):
        free = _lowered_algos(_train_fn(), w, x)
    with jaxdnn.config(benchmark=True, deterministic=True, cache_dir=str(tmp_path)):
        rows = jaxdnn.explain(_train_fn(), w, x, platform="cuda")
        lowered = jax.jit(_train_fn()).lower(w, x)
    if injected:
        assert [_base(n) for n in free["bwd_filter"]] == [ATOMIC]
    text = lowered.as_text()
    for r in rows:
        assert f'algo = "{r.algo}"' in text
        assert _cuda_infos(r.problem)[r.algo].deterministic
    assert ATOMIC not in text
    step = lowered.compile()
    first, again = np.asarray(step(w, x)), np.asarray(step(w, x))
    np.testing.assert_array_equal(first, again)


def test_config_change_retraces_a_jitted_function():
    """A jitted function is traced once per jaxdnn.config setting (the settings are part of
    jax.jit's cache key), and called again under the same settings it is not retraced."""
    traces = []

    @jax.jit
    def f(x, w):
        traces.append(jaxdnn._config.settings())  # the settings in force while tracing
        return jaxdnn.conv(x, w, padding="SAME")

    x, w = jnp.ones((1, 6, 6, 4)), jnp.ones((3, 3, 4, 8))
    f(x, w)
    f(x, w)
    with jaxdnn.config(deterministic=True):
        f(x, w)
        f(x, w)
    f(x, w)
    assert [t.deterministic for t in traces] == [False, True]
