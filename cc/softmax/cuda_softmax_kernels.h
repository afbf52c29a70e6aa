// Pieces shared by the two CUDA softmax algorithms (cuda_softmax_rows.cu: the row in
// registers; cuda_softmax_online.cu: any row length) and their dispatcher (cuda_softmax.cu).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cc/common/cuda_util.h"
#include "cc/softmax/softmax_math.h"

namespace jaxdnn::softmax {

// What a kernel computes: the forward pass or one of the backward maps (softmax.h).
enum class Kind { kSoftmax, kLogSoftmax, kBwdSoftmax, kBwdLogSoftmaxVjp, kBwdLogSoftmaxJvp };

constexpr bool is_backward(Kind k) { return k != Kind::kSoftmax && k != Kind::kLogSoftmax; }
constexpr Linear linear_of(Kind k) {
  return k == Kind::kBwdLogSoftmaxVjp   ? Linear::kLogSoftmaxVjp
         : k == Kind::kBwdLogSoftmaxJvp ? Linear::kLogSoftmaxJvp
                                        : Linear::kSoftmax;
}

// The inputs: a = x (forward) or y (backward), b = c (backward only); out = y or the result.
struct Operands {
  const void* a;
  const void* b;
  void* out;
};

// The math policy of softmax_math.h (plus log, once per row, and the row max): exp of a
// non-positive argument (x - max, or a log-probability), where the fast exp is accurate to
// 2 ulp. max drops a NaN operand; a NaN in the row still reaches every output through the sum.
struct CudaMath {
  static __device__ __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
  static __device__ __forceinline__ double max(double a, double b) { return fmax(a, b); }
  static __device__ __forceinline__ float exp(float x) { return __expf(x); }
  static __device__ __forceinline__ double exp(double x) { return ::exp(x); }
  static __device__ __forceinline__ float log(float x) { return logf(x); }
  static __device__ __forceinline__ double log(double x) { return ::log(x); }
};

// Calls fn(std::integral_constant<Kind, k>{}) for a runtime kind.
template <typename Fn>
void dispatch_kind(Kind k, Fn&& fn) {
  switch (k) {
    case Kind::kSoftmax: fn(std::integral_constant<Kind, Kind::kSoftmax>{}); return;
    case Kind::kLogSoftmax: fn(std::integral_constant<Kind, Kind::kLogSoftmax>{}); return;
    case Kind::kBwdSoftmax: fn(std::integral_constant<Kind, Kind::kBwdSoftmax>{}); return;
    case Kind::kBwdLogSoftmaxVjp:
      fn(std::integral_constant<Kind, Kind::kBwdLogSoftmaxVjp>{});
      return;
    case Kind::kBwdLogSoftmaxJvp:
      fn(std::integral_constant<Kind, Kind::kBwdLogSoftmaxJvp>{});
      return;
  }
}

// cuda_softmax_rows.cu: whether the row-in-registers kernel takes rows of this length, and
// the launch, which returns false (launching nothing) when it does not, else sets *status.
Support rows_support(const Problem& p);
bool launch_rows(Kind kind, const Problem& p, const Operands& io, cudaStream_t stream,
                 Status* status);

// cuda_softmax_online.cu: any row length, two reads of the input.
Status launch_online(Kind kind, const Problem& p, const Operands& io, cudaStream_t stream);

}  // namespace jaxdnn::softmax
