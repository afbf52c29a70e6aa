"""Test-suite setup: float64 on, outputs poisoned, and the platforms to run on."""

import os

# Every jaxdnn handler fills its outputs with NaN before its kernel runs (cc/ffi/common.h), so
# an element a kernel forgets to write fails the comparison. Must be set before the first call.
os.environ.setdefault("JAXDNN_POISON_OUTPUTS", "1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
