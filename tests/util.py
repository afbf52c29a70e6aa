"""Shared test helpers: random inputs, dtype tolerances, platforms, reference comparison."""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

DTYPES = (jnp.float32, jnp.float64, jnp.float16, jnp.bfloat16)

# Relative L2 error allowed per dtype (DESIGN.md section 5).
TOL = {
    np.dtype(jnp.float64): 1e-10,
    np.dtype(jnp.float32): 1e-5,
    np.dtype(jnp.float16): 1e-2,
    np.dtype(jnp.bfloat16): 1e-2,
}


@functools.cache
def has_gpu() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


# Platforms every op test runs on: the CPU always, the GPU when there is one.
PLATFORMS = ("cpu", "gpu")


def device(platform: str):
    """The first device of `platform`, or skip the test when there is none."""
    if platform == "gpu" and not has_gpu():
        pytest.skip("no GPU")
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


def assert_close(out, ref, dtype, *, tol=None, what=""):
    """Relative L2 error over the finite reference values within the dtype's tolerance, with
    NaN and inf exactly where the reference has them. A NaN the reference lacks (for example
    a poisoned element the kernel never wrote) always fails."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != reference {ref.shape}"
    assert np.array_equal(np.isnan(out), np.isnan(ref)), \
        f"{what}: NaN where the reference has none (or the reverse)"
    inf = np.isinf(ref)
    assert np.array_equal(out[inf], ref[inf]), f"{what}: infinities differ from the reference"
    finite = np.isfinite(ref)
    assert np.isfinite(out[finite]).all(), f"{what}: inf where the reference is finite"
    tol = TOL[np.dtype(dtype)] if tol is None else tol
    err = rel_l2(out[finite], ref[finite])
    assert err <= tol, f"{what}: relative L2 error {err:.3e} > {tol:.1e}"


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: usable as a static argument
class ConvCase:
    """A named convolution problem: shapes plus jax.lax.conv_general_dilated keywords."""

    name: str
    x_shape: tuple
    w_shape: tuple
    kw: dict

    def __str__(self):
        return self.name


def channels_last(nd: int) -> tuple[str, str, str]:
    """conv dimension_numbers for channels-last data and a W..IO filter of `nd` spatial dims."""
    return {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"),
            3: ("NDHWC", "DHWIO", "NDHWC")}[nd]


ROOT = pathlib.Path(__file__).resolve().parents[1]
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")


def run_host_check(source: str, tmp_path) -> str:
    """Builds the host program dev/<source> (a check of device-code logic that runs on the
    CPU), runs it, asserts that it succeeded and returns what it printed."""
    exe = tmp_path / pathlib.Path(source).stem
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{ROOT}", str(ROOT / "dev" / source), "-o",
                    str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout
