// Helpers for CUDA handlers.
#pragma once

#include <cuda_runtime.h>

#include "cc/ffi/common.h"

namespace jaxdnn::ffi_util {

// See poison_outputs() in common.h. A memset on XLA's stream: graph-capture safe.
inline ffi::Error poison_device(ffi::AnyBuffer& result, cudaStream_t stream) {
  if (!poison_outputs() || result.size_bytes() == 0) return ffi::Error::Success();
  cudaError_t e = cudaMemsetAsync(result.untyped_data(), 0xFF, result.size_bytes(), stream);
  if (e != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxdnn: poisoning an output failed: ") +
                                cudaGetErrorString(e));
  return ffi::Error::Success();
}

}  // namespace jaxdnn::ffi_util
