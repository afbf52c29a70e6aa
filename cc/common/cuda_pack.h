// Pack<T, kVector>: the unit a memory-bound kernel moves per access. A 16-byte Vec<T> when the
// data is 16-byte aligned (kVector), otherwise a single element: the same kernel code then
// serves unaligned pointers and ragged row lengths, only with narrower accesses. HeldPack is
// a loaded pack as kernels keep it in registers; store_acc writes one from accumulators.
#pragma once

#include <cstring>
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

// A pack as loaded into registers, read element by element in the accumulator type. 16-bit
// packs stay 32-bit words of two elements, split on use: held as T[8], each element would
// take a register of its own, doubling the registers of every load in flight.
template <typename T, bool kVector>
struct HeldPack {
  using P = Pack<T, kVector>;
  static constexpr int kN = P::kN;
  static constexpr bool kPaired = kVector && sizeof(T) == 2;
  static constexpr int kWords = kPaired ? kVecBytes / 4 : 1;
  using Word = std::conditional_t<kPaired, unsigned, P>;
  Word w[kWords];

  __device__ __forceinline__ static HeldPack load(const T* p) {
    const P v = P::load(p);
    HeldPack h;
    std::memcpy(h.w, &v, sizeof(P));
    return h;
  }

  __device__ __forceinline__ dev_acc_t<T> operator[](int e) const {
    if constexpr (kPaired) {
      const float2 f = unpack_acc<T>(w[e / 2]);
      return e % 2 ? f.y : f.x;
    } else {
      return to_acc(w[0].v[e]);
    }
  }

  // Between two passes over paired 16-bit values: an optimisation barrier on the words (it
  // emits no instruction), so that values derived from them (floats, x - max, exp) are
  // recomputed in the next pass rather than kept live across it, which would double the
  // registers they cost. No-op otherwise (one value per register already).
  __device__ __forceinline__ void fence() {
    if constexpr (kPaired) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) asm volatile("" : "+r"(w[i]));
    }
  }
};

// Stores the pack at p from y, rounded from the accumulator type.
template <typename T, bool kVector, typename A>
__device__ __forceinline__ void store_acc(T* p, const A (&y)[Pack<T, kVector>::kN]) {
  Pack<T, kVector> r;
#pragma unroll
  for (int e = 0; e < Pack<T, kVector>::kN; ++e) r.v[e] = from_acc<T>(y[e]);
  r.store(p);
}

}  // namespace jaxdnn::cuda
