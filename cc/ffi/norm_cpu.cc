// XLA:CPU handlers of the norm targets (cc/ffi/norm_common.h lists them): decode, poison the
// results, run the kernels on the intra-op thread pool.

#include "cc/ffi/cpu_parallel.h"
#include "cc/ffi/handlers.h"
#include "cc/ffi/norm_common.h"
#include "cc/norm/cpu_norm.h"

namespace jaxdnn::ffi_util {
namespace {

using Ret = ffi::Result<ffi::AnyBuffer>;

ffi::Error NormFwdCpu(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                      ffi::AnyBuffer bias, Ret y, Ret mean, Ret var, Ret ws, I64Span shape,
                      float eps, bool centered) {
  norm::Problem p;
  norm::FwdBuffers b;
  if (ffi::Error e =
          prepare_norm_fwd(x, scale, bias, *y, *mean, *var, *ws, shape, eps, centered, &p, &b);
      e.failure())
    return e;
  for (Ret* r : {&y, &mean, &var, &ws}) poison_host(**r);
  return to_error(norm::cpu_forward(p, b, FfiParallel(pool)));
}

ffi::Error NormInferCpu(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                        ffi::AnyBuffer bias, ffi::AnyBuffer mean, ffi::AnyBuffer var, Ret y,
                        I64Span shape, float eps) {
  norm::Problem p;
  norm::FwdBuffers b;
  if (ffi::Error e = prepare_norm_infer(x, scale, bias, mean, var, *y, shape, eps, &p, &b);
      e.failure())
    return e;
  poison_host(*y);
  return to_error(norm::cpu_inference(p, b, FfiParallel(pool)));
}

ffi::Error NormBwdCpu(ffi::ThreadPool pool, ffi::AnyBuffer dy, ffi::AnyBuffer dmean,
                      ffi::AnyBuffer dvar, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                      ffi::AnyBuffer mean, ffi::AnyBuffer var, Ret dx, Ret dscale, Ret dbias,
                      Ret ws, I64Span shape, float eps, bool centered) {
  norm::Problem p;
  norm::BwdBuffers b;
  if (ffi::Error e = prepare_norm_bwd(dy, dmean, dvar, x, scale, mean, var, *dx, *dscale, *dbias,
                                      *ws, shape, eps, centered, &p, &b);
      e.failure())
    return e;
  for (Ret* r : {&dx, &dscale, &dbias, &ws}) poison_host(**r);
  return to_error(norm::cpu_backward(p, b, FfiParallel(pool)));
}

ffi::Error NormInferBwdCpu(ffi::ThreadPool pool, ffi::AnyBuffer dy, ffi::AnyBuffer x,
                           ffi::AnyBuffer scale, ffi::AnyBuffer mean, ffi::AnyBuffer var,
                           Ret dx, Ret dscale, Ret dbias, Ret dmean, Ret dvar, Ret ws,
                           I64Span shape, float eps) {
  norm::Problem p;
  norm::BwdBuffers b;
  if (ffi::Error e = prepare_norm_infer_bwd(dy, x, scale, mean, var, *dx, *dscale, *dbias, *dmean,
                                            *dvar, *ws, shape, eps, &p, &b);
      e.failure())
    return e;
  for (Ret* r : {&dx, &dscale, &dbias, &dmean, &dvar, &ws}) poison_host(**r);
  return to_error(norm::cpu_backward(p, b, FfiParallel(pool)));
}

}  // namespace

#define JAXDNN_NORM_CPU_HANDLER(name, impl, bind) \
  XLA_FFI_DEFINE_HANDLER(name, impl, bind(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()))
JAXDNN_NORM_CPU_HANDLER(kNormFwdCpu, NormFwdCpu, bind_norm_fwd);
JAXDNN_NORM_CPU_HANDLER(kNormInferCpu, NormInferCpu, bind_norm_infer);
JAXDNN_NORM_CPU_HANDLER(kNormBwdCpu, NormBwdCpu, bind_norm_bwd);
JAXDNN_NORM_CPU_HANDLER(kNormInferBwdCpu, NormInferBwdCpu, bind_norm_infer_bwd);
#undef JAXDNN_NORM_CPU_HANDLER

JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_norm_fwd", kNormFwdCpu);
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_norm_infer", kNormInferCpu);
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_norm_bwd", kNormBwdCpu);
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_norm_infer_bwd", kNormInferBwdCpu);

}  // namespace jaxdnn::ffi_util
