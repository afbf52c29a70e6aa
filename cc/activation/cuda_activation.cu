// CUDA activation kernels: one elementwise kernel for both directions, templated on
// (op, direction, dtype, vector width).
//
// One 16-byte pack per thread, one block per 256 packs, no grid-stride loop: the launch shape of
// XLA's fused elementwise loops. Measured on the H200 over 32768x4096 float32 (relu, CUDA events):
// this flat grid moves 4.11 TB/s forward (read n, write n; a device-to-device copy: 4.08) and
// 4.31 backward (read 2n, write n); 2, 4 or 8 packs per thread lose 2-4%, and a persistent grid
// walking tiles (one wave, or four) loses 7-9% (3.74-3.81 / 3.98-4.10 TB/s), which is what the
// previous persistent version measured against XLA (0.88-0.92x on float32). The n % kN elements
// past the last whole pack go to block 0, one element per thread. Pointers that are not 16-byte
// aligned run the same kernel with single-element packs.
//
// Traffic: forward reads n and writes n elements, backward reads 2n and writes n. Math in float
// (double for float64): at 3.6 TB/s a bfloat16 element has about 37 instruction slots (4 warp
// instructions per clock and SM at 1.98 GHz). The CUDA library's expm1f, log1pf and erfcf
// took 58-82 (PTX), so 16-bit storage takes MUFU forms of them (CudaMath<true>), and gelu_exact
// a normal-CDF form of ~19 (activation_math.h; docs/perf/activation.md).

#include "cc/activation/activation_math.h"
#include "cc/activation/cuda_activation.h"
#include "cc/activation/cuda_math_policy.cuh"
#include "cc/common/cuda_pack.h"

namespace jaxdnn::activation {
namespace {

using cuda::dev_acc_t;
using cuda::device_t;
using cuda::from_acc;
using cuda::to_acc;

constexpr int kThreads = 256;
// Minimum blocks per SM (launch bounds). Each thread holds its loads in flight, so resident
// threads are the bytes in flight, and a full SM (8 blocks) needs at most 32 registers a thread:
// silu's backward in bfloat16 took 34 registers, i.e. 6 blocks, and ran 8% slower than
// sigmoid's (32 registers, 8 blocks); at 8 blocks it went from 211 to 194 us. Every kernel
// states the bound: without a minimum nvcc gave most of them 32 registers, but with a minimum of
// 1 it gave them 35-64 (gelu_exact float32 forward: 44 registers, 306 -> 358 us). gelu_exact's
// 16-bit forward fits 8 blocks (32 registers) in its normal-CDF form. The
// float64 kernels of the longer formulas spill a few words at 8 (not benchmarked).
constexpr int kMinBlocks = 8;

// f(a) (forward) or b * f'(a) (backward); kFast for 16-bit storage types.
template <Op kOp, bool kBackward, bool kFast, typename A>
__device__ __forceinline__ A apply(A a, A b, A alpha) {
  using M = CudaMath<kFast>;
  if constexpr (kBackward) return backward<kOp, M>(a, b, alpha);
  else return forward<kOp, M>(a, alpha);
}

// y = f(a) (forward, b unused) or dy * f'(a) with dy = b (backward), elementwise over n.
template <Op kOp, bool kBackward, typename T, bool kVector>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
activation_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                  int64_t n, dev_acc_t<T> alpha) {
  using A = dev_acc_t<T>;
  using P = cuda::HeldPack<T, kVector>;
  constexpr bool kFast = sizeof(T) == 2;
  cuda::await_prior_grids();
  const int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x;  // this thread's pack
  if (i < n / P::kN) {
    const P pa = P::load(a + i * P::kN);
    P pb;
    if constexpr (kBackward) pb = P::load(b + i * P::kN);
    A r[P::kN];
#pragma unroll
    for (int e = 0; e < P::kN; ++e)
      r[e] = apply<kOp, kBackward, kFast>(pa[e], kBackward ? pb[e] : A(0), alpha);
    cuda::store_acc<T, kVector>(out + i * P::kN, r);
  }
  if (blockIdx.x == 0)
    for (int64_t j = n / P::kN * P::kN + threadIdx.x; j < n; j += kThreads)
      out[j] = from_acc<T>(
          apply<kOp, kBackward, kFast>(A(to_acc(a[j])), kBackward ? A(to_acc(b[j])) : A(0), alpha));
}

template <bool kBackward>
Status launch(const Problem& p, const void* a, const void* b, void* out, cudaStream_t stream) {
  bool dtype_ok = false;
  Status status = Status::Ok();
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
      auto run = [&](auto vec) {
        constexpr auto kernel = activation_kernel<kOp, kBackward, T, decltype(vec)::value>;
        const int64_t packs = p.n / cuda::Pack<T, decltype(vec)::value>::kN;
        status = cuda::launch(kBackward ? "activation_kernel (backward)" : "activation_kernel",
                              kernel, cuda::grid_for(packs, kThreads), kThreads, 0, stream, at,
                              bt, ot, p.n, alpha);
      };
      if (vector) run(std::true_type{});
      else run(std::false_type{});
    });
  });
  if (!op_ok || !dtype_ok) return Status::Error("jaxdnn activation: unknown op code or dtype");
  return status;
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
