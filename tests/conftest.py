"""Test-suite setup: float64 on, outputs poisoned, and the platforms to run on."""

import os

# Every jaxdnn handler fills its outputs with NaN before its kernel runs (cc/ffi/common.h), so
# an element a kernel forgets to write fails the comparison. Must be set before the first call.
os.environ.setdefault("JAXDNN_POISON_OUTPUTS", "1")
# 256-column conv tiles only pay on large GEMMs (wide_plan, cc/conv/cuda_gemm_conv.cuh); the
# test problems are small, so take them wherever they apply (split in two where the reduction
# allows), or they would go untested.
os.environ.setdefault("JAXDNN_CONV_BN256", "1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
