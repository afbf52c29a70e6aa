// 16-byte vector access for memory-bound CUDA kernels.
//
// Vec<T> holds kVecBytes / sizeof(T) elements (4 floats, 8 halves/bfloat16s, 2 doubles) and
// moves them with one 128-bit load or store, the widest access a thread can issue; a warp then
// moves 512 contiguous bytes per instruction. Callers handle the ragged tail (and rows whose
// start is not 16-byte aligned) with scalar code: `vec_aligned()` tells which path is legal.
#pragma once

#include <cstdint>

#include "cc/common/cuda_util.h"

namespace jaxdnn::cuda {

constexpr int kVecBytes = 16;

template <typename T>
struct alignas(kVecBytes) Vec {
  static constexpr int kN = kVecBytes / int(sizeof(T));
  T v[kN];

  __device__ __forceinline__ static Vec load(const T* p) {
    return *reinterpret_cast<const Vec*>(p);
  }
  // Streaming load: the data is read once, so skip keeping it in L1.
  __device__ __forceinline__ static Vec load_stream(const T* p) {
    Vec r;
    *reinterpret_cast<int4*>(&r) = __ldcs(reinterpret_cast<const int4*>(p));
    return r;
  }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Vec*>(p) = *this; }
  __device__ __forceinline__ void store_stream(T* p) const {
    __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(this));
  }
};

__host__ __device__ __forceinline__ bool vec_aligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) % kVecBytes) == 0;
}

}  // namespace jaxdnn::cuda
