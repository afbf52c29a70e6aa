// XLA:GPU handlers of the norm targets (cc/ffi/norm_common.h lists them): decode, poison the
// results, enqueue the kernels on XLA's stream. No allocation (the workspace is an operand)
// and no synchronisation, so they are CUDA-graph compatible.

#include <cuda_runtime.h>

#include "cc/ffi/cuda_common.h"
#include "cc/ffi/handlers.h"
#include "cc/ffi/norm_common.h"
#include "cc/norm/cuda_norm.h"

namespace jaxdnn::ffi_util {
namespace {

using Ret = ffi::Result<ffi::AnyBuffer>;

ffi::Error poison_all(std::initializer_list<Ret*> results, cudaStream_t stream) {
  for (Ret* r : results)
    if (ffi::Error e = poison_device(**r, stream); e.failure()) return e;
  return ffi::Error::Success();
}

ffi::Error NormFwdCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                       ffi::AnyBuffer bias, Ret y, Ret mean, Ret var, Ret ws, I64Span shape,
                       float eps, bool centered) {
  norm::Problem p;
  norm::FwdBuffers b;
  if (ffi::Error e = prepare_norm_fwd(x, scale, bias, *y, *mean, *var, *ws, shape, eps, centered,
                                      &p, &b);
      e.failure())
    return e;
  if (ffi::Error e = poison_all({&y, &mean, &var, &ws}, stream); e.failure()) return e;
  return to_error(norm::cuda_forward(p, b, stream));
}

ffi::Error NormFwdStatsCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                            ffi::AnyBuffer bias, Ret mean, Ret var, Ret ws, I64Span shape,
                            float eps, bool centered) {
  norm::Problem p;
  norm::FwdBuffers b;
  if (ffi::Error e = prepare_norm_fwd("norm_fwd_stats", x, scale, bias, nullptr, *mean, *var,
                                      *ws, shape, eps, centered, &p, &b);
      e.failure())
    return e;
  if (ffi::Error e = poison_all({&mean, &var, &ws}, stream); e.failure()) return e;
  return to_error(norm::cuda_forward_stats(p, b, stream));
}

ffi::Error NormFwdApplyCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                            ffi::AnyBuffer bias, ffi::AnyBuffer mean, ffi::AnyBuffer var,
                            ffi::AnyBuffer ws, Ret y, I64Span shape, float eps, bool centered) {
  norm::Problem p;
  norm::FwdBuffers b;
  if (ffi::Error e = prepare_norm_fwd_apply(x, scale, bias, mean, var, ws, *y, shape, eps,
                                            centered, &p, &b);
      e.failure())
    return e;
  if (ffi::Error e = poison_all({&y}, stream); e.failure()) return e;
  return to_error(norm::cuda_forward_apply(p, b, stream));
}

ffi::Error NormInferCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                         ffi::AnyBuffer bias, ffi::AnyBuffer mean, ffi::AnyBuffer var, Ret y,
                         I64Span shape, float eps) {
  norm::Problem p;
  norm::FwdBuffers b;
  if (ffi::Error e = prepare_norm_infer(x, scale, bias, mean, var, *y, shape, eps, &p, &b);
      e.failure())
    return e;
  if (ffi::Error e = poison_all({&y}, stream); e.failure()) return e;
  return to_error(norm::cuda_inference(p, b, stream));
}

ffi::Error NormBwdCuda(cudaStream_t stream, ffi::AnyBuffer dy, ffi::AnyBuffer dmean,
                       ffi::AnyBuffer dvar, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                       ffi::AnyBuffer mean, ffi::AnyBuffer var, Ret dx, Ret dscale, Ret dbias,
                       Ret ws, I64Span shape, float eps, bool centered) {
  norm::Problem p;
  norm::BwdBuffers b;
  if (ffi::Error e = prepare_norm_bwd(dy, dmean, dvar, x, scale, mean, var, *dx, *dscale, *dbias,
                                      *ws, shape, eps, centered, &p, &b);
      e.failure())
    return e;
  if (ffi::Error e = poison_all({&dx, &dscale, &dbias, &ws}, stream); e.failure()) return e;
  return to_error(norm::cuda_backward(p, b, stream));
}

ffi::Error NormInferBwdCuda(cudaStream_t stream, ffi::AnyBuffer dy, ffi::AnyBuffer x,
                            ffi::AnyBuffer scale, ffi::AnyBuffer mean, ffi::AnyBuffer var,
                            Ret dx, Ret dscale, Ret dbias, Ret dmean, Ret dvar, Ret ws,
                            I64Span shape, float eps) {
  norm::Problem p;
  norm::BwdBuffers b;
  if (ffi::Error e = prepare_norm_infer_bwd(dy, x, scale, mean, var, *dx, *dscale, *dbias, *dmean,
                                            *dvar, *ws, shape, eps, &p, &b);
      e.failure())
    return e;
  if (ffi::Error e = poison_all({&dx, &dscale, &dbias, &dmean, &dvar, &ws}, stream); e.failure())
    return e;
  return to_error(norm::cuda_backward(p, b, stream));
}

}  // namespace

#define JAXDNN_NORM_CUDA_HANDLER(name, impl, bind)                                  \
  XLA_FFI_DEFINE_HANDLER(name, impl,                                                \
                         bind(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()), \
                         {ffi::Traits::kCmdBufferCompatible})
JAXDNN_NORM_CUDA_HANDLER(kNormFwdCuda, NormFwdCuda, bind_norm_fwd);
JAXDNN_NORM_CUDA_HANDLER(kNormFwdStatsCuda, NormFwdStatsCuda, bind_norm_fwd_stats);
JAXDNN_NORM_CUDA_HANDLER(kNormFwdApplyCuda, NormFwdApplyCuda, bind_norm_fwd_apply);
JAXDNN_NORM_CUDA_HANDLER(kNormInferCuda, NormInferCuda, bind_norm_infer);
JAXDNN_NORM_CUDA_HANDLER(kNormBwdCuda, NormBwdCuda, bind_norm_bwd);
JAXDNN_NORM_CUDA_HANDLER(kNormInferBwdCuda, NormInferBwdCuda, bind_norm_infer_bwd);
#undef JAXDNN_NORM_CUDA_HANDLER

JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_fwd", kNormFwdCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_fwd_stats", kNormFwdStatsCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_fwd_apply", kNormFwdApplyCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_infer", kNormInferCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_bwd", kNormBwdCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_norm_infer_bwd", kNormInferBwdCuda);

}  // namespace jaxdnn::ffi_util
