// Asynchronous global -> shared copies (cp.async, sm_80+): 16 bytes per instruction, no trip
// through registers, so a thread can have hundreds of bytes in flight while it computes.
// A thread's copies become visible to that thread after cp_async_wait_all(); other threads
// of the block see them only after a barrier as well.
#pragma once

#include <cuda_runtime.h>

namespace jaxdnn::cuda {

// Copies the 16 bytes at src (global, 16-byte aligned) to dst (shared, 16-byte aligned).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__)
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
#endif
}

// Waits for every cp.async this thread issued.
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

}  // namespace jaxdnn::cuda
