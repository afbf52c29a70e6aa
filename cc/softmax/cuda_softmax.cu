// The CUDA softmax entry points: rows that fit in registers run cuda_softmax_rows.cu (one HBM
// read), longer or unaligned ones cuda_softmax_online.cu.

#include "cc/softmax/cuda_softmax.h"
#include "cc/softmax/cuda_softmax_kernels.h"

namespace jaxdnn::softmax {
namespace {

Status launch(Kind kind, const Problem& p, const Operands& io, cudaStream_t stream) {
  if (p.dtype != DType::kF32 && p.dtype != DType::kF64 && p.dtype != DType::kF16 &&
      p.dtype != DType::kBF16)
    return Status::Error("jaxdnn softmax: unsupported dtype");
  if (launch_rows(kind, p, io, stream)) return cuda::check_launch("softmax_rows_kernel");
  launch_online(kind, p, io, stream);
  return cuda::check_launch("softmax_online_kernel");
}

}  // namespace

Status cuda_forward(const Problem& p, bool log, const void* x, void* y, cudaStream_t stream) {
  return launch(log ? Kind::kLogSoftmax : Kind::kSoftmax, p, {x, nullptr, y}, stream);
}

Status cuda_backward(const Problem& p, Linear kind, const void* y, const void* c, void* out,
                     cudaStream_t stream) {
  const Kind k = kind == Linear::kSoftmax        ? Kind::kBwdSoftmax
                 : kind == Linear::kLogSoftmaxVjp ? Kind::kBwdLogSoftmaxVjp
                                                  : Kind::kBwdLogSoftmaxJvp;
  return launch(k, p, {y, c, out}, stream);
}

}  // namespace jaxdnn::softmax
