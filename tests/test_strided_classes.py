"""The residue-class decomposition of strided bwd_data (cc/conv/strided_classes.h), which the
CUDA implicit_precomp_gemm runs: its host program (dev/check_strided_classes.cc) checks the
sub-problems, sub-filters and the dx scatter against a naive bwd_data on 400 random problems,
without a GPU."""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_strided_classes_match_naive_bwd_data(tmp_path):
    exe = tmp_path / "check_strided_classes"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{ROOT}",
                    str(ROOT / "dev" / "check_strided_classes.cc"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("ok: 400 problems"), out.stdout
