"""README.md's performance tables are what benchmarks/report.py renders from the committed
results (no GPU needed): regenerate them with `python benchmarks/report.py` after a benchmark
run."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = os.path.join(ROOT, "benchmarks", "report.py")


def test_readme_tables_are_current():
    run = subprocess.run([sys.executable, REPORT, "--check"], capture_output=True, text=True,
                         cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr


def test_old_method_tables_say_so(tmp_path):
    """A result without `method` in its environment renders with an old-method source line; one
    with it does not."""
    rows = [{"op": "relu", "dtype": "float32", "direction": "fwd", "shape": "8x8", "ratio": 1.5}]
    for name, env in (("activation", {}), ("softmax", {"method": 2})):
        env.update(date="2026-01-01", device="cpu", platform="cpu", jax="0.10.2", cpu_count=2)
        with open(tmp_path / f"{name}-cpu-cpu.json", "w") as f:
            json.dump({"environment": env, "notes": "", "rows": rows}, f)
    block = subprocess.run([sys.executable, REPORT, "--print", "--results", str(tmp_path)],
                           capture_output=True, text=True, check=True).stdout
    softmax, activation = block.split("**Activations")
    assert "old method" in activation and "old method" not in softmax
    assert "| CPU, 2 cores | fwd | 1.5x (lowest 1.5x relu) |" in block


def test_e2e_table(tmp_path):
    """bench_e2e's rows render one per configuration; profile_step's breakdown stays out of the
    README."""
    env = {"date": "2026-01-01", "device": "NVIDIA H100 80GB HBM3", "platform": "gpu",
           "jax": "0.11.2", "cpu_count": 16, "method": 2}
    row = {"model": "resnet50", "input": "224x224x3", "dtype": "bfloat16", "batch": 256,
           "lax_img_s": 2500.4, "jaxdnn_img_s": 2000.0, "ratio": 0.8, "loss_rel_diff": 1.23e-3}
    for name, rows in (("e2e", [row]), ("e2e_profile", [{"category": "total", "lax_ms": 1.0}])):
        with open(tmp_path / f"{name}-gpu-H100.json", "w") as f:
            json.dump({"environment": dict(env, benchmark=name), "notes": "", "rows": rows}, f)
    block = subprocess.run([sys.executable, REPORT, "--print", "--results", str(tmp_path)],
                           capture_output=True, text=True, check=True).stdout
    assert ("| NVIDIA H100 80GB HBM3 | resnet50 224x224x3 | bfloat16 | 256 | 2500 | 2000 | 0.8x | "
            "1.2e-03 |") in block
    assert "e2e_profile" not in block and block.count("**End-to-end") == 1


def test_new_tables(tmp_path):
    """bench_conv_gpu.py --table results render one row per (table, dtype) from their geomean
    rows; bench_fused.py's per (family, baseline, direction); neither joins the ResNet-50 or the
    norm table."""
    env = {"date": "2026-01-01", "device": "NVIDIA H200", "platform": "gpu", "jax": "0.11.2",
           "cpu_count": 16, "method": 2}
    conv = [{"layer": "g3x3_128_32g", "dtype": "bfloat16", "dir": "fwd", "ratio": 2.0},
            {"layer": "geomean (grouped)", "dtype": "bfloat16", "dir": "fwd", "ratio": 2.0},
            {"layer": "geomean (grouped)", "dtype": "bfloat16", "dir": "bwd_data", "ratio": 0.5}]
    fused = [{"op": "bn+add+relu", "baseline": b, "dtype": "bfloat16", "direction": "fwd",
              "shape": "64x56x56x256", "ratio": r} for b, r in (("XLA", 1.1), ("jaxdnn chain",
                                                                                1.6))]
    for name, rows in (("conv_gpu_grouped", conv), ("norm_fused", fused)):
        with open(tmp_path / f"{name}-gpu-H200.json", "w") as f:
            json.dump({"environment": dict(env, benchmark=name), "notes": "", "rows": rows}, f)
    block = subprocess.run([sys.executable, REPORT, "--print", "--results", str(tmp_path)],
                           capture_output=True, text=True, check=True).stdout
    assert "| NVIDIA H200 | grouped | bfloat16 | 2x | 0.5x |" in block
    assert ("| NVIDIA H200 (norm_fused) | fwd vs XLA | 1.1x (lowest 1.1x bn+add+relu "
            "64x56x56x256) |") in block
    assert "| NVIDIA H200 (norm_fused) | fwd vs jaxdnn chain | 1.6x" in block
    assert "**Convolution, ResNet-50" not in block and "**Normalization**" not in block
