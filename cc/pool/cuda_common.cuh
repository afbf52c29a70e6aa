// Device-side pieces shared by the pooling kernels (cuda_pool.cu, cuda_global.cu): a 32-bit
// view of the problem with multiply-shift division, channel-vector access, and the window
// reductions with their merge rule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "cc/common/cuda_util.h"
#include "cc/common/cuda_vec.h"
#include "cc/pool/pool.h"

namespace jaxdnn::pool::gpu {

using cuda::dev_acc_t;
using cuda::device_t;
using cuda::from_acc;
using cuda::to_acc;

// n / d for 0 <= n < 2^31 and 1 <= d < 2^31 with one multiply-high, an add and a shift
// (Granlund-Montgomery), instead of the ~20-instruction integer division: index decomposition
// is most of a pooling thread's arithmetic.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t(1) << s) < d) ++s;  // s = ceil(log2 d)
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - d)) / d + 1);
  }
  __host__ __device__ __forceinline__ int32_t div(int32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(uint32_t(n), m);
#else
    const uint32_t hi = uint32_t((uint64_t(uint32_t(n)) * m) >> 32);
#endif
    return int32_t((hi + uint32_t(n)) >> s);
  }
  // Returns n / d and sets *rem = n % d.
  __host__ __device__ __forceinline__ int32_t divmod(int32_t n, int32_t* rem) const {
    const int32_t q = div(n);
    *rem = n - q * int32_t(d);
    return q;
  }
};

// The problem of one launch in 32-bit ints (launches are split over N so that x and y of one
// launch hold fewer than 2^31 elements), and the thread layout: a thread owns G vectors of V
// channels of one position, the vectors `lanes` apart, so that the lanes of a position read
// contiguous memory with every load.
struct Geom {
  int32_t N, C, lanes;
  int32_t in[3], out[3], window[3], stride[3], pad_lo[3];
  FastDiv lanes_div, in_div[3], out_div[3], stride_div[3];

  static constexpr int64_t kMaxElems = (int64_t(1) << 31) - 1;

  Geom(const Problem& p, int64_t n, int32_t lanes_per_position) {
    N = int32_t(n);
    C = int32_t(p.C);
    lanes = lanes_per_position;
    lanes_div = FastDiv(uint32_t(lanes));
    for (int a = 0; a < 3; ++a) {
      in[a] = int32_t(p.in[a]);
      out[a] = int32_t(p.out[a]);
      window[a] = int32_t(p.window[a]);
      stride[a] = int32_t(p.stride[a]);
      pad_lo[a] = int32_t(p.pad_lo[a]);
      in_div[a] = FastDiv(uint32_t(in[a] > 0 ? in[a] : 1));
      out_div[a] = FastDiv(uint32_t(out[a] > 0 ? out[a] : 1));
      stride_div[a] = FastDiv(uint32_t(stride[a]));
    }
  }

  __device__ __forceinline__ int32_t in_spatial() const { return in[0] * in[1] * in[2]; }
  __device__ __forceinline__ int32_t out_spatial() const { return out[0] * out[1] * out[2]; }
  __device__ __forceinline__ int32_t window_size() const {
    return window[0] * window[1] * window[2];
  }

  // Same meaning as Problem::window_span / Problem::covering (pool.h), in 32 bits.
  __device__ __forceinline__ void window_span(int a, int32_t o, int32_t* start, int32_t* lo,
                                             int32_t* hi) const {
    *start = o * stride[a] - pad_lo[a];
    *lo = min(max(*start, 0), in[a]);
    *hi = min(max(*start + window[a], 0), in[a]);
  }
  __device__ __forceinline__ void covering(int a, int32_t i, int32_t* lo, int32_t* hi) const {
    const int32_t first = i + pad_lo[a] - window[a] + 1;
    *lo = first <= 0 ? 0 : stride_div[a].div(first + stride[a] - 1);
    *hi = min(stride_div[a].div(i + pad_lo[a]) + 1, out[a]);
  }
  // (n, a, b, c) of a flat position over dims (N, d0, d1, d2).
  __device__ __forceinline__ int32_t split(int32_t pos, const FastDiv* div, int32_t* a,
                                           int32_t* b, int32_t* c) const {
    pos = div[2].divmod(pos, c);
    pos = div[1].divmod(pos, b);
    return div[0].divmod(pos, a);
  }
};

// V consecutive channels: one 16-byte access for V > 1 (V = cuda::Vec<T>::kN), else a scalar.
template <typename T, int V>
__device__ __forceinline__ void load_channels(const T* p, dev_acc_t<T>* out) {
  if constexpr (V == 1) {
    out[0] = to_acc(*p);
  } else {
    static_assert(V == cuda::Vec<T>::kN, "V must be the 16-byte vector width");
    const auto v = cuda::Vec<T>::load(p);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_acc(v.v[i]);
  }
}

