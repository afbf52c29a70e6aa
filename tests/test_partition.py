"""Partitioning rules under plain jit (jaxdnn/_partition.py): with NamedSharding operands on 8
forced CPU devices, every family's results equal the single-device ones, shardings its rule
passes through are not gathered, and a small conv+relu+pool+softmax network runs its forward
without a collective and its weight gradient with one all-reduce. Each family runs in a
subprocess (tests/partition_checks.py), since the device count is fixed when jax starts."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from util import subprocess_env

HERE = pathlib.Path(__file__).resolve().parent


@pytest.mark.parametrize("family", ["activation", "softmax", "pool", "conv", "norm", "network"])
def test_partition(family, tmp_path):
    env = subprocess_env(HERE, JAX_PLATFORMS="cpu",
                         XLA_FLAGS="--xla_force_host_platform_device_count=8")
    out = subprocess.run([sys.executable, str(HERE / "partition_checks.py"), family],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert f"{family} ok" in out.stdout
