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
