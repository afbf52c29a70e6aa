// XLA:GPU handlers for the activation kernels: decode, then enqueue on XLA's stream. No
// allocation or synchronisation, so they are CUDA-graph compatible.

#include <cuda_runtime.h>

#include "cc/activation/cuda_activation.h"
#include "cc/ffi/activation_common.h"
#include "cc/ffi/cuda_common.h"
#include "cc/ffi/handlers.h"

namespace jaxdnn::ffi_util {
namespace {

ffi::Error ActivationFwdCuda(cudaStream_t stream, ffi::AnyBuffer x,
                             ffi::Result<ffi::AnyBuffer> y, int64_t op,
                             ffi::Span<const double> alpha) {
  activation::Problem p;
  std::string err = make_activation_problem({&x, &*y}, op, alpha, &p);
  if (!err.empty()) return invalid("jaxdnn activation fwd: " + err);
  if (p.n == 0) return ffi::Error::Success();
  if (ffi::Error e = poison_device(*y, stream); e.failure()) return e;
  return to_error(activation::cuda_forward(p, x.untyped_data(), y->untyped_data(), stream));
}

ffi::Error ActivationBwdCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer dy,
                             ffi::Result<ffi::AnyBuffer> dx, int64_t op,
                             ffi::Span<const double> alpha) {
  activation::Problem p;
  std::string err = make_activation_problem({&x, &dy, &*dx}, op, alpha, &p);
  if (!err.empty()) return invalid("jaxdnn activation bwd: " + err);
  if (p.n == 0) return ffi::Error::Success();
  if (ffi::Error e = poison_device(*dx, stream); e.failure()) return e;
  return to_error(activation::cuda_backward(p, x.untyped_data(), dy.untyped_data(),
                                            dx->untyped_data(), stream));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kActivationFwdCuda, ActivationFwdCuda,
                       bind_activation_attrs(ffi::Ffi::Bind()
                                                 .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                                 .Arg<ffi::AnyBuffer>()
                                                 .Ret<ffi::AnyBuffer>()),
                       {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kActivationBwdCuda, ActivationBwdCuda,
                       bind_activation_attrs(ffi::Ffi::Bind()
                                                 .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                                 .Arg<ffi::AnyBuffer>()
                                                 .Arg<ffi::AnyBuffer>()
                                                 .Ret<ffi::AnyBuffer>()),
                       {ffi::Traits::kCmdBufferCompatible});

JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_activation_fwd", kActivationFwdCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_activation_bwd", kActivationBwdCuda);

}  // namespace jaxdnn::ffi_util
