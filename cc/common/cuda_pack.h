// Pack<T, kVector>: the unit a memory-bound kernel moves per access. A 16-byte Vec<T> when the
// data is 16-byte aligned (kVector), otherwise a single element: the same kernel code then
// serves unaligned pointers and ragged row lengths, only with narrower accesses.
#pragma once

#include <type_traits>

#include "cc/common/cuda_vec.h"

namespace jaxdnn::cuda {

template <typename T>
struct Single {
  static constexpr int kN = 1;
  T v[1];

  __device__ __forceinline__ static Single load(const T* p) { return {{*p}}; }
  __device__ __forceinline__ static Single load_stream(const T* p) { return {{__ldcs(p)}}; }
  __device__ __forceinline__ void store(T* p) const { *p = v[0]; }
  __device__ __forceinline__ void store_stream(T* p) const { __stcs(p, v[0]); }
};

template <typename T, bool kVector>
using Pack = std::conditional_t<kVector, Vec<T>, Single<T>>;

}  // namespace jaxdnn::cuda
