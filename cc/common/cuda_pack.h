// Pack<T, kVector>: the unit a memory-bound kernel moves per access. A 16-byte Vec<T> when the
// data is 16-byte aligned (kVector), otherwise a single element: the same kernel code then
// serves unaligned pointers and ragged row lengths, only with narrower accesses.
//
// WordPack<T, kVector> moves the same units but converts them as a whole to and from the
// accumulator type (unpack / pack): its 16-byte form, Words<T>, holds four 32-bit words, so a
// 16-bit type stays two values per register while in flight and converts two at a time
// (bf16x2 / f16x2). Holding eight 16-bit values in eight registers, as Vec<T> ends up doing,
// costs a kernel with several vectors in flight ~16 registers, and so occupancy.
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

  __device__ __forceinline__ void unpack(dev_acc_t<T> (&out)[1]) const { out[0] = to_acc(v[0]); }
  __device__ __forceinline__ static Single pack(const dev_acc_t<T> (&in)[1]) {
    return {{from_acc<T>(in[0])}};
  }
};

template <typename T, bool kVector>
using Pack = std::conditional_t<kVector, Vec<T>, Single<T>>;

template <typename T>
struct Words {
  static constexpr int kN = kVecBytes / int(sizeof(T));
  uint4 w;

  __device__ __forceinline__ static Words load(const T* p) {
    return {*reinterpret_cast<const uint4*>(p)};
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
      } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // the top half of a float
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
      } else {
        static_assert(std::is_same_v<T, __half>, "float, double, __half or __nv_bfloat16");
        __half2 h;
        *reinterpret_cast<unsigned*>(&h) = u[i];
        const float2 f = __half22float2(h);
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
