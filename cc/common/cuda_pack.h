// Pack<T, kVector>: the unit a memory-bound kernel moves per access. A 16-byte Vec<T> when the
// data is 16-byte aligned (kVector), otherwise a single element: the same kernel code then
// serves unaligned pointers and ragged row lengths, only with narrower accesses.
//
// Two ways to hold a loaded 16-byte pack of a 16-bit type as four 32-bit words (two values per
// register) rather than as eight elements (nvcc then gives each element a register of its own,
// which costs a kernel with several vectors in flight ~16 registers, and so occupancy):
//   HeldPack  read element by element in the accumulator type (the row kernels' passes);
//   WordPack  converted as a whole to and from the accumulator type (unpack / pack, bf16x2 /
//             f16x2 conversions).
// store_acc writes a pack from accumulators. load_ro is the read-only load (ld.global.nc):
// global memory only, never written while the kernel runs.
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
  __device__ __forceinline__ static Single load_ro(const T* p) { return {{__ldg(p)}}; }
  __device__ __forceinline__ static Single load_stream(const T* p) { return {{__ldcs(p)}}; }
  __device__ __forceinline__ void store(T* p) const { *p = v[0]; }
  __device__ __forceinline__ void store_stream(T* p) const { __stcs(p, v[0]); }

  __device__ __forceinline__ void unpack(dev_acc_t<T> (&out)[1]) const { out[0] = to_acc(v[0]); }
  __device__ __forceinline__ static Single pack(const dev_acc_t<T> (&in)[1]) {
    return {{from_acc<T>(in[0])}};
  }
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

template <typename T>
struct Words {
  static constexpr int kN = kVecBytes / int(sizeof(T));
  uint4 w;

  __device__ __forceinline__ static Words load(const T* p) {
    return {*reinterpret_cast<const uint4*>(p)};
  }
  __device__ __forceinline__ static Words load_ro(const T* p) {
    return {__ldg(reinterpret_cast<const uint4*>(p))};
  }
  __device__ __forceinline__ static Words load_stream(const T* p) {
    return {__ldcs(reinterpret_cast<const uint4*>(p))};
  }
  __device__ __forceinline__ void store_stream(T* p) const {
    __stcs(reinterpret_cast<uint4*>(p), w);
  }

  __device__ __forceinline__ void unpack(dev_acc_t<T> (&out)[kN]) const {
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        out[i] = __uint_as_float(u[i]);
      } else if constexpr (std::is_same_v<T, double>) {
        if (i % 2 == 0) out[i / 2] = __hiloint2double(int(u[i + 1]), int(u[i]));
      } else {
        const float2 f = unpack_acc<T>(u[i]);  // bfloat16 or half
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
      }
    }
  }

  // Rounds to nearest even (bf16x2 / f16x2 conversions: the same results as one at a time).
  __device__ __forceinline__ static Words pack(const dev_acc_t<T> (&in)[kN]) {
    unsigned u[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        u[i] = __float_as_uint(in[i]);
      } else if constexpr (std::is_same_v<T, double>) {
        u[i] = unsigned(i % 2 == 0 ? __double2loint(in[i / 2]) : __double2hiint(in[i / 2]));
      } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
        u[i] = *reinterpret_cast<const unsigned*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(in[2 * i], in[2 * i + 1]);
        u[i] = *reinterpret_cast<const unsigned*>(&h);
      }
    }
    return {make_uint4(u[0], u[1], u[2], u[3])};
  }
};

template <typename T, bool kVector>
using WordPack = std::conditional_t<kVector, Words<T>, Single<T>>;

}  // namespace jaxdnn::cuda
