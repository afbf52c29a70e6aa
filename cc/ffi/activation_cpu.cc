// XLA:CPU handlers for the activation kernels: decode, then run on the intra-op thread pool.

#include "cc/activation/activation.h"
#include "cc/ffi/activation_common.h"
#include "cc/ffi/cpu_parallel.h"
#include "cc/ffi/handlers.h"

namespace jaxdnn::ffi_util {
namespace {

ffi::Error ActivationFwdCpu(ffi::ThreadPool pool, ffi::AnyBuffer x,
                            ffi::Result<ffi::AnyBuffer> y, int64_t op,
                            ffi::Span<const double> alpha) {
  activation::Problem p;
  std::string err = make_activation_problem({&x, &*y}, op, alpha, &p);
  if (!err.empty()) return invalid("jaxdnn activation fwd: " + err);
  if (p.n == 0) return ffi::Error::Success();
  poison_host(*y);
  return to_error(activation::cpu_forward(p, x.untyped_data(), y->untyped_data(),
                                          FfiParallel(pool)));
}

ffi::Error ActivationBwdCpu(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer dy,
                            ffi::Result<ffi::AnyBuffer> dx, int64_t op,
                            ffi::Span<const double> alpha) {
  activation::Problem p;
  std::string err = make_activation_problem({&x, &dy, &*dx}, op, alpha, &p);
  if (!err.empty()) return invalid("jaxdnn activation bwd: " + err);
  if (p.n == 0) return ffi::Error::Success();
  poison_host(*dx);
  return to_error(activation::cpu_backward(p, x.untyped_data(), dy.untyped_data(),
                                           dx->untyped_data(), FfiParallel(pool)));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kActivationFwdCpu, ActivationFwdCpu,
                       bind_activation_attrs(ffi::Ffi::Bind()
                                                 .Ctx<ffi::ThreadPool>()
                                                 .Arg<ffi::AnyBuffer>()
                                                 .Ret<ffi::AnyBuffer>()));
XLA_FFI_DEFINE_HANDLER(kActivationBwdCpu, ActivationBwdCpu,
                       bind_activation_attrs(ffi::Ffi::Bind()
                                                 .Ctx<ffi::ThreadPool>()
                                                 .Arg<ffi::AnyBuffer>()
                                                 .Arg<ffi::AnyBuffer>()
                                                 .Ret<ffi::AnyBuffer>()));

JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_activation_fwd", kActivationFwdCpu);
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_activation_bwd", kActivationBwdCpu);

}  // namespace jaxdnn::ffi_util
