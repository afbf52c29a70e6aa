"""Shared test helpers: random inputs, dtype tolerances, platforms, reference comparison."""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdnn
from jaxdnn import _ffi

DTYPES = (jnp.float32, jnp.float64, jnp.float16, jnp.bfloat16)


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """The two bounds of DESIGN.md section 5 for one kind of arithmetic.

    rel_l2: relative L2 error over the whole output.
    rtol, atol, acc: the elementwise bound
        |out - ref| <= rtol * |ref| + scale * (atol + acc * sqrt(k))
    where `scale` is the magnitude of what each output sums (see assert_close) and `k` the
    length of the reduction: rtol covers the rounding of the result, atol the rounding of the
    operands and intermediates (relative to the terms, not to their sum, which may cancel), acc
    the accumulation's rounding, which grows with the reduction.
    """

    rel_l2: float
    rtol: float
    atol: float
    acc: float


_U64, _U32 = 2.0 ** -53, 2.0 ** -24  # unit roundoff (half an ulp of 1) of float64, float32

# Keyed by the arithmetic: a dtype's name, or "tf32" for float32 operands rounded to TF32
# (10 mantissa bits; a tensor core may truncate rather than round, so its operands carry up to
# 2^-10 relative error each and a bias of the same size, hence rtol = 2^-10). 16-bit and TF32
# computations accumulate in float32. The atol of TF32 (6 units of 2^-11) sits at ~7 standard
# deviations of TF32's operand rounding error and ~1.5 of bfloat16's (2^-8 per operand), so
# legit TF32 passes and a computation that rounds to bfloat16 somewhere fails
# (tests/test_util.py shows both).
TOLERANCES = {
    "float64": Tolerance(rel_l2=1e-10, rtol=64 * _U64, atol=64 * _U64, acc=8 * _U64),
    "float32": Tolerance(rel_l2=1e-5, rtol=32 * _U32, atol=32 * _U32, acc=8 * _U32),
    "tf32": Tolerance(rel_l2=3e-3, rtol=2.0 ** -10, atol=6 * 2.0 ** -11, acc=8 * _U32),
    "float16": Tolerance(rel_l2=1e-2, rtol=2.0 ** -10, atol=2.0 ** -9, acc=8 * _U32),
    "bfloat16": Tolerance(rel_l2=1e-2, rtol=2.0 ** -7, atol=2.0 ** -6, acc=8 * _U32),
}

# Relative L2 error allowed per dtype (DESIGN.md section 5).
TOL = {np.dtype(getattr(jnp, k)): t.rel_l2 for k, t in TOLERANCES.items() if k != "tf32"}


def tolerance(dtype) -> Tolerance:
    """The Tolerance of a dtype, or of "tf32"."""
    return TOLERANCES["tf32" if isinstance(dtype, str) and dtype == "tf32" else
                      np.dtype(dtype).name]


# Every skip for want of a GPU or of the CUDA module gives a reason that starts with GPU_SKIP:
# with JAXDNN_REQUIRE_GPU=1 (dev/device.sh sets it on the GPU machine) tests/conftest.py turns
# those skips into failures.
GPU_SKIP = "no usable GPU"


@functools.cache
def gpu_missing() -> str | None:
    """Why jaxdnn cannot run on a GPU here (None when it can)."""
    if _ffi._cuda is None:
        return f"{GPU_SKIP}: jaxdnn was built without CUDA"
    try:
        if jax.devices("gpu"):
            return None
    except RuntimeError:
        pass
    return f"{GPU_SKIP}: jax sees no GPU"


def has_gpu() -> bool:
    """Whether jaxdnn can run on a GPU here (a GPU and the CUDA module)."""
    return gpu_missing() is None


def cuda_module_missing() -> str | None:
    """Why the CUDA module is absent (None when it is there): registry and lowering tests need
    it, not a GPU."""
    return None if _ffi._cuda is not None else f"{GPU_SKIP}: jaxdnn was built without CUDA"


# Marks of tests that need a GPU: skipped without one (failed under JAXDNN_REQUIRE_GPU=1, by
# tests/conftest.py); `gpu` also selects them for `pytest -k gpu`. As a module's pytestmark, or
# one test's decorator through needs_gpu.
GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(not has_gpu(), reason=str(gpu_missing()))]
# Registry and lowering tests need the CUDA module, not a GPU.
needs_cuda_module = pytest.mark.skipif(cuda_module_missing() is not None,
                                       reason=str(cuda_module_missing()))


def needs_gpu(f):
    """Decorator: the GPU_MARKS."""
    for mark in GPU_MARKS:
        f = mark(f)
    return f


# Platforms every op test runs on: the CPU always, the GPU when there is one.
PLATFORMS = ("cpu", "gpu")


def device(platform: str):
    """The first device of `platform`, or skip the test when jaxdnn cannot run there."""
    if platform == "gpu" and not has_gpu():
        pytest.skip(gpu_missing())
    return jax.devices(platform)[0]


def rand(rng: np.random.Generator, shape, dtype=jnp.float32, *, scale=1.0, offset=0.0):
    """Random normal values (never zeros) as a numpy array of `dtype`."""
    a = rng.standard_normal(shape) * scale + offset
    return np.asarray(a, dtype=np.dtype(dtype))


def on(platform: str, *arrays):
    """`arrays` placed on `platform`'s device (computations follow their inputs)."""
    d = device(platform)
    out = tuple(jax.device_put(a, d) for a in arrays)
    return out[0] if len(out) == 1 else out


