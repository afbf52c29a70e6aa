// Asynchronous global -> shared copies (cp.async, sm_80+): no trip through registers, so a
// thread can have hundreds of bytes in flight while it computes. A thread's copies become
// visible to that thread after a wait (cp_async_wait<N> for committed groups, or
// cp_async_wait_all); other threads of the block see them only after a barrier as well.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jaxdnn::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes at src (global, 16-byte aligned) to shared address dst (16-byte aligned), or
// writes 16 zero bytes when !pred (nothing is read then).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred = true) {
  cp_async16(smem_addr(dst), src, pred);
}

// The same for 8 or 4 bytes (through L1: the 16-byte-only .cg form does not apply).
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(pred ? 8 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(pred ? 4 : 0));
}

// Closes the group of the copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }

// Waits until at most N of the thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Waits for every cp.async this thread issued.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

}  // namespace jaxdnn::cuda
