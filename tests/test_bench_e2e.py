"""benchmarks/bench_e2e.py runs end to end (--quick, on the CPU) and writes its table."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from jaxdnn.examples.models import cast_floats, lax_ops
from util import ROOT, subprocess_env

BENCHMARKS = ROOT / "benchmarks"


def test_bench_e2e_quick(tmp_path):
    """The ConvNeXt stage, both dtypes: the script end to end (the ResNets take longer to compile
    on a CPU than the rest of this file; test_bench_e2e_networks and tests/test_networks.py
    check them)."""
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_e2e.py"), "--quick", "--models", "convnext",
         "--out-dir", str(tmp_path)],
        capture_output=True, text=True, env=subprocess_env(JAX_PLATFORMS="cpu"), cwd=tmp_path,
        timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    table = json.loads((tmp_path / "e2e-cpu-cpu.json").read_text())
    assert table["environment"]["benchmark"] == "e2e" and "method" in table["environment"]
    assert "Partial run" not in table["notes"]
    rows = table["rows"]
    assert [(r["model"], r["dtype"], r["batch"], r["input"]) for r in rows] == [
        ("convnext", "bfloat16", 2, "8x8x16"), ("convnext", "float32", 2, "8x8x16")]
    for r in rows:
        assert r["lax_img_s"] > 0 and r["jaxdnn_img_s"] > 0
        assert r["ratio"] == pytest.approx(r["jaxdnn_img_s"] / r["lax_img_s"])
        assert r["loss_rel_diff"] == pytest.approx(
            abs(r["jaxdnn_loss"] - r["lax_loss"]) / abs(r["lax_loss"]))
    assert (tmp_path / "e2e-cpu-cpu.md").read_text().count("| convnext |") == 2


@pytest.fixture
def benchmarks(monkeypatch):
    """benchmarks/ on sys.path, where its scripts import each other from."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_bench_e2e_networks(benchmarks):
    """Every configuration's network at its input shape, default and --quick (shapes alone:
    jax.eval_shape computes nothing)."""
    bench_e2e = importlib.import_module("bench_e2e")
    default, quick = bench_e2e.runs(bench_e2e.NETWORKS, False), bench_e2e.runs(
        bench_e2e.NETWORKS, True)
    assert default == bench_e2e.RUNS
    assert quick == [(m, dt, bench_e2e.QUICK_BATCH) for m, dt in
                     dict.fromkeys((m, dt) for m, dt, _ in bench_e2e.RUNS)]
    for name, _, batch in default + quick:
        init, apply, shape, classes = bench_e2e.network(name, batch == bench_e2e.QUICK_BATCH)
        params, state = jax.eval_shape(init, jax.random.key(0))
        x = jax.ShapeDtypeStruct((batch, *shape), jnp.float32)
        logp, _ = jax.eval_shape(
            lambda p, s, x: apply(lax_ops(), cast_floats(p, jnp.float32), s, x, True),
            params, state, x)
        assert logp.shape == (batch, classes)
    with pytest.raises(ValueError, match="unknown network"):
        bench_e2e.network("vgg16")
