"""The test helpers themselves: assert_close's bounds catch one wrong element among 100k and
tell TF32 from bfloat16 rounding, while legit rounding passes; JAXDNN_REQUIRE_GPU=1 turns a
missing GPU into a failure."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

from util import ROOT, assert_close, rel_l2, subprocess_env, tolerance

M, N = 400, 250  # 100k outputs
KINDS = ("float32", "tf32", "float16", "bfloat16")


def _tf32(a, truncate=False):
    """float32 rounded to TF32's 10 mantissa bits: to nearest (ties away, as cvt.rna.tf32), or
    truncated (a tensor core fed unrounded float32 ignores the low 13 bits)."""
    bits = np.asarray(a, np.float32).view(np.uint32)
    if not truncate:
        bits = bits + np.uint32(0x1000)
    return (bits & np.uint32(0xFFFFE000)).view(np.float32)


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _gemm(kind, k, seed):
    """A reduction of length k onto M x N outputs as `kind` computes it: (operands, reference,
    scale, result). The reference is the float64 product of the operands the kernel reads;
    scale = sqrt(x**2 @ w**2), the L2 norm of the terms of each output."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, k)).astype(np.float32)
    w = rng.standard_normal((k, N)).astype(np.float32)
    if kind in ("float16", "bfloat16"):  # 16-bit operands, float32 accumulation, 16-bit result
        dt = np.float16 if kind == "float16" else ml_dtypes.bfloat16
        x, w = x.astype(dt).astype(np.float32), w.astype(dt).astype(np.float32)
        out = (x @ w).astype(dt)
    elif kind == "tf32":  # float32 operands read as TF32 (truncated: the larger error)
        out = _tf32(x, truncate=True) @ _tf32(w, truncate=True)
    else:  # float32, accumulated one term at a time (the largest accumulation error)
        out = np.zeros((M, N), np.float32)
        for j in range(k):
            out += x[:, j:j + 1] * w[j]
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    return (x64, w64), x64 @ w64, np.sqrt(np.square(x64) @ np.square(w64)), out


@pytest.mark.parametrize("k", [27, 576, 4608])
@pytest.mark.parametrize("kind", KINDS)
def test_legit_rounding_passes(kind, k):
    _, ref, scale, out = _gemm(kind, k, seed=k)
    assert_close(out, ref, kind, scale=scale, k=k)
    assert_close(out, ref, kind, k=k)  # with the default scale, the RMS of ref


@pytest.mark.parametrize("fault", ["unwritten", "missing_term", "sign"])
@pytest.mark.parametrize("kind", KINDS)
def test_one_wrong_element_among_100k_fails(kind, fault):
    """One output off (left zero, one of its 576 terms dropped, or negated) fails the
    elementwise bound. The relative L2 bound alone lets a dropped term through for the 16-bit
    and TF32 tolerances, and an unwritten element for the 16-bit ones (one element of 100k
    moves the L2 error by ~1/316 of its size)."""
    k = 576
    (x, w), ref, scale, out = _gemm(kind, k, seed=1)
    out = np.asarray(out, np.float64)
    i, j = np.unravel_index(np.argmin(np.abs(np.abs(ref) / scale - 1.0)), ref.shape)
    bad = out.copy()
    if fault == "unwritten":
        bad[i, j] = 0.0
    elif fault == "missing_term":
        terms = x[i] * w[:, j]
        bad[i, j] -= terms[np.argmax(np.abs(terms))]
    else:
        bad[i, j] = -bad[i, j]
    if fault == "missing_term" and kind != "float32" or fault == "unwritten" and \
            kind in ("float16", "bfloat16"):
        assert rel_l2(bad, ref) <= tolerance(kind).rel_l2  # the L2 bound misses it
    with pytest.raises(AssertionError, match=rf"1 of {M * N} elements outside the elementwise"):
        assert_close(bad, ref, kind, scale=scale, k=k)
    with pytest.raises(AssertionError, match="elementwise"):
        assert_close(bad, ref, kind, k=k)


