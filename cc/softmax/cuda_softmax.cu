// The CUDA softmax registry and entry points: cuda_softmax_rows.cu keeps a row in registers
// (one HBM read), cuda_softmax_online.cu handles any row length.

#include <cstring>
#include <string>

#include "cc/softmax/cuda_softmax.h"
#include "cc/softmax/cuda_softmax_kernels.h"

namespace jaxdnn::softmax {
namespace {

Support any_row(const Problem&) { return Support::Yes(); }

const CudaAlgorithm kRows = {"rows", rows_support};
const CudaAlgorithm kOnline = {"online", any_row};

Status launch(const char* algo, Kind kind, const Problem& p, const Operands& io,
              cudaStream_t stream) {
  if (p.dtype != DType::kF32 && p.dtype != DType::kF64 && p.dtype != DType::kF16 &&
      p.dtype != DType::kBF16)
    return Status::Error("jaxdnn softmax: unsupported dtype");
  if (std::strcmp(algo, kRows.name) == 0) {
    Status status;
    if (!launch_rows(kind, p, io, stream, &status))
      return Status::Error("jaxdnn softmax rows: " + rows_support(p).reason);
    return status;
  }
  if (std::strcmp(algo, kOnline.name) == 0) return launch_online(kind, p, io, stream);
  return Status::Error(std::string("jaxdnn softmax: unknown algorithm ") + algo);
}

}  // namespace

const std::vector<const CudaAlgorithm*>& cuda_algorithms() {
  static const std::vector<const CudaAlgorithm*> kAll = {&kRows, &kOnline};
  return kAll;
}

Status cuda_forward(const char* algo, const Problem& p, bool log, const void* x, void* y,
                    cudaStream_t stream) {
  return launch(algo, log ? Kind::kLogSoftmax : Kind::kSoftmax, p, {x, nullptr, y}, stream);
}

Status cuda_backward(const char* algo, const Problem& p, Linear kind, const void* y,
                     const void* c, void* out, cudaStream_t stream) {
  const Kind k = kind == Linear::kSoftmax        ? Kind::kBwdSoftmax
                 : kind == Linear::kLogSoftmaxVjp ? Kind::kBwdLogSoftmaxVjp
                                                  : Kind::kBwdLogSoftmaxJvp;
  return launch(algo, k, p, {y, c, out}, stream);
}

}  // namespace jaxdnn::softmax
