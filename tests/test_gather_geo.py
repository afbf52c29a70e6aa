"""The gathers' geometry (cc/conv/gather_geo.h), which every CUDA GEMM conv kernel and its
table, im2col and col2im kernels use: its host program (dev/check_gather_geo.cc) checks the
pixel each GEMM row reads through each tap, one tap at a time and walking all taps, against
conv.h's in_idx / out_idx on random strided, padded and dilated problems, without a GPU."""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_gathered_pixels_match_the_conv_index_functions(tmp_path):
    exe = tmp_path / "check_gather_geo"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{ROOT}",
                    str(ROOT / "dev" / "check_gather_geo.cc"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("ok: 362 problems"), out.stdout
