// CUDA activation kernels: one elementwise kernel for both directions, templated on
// (op, direction, dtype, vector width).
//
// Each thread moves kUnroll 16-byte packs per operand, all loads issued before any math, and
// consecutive threads touch consecutive packs, so a warp reads 512 contiguous bytes per load
// instruction and a 256-thread block keeps 16 KiB per operand in flight. The n % kN elements
// past the last whole pack go to block 0, one element per thread. Pointers that are not
// 16-byte aligned run the same kernel with single-element packs.
//
// Traffic: forward reads n and writes n elements, backward reads 2n and writes n; loads and
// stores are streaming (__ldcs/__stcs: each byte is touched once). Math in float (double for
// float64) with the CUDA math library: at 4 TB/s a bfloat16 element has about 30 FP32
// instruction slots, enough for every op's formula (activation_math.h).

#include "cc/activation/activation_math.h"
#include "cc/activation/cuda_activation.h"
#include "cc/common/cuda_pack.h"

namespace jaxdnn::activation {
namespace {

using cuda::dev_acc_t;
using cuda::device_t;
using cuda::from_acc;
using cuda::to_acc;

// The math policy of activation_math.h.
struct CudaMath {
  static __device__ __forceinline__ float exp(float x) { return expf(x); }
  static __device__ __forceinline__ double exp(double x) { return ::exp(x); }
  static __device__ __forceinline__ float expm1(float x) { return expm1f(x); }
  static __device__ __forceinline__ double expm1(double x) { return ::expm1(x); }
  static __device__ __forceinline__ float log1p(float x) { return log1pf(x); }
  static __device__ __forceinline__ double log1p(double x) { return ::log1p(x); }
  static __device__ __forceinline__ float tanh(float x) { return tanhf(x); }
  static __device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
  static __device__ __forceinline__ float erfc(float x) { return erfcf(x); }
  static __device__ __forceinline__ double erfc(double x) { return ::erfc(x); }
  template <typename A>
  static __device__ __forceinline__ A select(bool c, A a, A b) { return c ? a : b; }
};

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // packs per operand per thread

// f(a) (forward) or b * f'(a) (backward).
template <Op kOp, bool kBackward, typename A>
__device__ __forceinline__ A apply(A a, A b, A alpha) {
  if constexpr (kBackward) return backward<kOp, CudaMath>(a, b, alpha);
  else return forward<kOp, CudaMath>(a, alpha);
}

// y = f(a) (forward, b unused) or dy * f'(a) with dy = b (backward), elementwise over n.
template <Op kOp, bool kBackward, typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
activation_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                  int64_t n, dev_acc_t<T> alpha) {
  using A = dev_acc_t<T>;
  using P = cuda::Pack<T, kVector>;
  const int64_t packs = n / P::kN;
  const int64_t first = int64_t(blockIdx.x) * (kThreads * kUnroll) + threadIdx.x;
  P pa[kUnroll] = {}, pb[kUnroll] = {};
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = first + u * kThreads;
    if (i < packs) {
      pa[u] = P::load_stream(a + i * P::kN);
      if constexpr (kBackward) pb[u] = P::load_stream(b + i * P::kN);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = first + u * kThreads;
    if (i < packs) {
      P r;
#pragma unroll
      for (int e = 0; e < P::kN; ++e)
        r.v[e] = from_acc<T>(apply<kOp, kBackward>(A(to_acc(pa[u].v[e])),
                                                  kBackward ? A(to_acc(pb[u].v[e])) : A(0), alpha));
      r.store_stream(out + i * P::kN);
    }
  }
  if (blockIdx.x == 0)
    for (int64_t i = packs * P::kN + threadIdx.x; i < n; i += kThreads)
      out[i] = from_acc<T>(
          apply<kOp, kBackward>(A(to_acc(a[i])), kBackward ? A(to_acc(b[i])) : A(0), alpha));
}

template <bool kBackward>
Status launch(const Problem& p, const void* a, const void* b, void* out, cudaStream_t stream) {
  bool dtype_ok = false;
  const bool op_ok = dispatch_op(p.op, [&](auto op) {
    dtype_ok = dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) {
      using T = device_t<decltype(tag)>;
      const T* at = static_cast<const T*>(a);
      const T* bt = static_cast<const T*>(b);
      T* ot = static_cast<T*>(out);
      const bool vector = cuda::vec_aligned(a) && cuda::vec_aligned(out) &&
                          (!kBackward || cuda::vec_aligned(b));
      const auto alpha = dev_acc_t<T>(p.alpha);
      constexpr Op kOp = decltype(op)::value;
      if (vector) {
        const int64_t blocks = (p.n / cuda::Vec<T>::kN + kThreads * kUnroll - 1) / (kThreads * kUnroll);
        activation_kernel<kOp, kBackward, T, true>
            <<<unsigned(blocks < 1 ? 1 : blocks), kThreads, 0, stream>>>(at, bt, ot, p.n, alpha);
      } else {
        const int64_t blocks = (p.n + kThreads * kUnroll - 1) / (kThreads * kUnroll);
        activation_kernel<kOp, kBackward, T, false>
            <<<unsigned(blocks < 1 ? 1 : blocks), kThreads, 0, stream>>>(at, bt, ot, p.n, alpha);
      }
    });
  });
  if (!op_ok || !dtype_ok) return Status::Error("jaxdnn activation: unknown op code or dtype");
  return cuda::check_launch(kBackward ? "activation_kernel (backward)" : "activation_kernel");
}

}  // namespace

Status cuda_forward(const Problem& p, const void* x, void* y, cudaStream_t stream) {
  return launch<false>(p, x, nullptr, y, stream);
}

Status cuda_backward(const Problem& p, const void* x, const void* dy, void* dx,
                     cudaStream_t stream) {
  return launch<true>(p, x, dy, dx, stream);
}

}  // namespace jaxdnn::activation