def rel_l2(out, ref) -> float:
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    denom = np.linalg.norm(ref.ravel())
    err = np.linalg.norm((out - ref).ravel())
    return float(err / denom) if denom > 0 else float(err)


def rms(a) -> float:
    """Root mean square of an array (0 for an empty one)."""
    a = np.asarray(a, np.float64)
    return float(np.sqrt(np.mean(np.square(a)))) if a.size else 0.0


# Algorithms whose float32 arithmetic errs more than a sum of products, by about this factor:
# Winograd F(4x4, 3x3) (winograd_nonfused) transforms tiles with coefficients up to 8 and sums
# the transformed products, which cancel (Lavin & Gray 2016); measured on an H100, its float32
# errors reach about 7x the bound a direct sum meets. (In 16 bits the inputs' rounding
# dominates.)
ERROR_GROWTH = {"winograd_nonfused": 16.0}


def error_growth(algorithm: str, arithmetic) -> float:
    """The factor on assert_close's elementwise bound for an algorithm's (concrete) name in an
    arithmetic (a dtype, or "tf32")."""
    exact_f32 = not isinstance(arithmetic, str) and np.dtype(arithmetic) == np.float32
    return ERROR_GROWTH.get(algorithm.split(".")[0], 1.0) if exact_f32 or \
        arithmetic == "float32" else 1.0


def assert_close(out, ref, dtype, *, tol=None, scale=None, k=1, what="", growth=1.0):
    """`out` against a float64 reference `ref` by the two bounds of DESIGN.md section 5, with
    NaN and inf exactly where the reference has them (a NaN the reference lacks, such as a
    poisoned element the kernel never wrote, always fails).

    dtype: the arithmetic whose tolerance applies (a dtype, or "tf32").
    tol: a relative L2 tolerance in place of the dtype's, for a computation known to be less
      accurate (the elementwise bound takes that through `scale`).
    scale: per output (broadcastable to ref), the magnitude of the terms it sums: for a
      bilinear op such as a convolution sqrt(op(x**2, w**2)), the L2 norm of the products each
      output adds up (op(|x|, |w|), their L1 norm, is a looser alternative). Default: the RMS
      of the finite reference values, which is about that for random operands.
    k: the length of the reduction behind each output (1 for elementwise ops).
    growth: a factor on the elementwise bound, for an algorithm known to err more than a direct
      sum (error_growth).
    """
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != reference {ref.shape}"
    assert np.array_equal(np.isnan(out), np.isnan(ref)), \
        f"{what}: NaN where the reference has none (or the reverse)"
    inf = np.isinf(ref)
    assert np.array_equal(out[inf], ref[inf]), f"{what}: infinities differ from the reference"
    finite = np.isfinite(ref)
    assert np.isfinite(out[finite]).all(), f"{what}: inf where the reference is finite"
    t = tolerance(dtype)
    if tol is not None:
        t = dataclasses.replace(t, rel_l2=tol)
    if scale is None:
        scale = rms(ref[finite])
    scale = np.broadcast_to(np.asarray(scale, np.float64), ref.shape)
    bound = growth * (np.where(finite, t.rtol * np.abs(np.where(finite, ref, 0.0)), 0.0) +
                      scale * (t.atol + t.acc * np.sqrt(k)))
    diff = np.zeros(ref.shape)
    diff[finite] = np.abs(out[finite] - ref[finite])
    bad = diff > bound
    if bad.any():
        ratio = np.where(bad, diff / np.maximum(bound, np.finfo(np.float64).tiny), 0.0)
        i = np.unravel_index(np.argmax(ratio), ref.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {ref.size} elements outside the elementwise bound "
            f"|out - ref| <= {t.rtol:.2e} * |ref| + scale * ({t.atol:.2e} + {t.acc:.2e} * "
            f"sqrt({k})); worst at {tuple(int(v) for v in i)}: out {out[i]!r}, ref {ref[i]!r}, "
            f"|diff| {diff[i]:.3e} > bound {bound[i]:.3e} (scale {scale[i]:.3e})")
    err = rel_l2(out[finite], ref[finite])
    assert err <= t.rel_l2, f"{what}: relative L2 error {err:.3e} > {t.rel_l2:.1e}"


ROOT = pathlib.Path(__file__).resolve().parents[1]
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")


def run_host_check(source: str, tmp_path) -> str:
    """Builds the host program tests/native/<source> (a check of device-code logic that runs on
    the CPU), runs it, asserts that it succeeded and returns what it printed."""
    exe = tmp_path / pathlib.Path(source).stem
    src = ROOT / "tests" / "native" / source
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{ROOT}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def subprocess_env(*paths, **variables) -> dict:
    """The environment for a Python subprocess of a test: this one's, plus `variables`, with
    `paths` and the folder of the jaxdnn this process imported on PYTHONPATH, so that the child
    imports the same build (the installed package in CI, the source tree of an in-place
    developer build). Run the child outside the source tree (cwd=tmp_path): a cwd holding the
    uncompiled jaxdnn/ folder would shadow an installed package."""
    package_parent = str(pathlib.Path(jaxdnn.__file__).resolve().parents[1])
    env = dict(os.environ, **variables)
    env["PYTHONPATH"] = os.pathsep.join(
        [*map(str, paths), package_parent, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def by_base(infos):
    """{base name: the info of its default variant} of a conv_algorithms listing (a GPU
    algorithm's name is its concrete variant, cc/conv/variant.h)."""
    return {a.base: a for a in infos if a.default}
