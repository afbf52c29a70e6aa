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

struct CudaNorm {
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

#define JAXDNN_NORM_CUDA_HANDLER(name, impl, bind)                                  \
  XLA_FFI_DEFINE_HANDLER(name, impl,                                                \
                         bind(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()), \
                         {ffi::Traits::kCmdBufferCompatible})
JAXDNN_NORM_CUDA_HANDLER(kNormFwdCuda, H::Fwd, bind_norm_fwd);
JAXDNN_NORM_CUDA_HANDLER(kNormFwdStatsCuda, H::FwdStats, bind_norm_fwd_stats);
JAXDNN_NORM_CUDA_HANDLER(kNormFwdApplyCuda, H::FwdApply, bind_norm_fwd_apply);
JAXDNN_NORM_CUDA_HANDLER(kNormInferCuda, H::Infer, bind_norm_infer);
JAXDNN_NORM_CUDA_HANDLER(kNormBwdCuda, H::Bwd, bind_norm_bwd);
JAXDNN_NORM_CUDA_HANDLER(kNormInferBwdCuda, H::InferBwd, bind_norm_infer_bwd);
#undef JAXDNN_NORM_CUDA_HANDLER

JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_fwd", kNormFwdCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_fwd_stats", kNormFwdStatsCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_fwd_apply", kNormFwdApplyCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_infer", kNormInferCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_bwd", kNormBwdCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_infer_bwd", kNormInferBwdCuda);

}  // namespace jaxdnn::ffi_util
