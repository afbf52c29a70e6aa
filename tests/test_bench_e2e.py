"""benchmarks/bench_e2e.py runs end to end (--quick, on the CPU) and writes its table;
benchmarks/profile_step.py sums a trace's GPU kernels by category (a synthetic trace: the real
ones come from a GPU)."""

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


@pytest.fixture
def profile_step(benchmarks):
    return importlib.import_module("profile_step")


def test_profile_step_categories(profile_step):
    """Kernel names as traces show them, demangled or not."""
    expected = {
        "void jaxdnn::conv::(anonymous namespace)::wgmma_kernel<128, 128>(Params)":
            "convolution / GEMM",
        "_ZN6jaxdnn4conv12_GLOBAL__N_112halo_kernelEv": "convolution / GEMM",
        "void jaxdnn::conv::(anonymous namespace)::epilogue_kernel<(jaxdnn::activation::Op)6, "
        "__nv_bfloat16>(__nv_bfloat16*)": "conv epilogue",
        "_ZN6jaxdnn4conv12_GLOBAL__N_115epilogue_kernelILNS_10activation2OpE0EfEEvPT0_": "conv "
        "epilogue",
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc": "convolution / GEMM",
        "triton_gemm_dot_3": "convolution / GEMM",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": "convolution / GEMM",
        "void jaxdnn::norm::cuda_impl::(anonymous namespace)::column_stats_kernel<float>()":
            "normalization",
        "_ZN6jaxdnn4norm9cuda_impl12_GLOBAL__N_113row_fwd_kernelEv": "normalization",
        "void jaxdnn::activation::(anonymous namespace)::activation_kernel<1>(float*)":
            "activation",
        "void jaxdnn::pool::(anonymous namespace)::window_fwd_kernel<float>()": "pooling",
        "select_and_scatter_fusion": "pooling",
        "void jaxdnn::softmax::(anonymous namespace)::softmax_rows_kernel<float>()": "softmax",
        "MemcpyD2D": "memcpy / memset",
        "loop_convert_fusion": "XLA fusions",
        "input_reduce_fusion_3": "XLA fusions",
        "fusion.12": "XLA fusions",
        "copy.5": "XLA fusions",
        "void cub::DeviceReduceKernel<float>()": "other",
    }
    assert {name: profile_step.category(name) for name in expected} == expected


def test_profile_step_breakdown(profile_step):
    """GPU events summed per category and per step; host events and the other metadata left
    out; the total row adds the categories up."""
    def kernel(pid, name, dur):
        return {"ph": "X", "pid": pid, "tid": 7, "ts": 0.0, "dur": dur, "name": name}

    conv = "void jaxdnn::conv::(anonymous namespace)::gemm_kernel<float>()"
    trace = {"displayTimeUnit": "ns", "traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 2, "tid": 7, "name": "thread_name", "args": {"name": "Stream #1"}},
        kernel(1, "PjitFunction(step)", 9000.0),
        kernel(2, conv, 300.0), kernel(2, conv, 500.0), kernel(2, "loop_add_fusion", 100.0),
        kernel(2, "void cub::DeviceReduceKernel<float>()", 20.0),
    ]}
    parts = profile_step.breakdown(trace, steps=2)
    assert list(parts) == profile_step.CATEGORY_NAMES
    assert parts["convolution / GEMM"] == {"ms": pytest.approx(0.4), "kernels": 1.0}
    assert parts["XLA fusions"] == {"ms": pytest.approx(0.05), "kernels": 0.5}
    assert parts["other"] == {"ms": pytest.approx(0.01), "kernels": 0.5}
    assert parts["normalization"] == {"ms": 0.0, "kernels": 0.0}
    assert profile_step.top_kernels(trace, 2, 2) == [(conv, pytest.approx(0.4)),
                                                     ("loop_add_fusion", pytest.approx(0.05))]
    rows = profile_step.rows_of({"lax": parts, "jaxdnn": parts})
    assert [r["category"] for r in rows] == profile_step.CATEGORY_NAMES + ["total"]
    assert rows[-1]["jaxdnn_ms"] == pytest.approx(0.46)
    assert rows[-1]["lax_kernels"] == pytest.approx(2.0)


def test_bench_scaling_quick(tmp_path):
    """benchmarks/bench_scaling.py --quick on 2 forced CPU devices: one device without and with
    a mesh, then two; jaxdnn's step runs no collective on one device and all-reduces on two."""
    env = subprocess_env(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_scaling.py"), "--quick", "--models", "cnn",
         "--out-dir", str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads((tmp_path / "scaling-cpu-cpu.json").read_text())["rows"]
    assert [(r["devices"], r["batch"]) for r in rows] == [("1", 2), ("1 mesh", 2), ("2", 4)]
    assert rows[0]["jaxdnn_collectives"] == rows[1]["jaxdnn_collectives"] == "none"
    assert "ar" in rows[2]["jaxdnn_collectives"]
    for r in rows:
        assert r["ratio"] == pytest.approx(r["jaxdnn_img_s"] / r["lax_img_s"])
    assert rows[0]["jaxdnn_scaling"] == rows[0]["lax_scaling"] == 1.0