template <typename T, int V, typename A>
__device__ __forceinline__ void store_channels(T* p, const A* in) {
  if constexpr (V == 1) {
    *p = from_acc<T>(in[0]);
  } else {
    cuda::Vec<T> v;
#pragma unroll
    for (int i = 0; i < V; ++i) v.v[i] = from_acc<T>(in[i]);
    v.store_stream(p);  // written once, never read back by the kernel
  }
}

// V selection indices, moved with one access (two for 8 int32s).
template <typename Idx, int V>
struct alignas(V * sizeof(Idx) < 16 ? V * sizeof(Idx) : 16) IdxVec {
  Idx v[V];
};

// The max selection rule of pool.h: v replaces the selection s when greater, NaN being greater
// than any number. Without an index to track, replacing a NaN by a NaN changes nothing, so the
// cheaper test suffices.
template <bool kIndex, typename A>
__device__ __forceinline__ bool greater(A v, A s) {
  if constexpr (kIndex) return v > s || (v != v && s == s);
  else return v > s || v != v;
}

enum class Reduce { kMax, kMaxIndex, kAvg };

// Running reduction of N channels over a window's taps. merge(later) appends a state that
// covers later taps, so a window split into consecutive pieces reduces exactly as a whole.
template <typename A, int N, Reduce R>
struct WindowState {
  static constexpr bool kIndex = R == Reduce::kMaxIndex;
  A acc[N];
  int32_t ix[kIndex ? N : 1];  // window index of the selection, -1 for none

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      acc[i] = R == Reduce::kAvg ? A(0) : -std::numeric_limits<A>::infinity();
      if constexpr (kIndex) ix[i] = -1;
    }
  }
  __device__ __forceinline__ void add(int i, A v, int32_t k) {
    if constexpr (R == Reduce::kAvg) {
      acc[i] += v;
    } else {
      const bool take = greater<kIndex>(v, acc[i]);
      acc[i] = take ? v : acc[i];
      if constexpr (kIndex) ix[i] = take ? k : ix[i];
    }
  }
  // One tap (window index k) of all N channels: the per-tap step of every forward kernel.
  __device__ __forceinline__ void add_tap(const A* v, int32_t k) {
#pragma unroll
    for (int i = 0; i < N; ++i) add(i, v[i], k);
  }
  // Starts the state at one tap (max: as init() then add_tap(v, k) would, except that a -inf
  // tap counts as selected, which no merge can tell from nothing selected: a state whose value
  // is -inf is never taken).
  __device__ __forceinline__ void first_tap(const A* v, int32_t k) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      acc[i] = v[i];
      if constexpr (kIndex) ix[i] = k;
    }
  }
  // Appends a state over later taps whose window indices are its own plus k0.
  __device__ __forceinline__ void merge(const WindowState& later, int32_t k0 = 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) add(i, later.acc[i], kIndex ? later.ix[i] + k0 : 0);
  }
  // Writes channels [i0, i0 + V) of the result (avg: times 1/divisor) and their indices;
  // first_on_input: whether the window's first tap lies on the input (selected_index).
  template <typename T, int V, typename Idx>
  __device__ __forceinline__ void store(int i0, T* y, Idx* idx, A inv_divisor,
                                        bool first_on_input) const {
    A out[V];
#pragma unroll
    for (int i = 0; i < V; ++i)
      out[i] = R == Reduce::kAvg ? acc[i0 + i] * inv_divisor : acc[i0 + i];
    store_channels<T, V>(y, out);
    if constexpr (kIndex) {
      IdxVec<Idx, V> iv;
#pragma unroll
      for (int i = 0; i < V; ++i) iv.v[i] = selected_index<Idx>(ix[i0 + i], first_on_input);
      *reinterpret_cast<IdxVec<Idx, V>*>(idx) = iv;
    }
  }
};

constexpr int kThreads = 256;  // threads per block of every pooling kernel

inline bool aligned(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;  // nullptr (no such operand) passes
}

// Runs launch(geom, n0) over slices of the batch small enough for 32-bit indexing.
template <typename Launch>
Status over_batch_slices(const Problem& p, int32_t lanes, Launch&& launch) {
  const int64_t per_image = std::max(p.in_spatial(), p.out_spatial()) * p.C;
  if (per_image > Geom::kMaxElems)
    return Status::Error("pool: one image of " + std::to_string(per_image) +
                         " elements is too large for the CUDA kernels (limit 2^31 - 1)");
  const int64_t slice = per_image == 0 ? p.N : Geom::kMaxElems / per_image;
  for (int64_t n0 = 0; n0 < p.N; n0 += slice) {
    Status s = launch(Geom(p, std::min(slice, p.N - n0), lanes), n0);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// Entry point of the split-window kernel for global pooling (cuda_global.cu): the forward ops
// when Problem::global().
Status global_fwd(const Args& args, const Buffers& bufs, cudaStream_t stream);

}  // namespace jaxdnn::pool::gpu
