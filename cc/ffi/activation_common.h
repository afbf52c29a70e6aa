// The activation handlers of both platforms: the operands and attributes of the two targets
// (identical on both platforms), buffers + attributes -> activation::Problem, and the handler
// bodies, templated over the platform.
//
//   jaxdnn_activation_fwd(x)      -> y    attributes: op (int64), alpha (float64[1])
//   jaxdnn_activation_bwd(x, dy)  -> dx   the same attributes
// alpha travels as a one-element float64 array so that float64 computation sees the exact
// Python value (scalar float attributes are float32 by the project's convention).
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "cc/activation/activation.h"
#include "cc/ffi/common.h"

namespace jaxdnn::ffi_util {

template <typename Binding>
auto bind_activation_attrs(Binding b) {
  return std::move(b).template Attr<int64_t>("op").template Attr<ffi::Span<const double>>("alpha");
}

// Checks that every buffer has the dtype and element count of the first, and decodes the
// attributes. On failure returns an error message.
inline std::string make_activation_problem(std::initializer_list<const ffi::AnyBuffer*> buffers,
                                           int64_t op, ffi::Span<const double> alpha,
                                           activation::Problem* out) {
  const ffi::AnyBuffer& first = **buffers.begin();
  auto dtype = to_dtype(first.element_type());
  if (!dtype) return "operands must be float32, float64, float16 or bfloat16";
  for (const ffi::AnyBuffer* b : buffers)
    if (b->element_type() != first.element_type() || b->element_count() != first.element_count())
      return "operands and result must have one dtype and one size";
  if (op < 0 || op >= activation::kNumOps) return "unknown op code " + std::to_string(op);
  if (alpha.size() != 1) return "alpha must hold one value";
  *out = {static_cast<activation::Op>(op), alpha[0], *dtype, int64_t(first.element_count())};
  return {};
}

// The two handlers on one platform (cpu_common.h: CpuPlatform, cuda_common.h: CudaPlatform),
// running that platform's kernels kForward and kBackward (cc/activation).
template <typename Platform, auto kForward, auto kBackward>
struct ActivationHandlers {
  using Context = typename Platform::Context;

  static ffi::Error Fwd(Context ctx, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, int64_t op,
                        ffi::Span<const double> alpha) {
    activation::Problem p;
    std::string err = make_activation_problem({&x, &*y}, op, alpha, &p);
    if (!err.empty()) return invalid("jaxdnn activation fwd: " + err);
    if (p.n == 0) return ffi::Error::Success();
    if (ffi::Error e = Platform::poison(*y, ctx); e.failure()) return e;
    return to_error(kForward(p, x.untyped_data(), y->untyped_data(), Platform::exec(ctx)));
  }

  static ffi::Error Bwd(Context ctx, ffi::AnyBuffer x, ffi::AnyBuffer dy,
                        ffi::Result<ffi::AnyBuffer> dx, int64_t op, ffi::Span<const double> alpha) {
    activation::Problem p;
    std::string err = make_activation_problem({&x, &dy, &*dx}, op, alpha, &p);
    if (!err.empty()) return invalid("jaxdnn activation bwd: " + err);
    if (p.n == 0) return ffi::Error::Success();
    if (ffi::Error e = Platform::poison(*dx, ctx); e.failure()) return e;
    return to_error(kBackward(p, x.untyped_data(), dy.untyped_data(), dx->untyped_data(),
                              Platform::exec(ctx)));
  }

  static XLA_FFI_Handler* fwd() {
    XLA_FFI_DEFINE_HANDLER(handler, Fwd,
                           bind_activation_attrs(Platform::bind()
                                                     .template Arg<ffi::AnyBuffer>()
                                                     .template Ret<ffi::AnyBuffer>()),
                           Platform::kTraits);
    return handler;
  }

  static XLA_FFI_Handler* bwd() {
    XLA_FFI_DEFINE_HANDLER(handler, Bwd,
                           bind_activation_attrs(Platform::bind()
                                                     .template Arg<ffi::AnyBuffer>()
                                                     .template Arg<ffi::AnyBuffer>()
                                                     .template Ret<ffi::AnyBuffer>()),
                           Platform::kTraits);
    return handler;
  }
};

}  // namespace jaxdnn::ffi_util
