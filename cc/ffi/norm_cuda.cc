// XLA:GPU handlers of the norm targets (cc/ffi/norm_common.h lists them and holds their
// bodies): poison the results on the device, enqueue the kernels on XLA's stream. No
// allocation (the workspace is an operand) and no synchronisation, so they are CUDA-graph
// compatible.

#include <cuda_runtime.h>

#include "cc/ffi/cuda_common.h"
#include "cc/ffi/handlers.h"
#include "cc/ffi/norm_common.h"
#include "cc/norm/cuda_norm.h"

namespace jaxdnn::ffi_util {
namespace {

struct CudaNorm : CudaPlatform {
  using Ctx = cudaStream_t;
  static std::vector<const norm::Algorithm*> algorithms(norm::Pass pass, const norm::Problem& p) {
    return norm::cuda_algorithms(pass, p);
  }
  static ffi::Error poison(Ctx stream,
                           std::initializer_list<ffi::Result<ffi::AnyBuffer>*> results) {
    for (auto* r : results)
      if (ffi::Error e = poison_device(**r, stream); e.failure()) return e;
    return ffi::Error::Success();
  }
  static constexpr auto forward = norm::cuda_forward;
  static constexpr auto inference = norm::cuda_inference;
  static constexpr auto backward = norm::cuda_backward;
};

using H = NormHandlers<CudaNorm>;

}  // namespace

JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_fwd", H::fwd());
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_fwd_stats", H::fwd_stats());
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_fwd_apply", H::fwd_apply());
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_infer", H::infer());
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_bwd", H::bwd());
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_infer_bwd", H::infer_bwd());

}  // namespace jaxdnn::ffi_util
