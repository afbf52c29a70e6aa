// Helpers for CUDA handlers.
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>

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

// The CUDA side of a handler body that both platforms share (cpu_common.h: CpuPlatform): the
// handler binds XLA's stream, enqueues its kernels there and does no allocation or
// synchronisation, so it is CUDA-graph compatible.
struct CudaPlatform {
  using Context = cudaStream_t;
  static constexpr std::initializer_list<ffi::Traits> kTraits = {
      ffi::Traits::kCmdBufferCompatible};
  static auto bind() { return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>(); }
  static cudaStream_t exec(cudaStream_t stream) { return stream; }
  static ffi::Error poison(ffi::AnyBuffer& result, cudaStream_t stream) {
    return poison_device(result, stream);
  }
};

}  // namespace jaxdnn::ffi_util