@pytest.mark.parametrize("k", [27, 576, 4608])
def test_tf32_tolerance_tells_tf32_from_bfloat16(k):
    """float32 operands read as TF32 (rounded or truncated) pass the TF32 tolerance; read as
    bfloat16 (7 mantissa bits instead of 10: ~8x the error) they fail it, although their
    relative L2 error (~2.3e-3) is inside TF32's 3e-3."""
    rng = np.random.default_rng(k)
    x = rng.standard_normal((M, k)).astype(np.float32)
    w = rng.standard_normal((k, N)).astype(np.float32)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref, scale = x64 @ w64, np.sqrt(np.square(x64) @ np.square(w64))
    for truncate in (False, True):
        assert_close(_tf32(x, truncate) @ _tf32(w, truncate), ref, "tf32", scale=scale, k=k)
    as_bf16 = _bf16(x) @ _bf16(w)
    assert rel_l2(as_bf16, ref) <= tolerance("tf32").rel_l2
    with pytest.raises(AssertionError, match="elementwise"):
        assert_close(as_bf16, ref, "tf32", scale=scale, k=k)
    # float32 itself is tighter still: TF32 fails it.
    with pytest.raises(AssertionError):
        assert_close(_tf32(x) @ _tf32(w), ref, "float32", scale=scale, k=k)


def test_poisoned_element_fails():
    _, ref, scale, out = _gemm("bfloat16", 27, seed=2)
    out = np.asarray(out, np.float64)
    out[7, 9] = np.nan
    with pytest.raises(AssertionError, match="NaN"):
        assert_close(out, ref, "bfloat16", scale=scale, k=27)


def test_zero_scale_needs_exact_zeros():
    """Outputs that sum no terms (scale 0, e.g. outside every window) must be exactly zero."""
    ref = np.zeros(10)
    assert_close(np.zeros(10), ref, np.float32, scale=np.zeros(10))
    with pytest.raises(AssertionError, match="elementwise"):
        assert_close(np.full(10, 1e-30), ref, np.float32, scale=np.zeros(10))


def test_scale_loosens_the_elementwise_bound():
    """A computation whose errors follow larger intermediates than its result passes with the
    scale of those intermediates, and only then."""
    _, ref, scale, out = _gemm("float32", 27, seed=3)
    noisy = out + 1e-4 * scale * np.random.default_rng(0).standard_normal(ref.shape)
    with pytest.raises(AssertionError, match="elementwise"):
        assert_close(noisy, ref, np.float32, tol=1e-3, scale=scale, k=27)
    assert_close(noisy, ref, np.float32, tol=1e-3, scale=1000 * scale, k=27)


# ---- JAXDNN_REQUIRE_GPU ------------------------------------------------------------------------

TINY = """
    import pytest
    from util import PLATFORMS, device, needs_gpu

    @pytest.mark.parametrize("platform", PLATFORMS)
    def test_tiny(platform):
        device(platform)

    @needs_gpu
    def test_marked():
        pass
"""


def _pytest(tmp_path, source, require=False):
    """pytest in a subprocess over one test file of `source`, with the suite's conftest, on a
    machine made GPU-less (JAX_PLATFORMS=cpu)."""
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent(source))
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    env = {k: v for k, v in subprocess_env(ROOT / "tests", JAX_PLATFORMS="cpu",
                                           CUDA_VISIBLE_DEVICES="").items()
           if k not in ("JAXDNN_REQUIRE_GPU", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    if require:
        env["JAXDNN_REQUIRE_GPU"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-rA", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_require_flag_turns_a_missing_device_into_failure(tmp_path):
    plain = _pytest(tmp_path, TINY)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "1 passed, 2 skipped" in plain.stdout, plain.stdout
    assert "GPU tests: 0 passed" in plain.stdout, plain.stdout

    strict = _pytest(tmp_path, TINY, require=True)
    assert strict.returncode != 0, strict.stdout + strict.stderr
    # test_tiny[gpu] fails in its call, test_marked in its setup (its skip mark): an error.
    assert "1 failed, 1 passed" in strict.stdout and "1 error" in strict.stdout, strict.stdout
    assert "JAXDNN_REQUIRE_GPU=1" in strict.stdout, strict.stdout
    assert "no GPU test passed" in strict.stdout, strict.stdout


def test_summary_counts_the_device_tests(tmp_path):
    """The end-of-run line counts tests with the gpu marker or a "gpu" parameter, not those
    that only have `gpu` in their name (such as test_gpu_heuristic_*, which run on the CPU)."""
    out = _pytest(tmp_path, """
        import pytest

        @pytest.mark.parametrize("platform", ["cpu", "gpu"])
        def test_param(platform):
            pass

        @pytest.mark.gpu
        def test_marked():
            pass

        def test_gpu_logic_on_the_cpu():
            pass
    """)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "GPU tests: 2 passed" in out.stdout, out.stdout
