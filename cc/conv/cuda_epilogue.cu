// The fused epilogue's pass on the GPU (epilogue.h): z = y + bias + residual, y = act(z), one
// element per thread in blocks of kThreads (a flat elementwise grid, as XLA's loop fusions), the
// channel k = i % K by a multiply-high division. Math in float (double for float64) with
// activation_math.h's formulas on CudaMath (its fast forms for 16-bit results), as the
// activation kernels. Traffic: read y (and the residual), write y (and z).

#include "cc/activation/activation_math.h"
#include "cc/activation/cuda_math_policy.cuh"
#include "cc/common/cuda_util.h"
#include "cc/conv/cuda_algorithms.h"

namespace jaxdnn::conv {
namespace {

constexpr int kThreads = 256;

template <activation::Op kOp, typename T>
__global__ void __launch_bounds__(kThreads)
    epilogue_kernel(T* __restrict__ y, T* __restrict__ z,
                    const cuda::dev_acc_t<T>* __restrict__ bias, const T* __restrict__ res,
                    int64_t n, int64_t K, bool act, cuda::dev_acc_t<T> alpha) {
  using A = cuda::dev_acc_t<T>;
  using M = activation::CudaMath<sizeof(T) == 2>;
  cuda::await_prior_grids();
  const int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (i >= n) return;
  A v = A(cuda::to_acc(y[i]));
  if (bias) v += bias[i % K];
  if (res) v += A(cuda::to_acc(res[i]));
  if (z) z[i] = cuda::from_acc<T>(v);
  if (act) v = activation::forward<kOp, M>(v, alpha);
  y[i] = cuda::from_acc<T>(v);
}

}  // namespace

Status cuda_epilogue(const Epilogue& e, const EpilogueBuffers& b, cudaStream_t stream) {
  const int64_t n = e.rows * e.K;
  if (n == 0) return Status::Ok();
  Status status = Status::Error(std::string("conv epilogue: unsupported dtype ") +
                                dtype_name(e.dtype));
  const bool op_ok = activation::dispatch_op(e.op, [&](auto op) {
    dispatch_io(e.dtype, e.dtype, [&](auto tag, auto) {
      using T = cuda::device_t<decltype(tag)>;
      using A = cuda::dev_acc_t<T>;
      status = cuda::launch("conv epilogue_kernel", epilogue_kernel<decltype(op)::value, T>,
                            unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream,
                            static_cast<T*>(b.y), static_cast<T*>(b.z),
                            static_cast<const A*>(b.bias), static_cast<const T*>(b.residual), n,
                            e.K, e.act, A(e.alpha));
    });
  });
  return op_ok ? status : Status::Error("conv epilogue: unknown activation code");
}

}  // namespace jaxdnn::conv
