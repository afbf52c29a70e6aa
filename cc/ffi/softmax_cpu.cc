// XLA:CPU handlers for the softmax kernels: decode, then run on the intra-op thread pool.

#include "cc/ffi/cpu_parallel.h"
#include "cc/ffi/handlers.h"
#include "cc/ffi/softmax_common.h"

namespace jaxdnn::ffi_util {
namespace {

ffi::Error SoftmaxFwdCpu(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                         bool log) {
  softmax::Problem p;
  std::string err = make_softmax_problem({&x, &*y}, &p);
  if (!err.empty()) return invalid("jaxdnn softmax fwd: " + err);
  if (p.rows * p.cols == 0) return ffi::Error::Success();
  poison_host(*y);
  return to_error(softmax::cpu_forward(p, log, x.untyped_data(), y->untyped_data(),
                                       FfiParallel(pool)));
}

ffi::Error SoftmaxBwdCpu(ffi::ThreadPool pool, ffi::AnyBuffer y, ffi::AnyBuffer c,
                         ffi::Result<ffi::AnyBuffer> out, int64_t kind) {
  softmax::Problem p;
  std::string err = make_softmax_problem({&y, &c, &*out}, &p);
  if (err.empty() && (kind < 0 || kind >= softmax::kNumLinear)) err = "unknown kind";
  if (!err.empty()) return invalid("jaxdnn softmax bwd: " + err);
  if (p.rows * p.cols == 0) return ffi::Error::Success();
  poison_host(*out);
  return to_error(softmax::cpu_backward(p, static_cast<softmax::Linear>(kind), y.untyped_data(),
                                        c.untyped_data(), out->untyped_data(),
                                        FfiParallel(pool)));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kSoftmaxFwdCpu, SoftmaxFwdCpu,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<bool>("log"));
XLA_FFI_DEFINE_HANDLER(kSoftmaxBwdCpu, SoftmaxBwdCpu,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<int64_t>("kind"));

JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_softmax_fwd", kSoftmaxFwdCpu);
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_softmax_bwd", kSoftmaxBwdCpu);

}  // namespace jaxdnn::ffi_util
