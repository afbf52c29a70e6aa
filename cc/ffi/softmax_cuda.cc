// XLA:GPU handlers for the softmax kernels: decode, then enqueue on XLA's stream. No allocation
// or synchronisation, so they are CUDA-graph compatible.

#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "cc/common/registry.h"
#include "cc/ffi/cuda_common.h"
#include "cc/ffi/handlers.h"
#include "cc/ffi/softmax_common.h"
#include "cc/softmax/cuda_softmax.h"

namespace jaxdnn::ffi_util {
namespace {

// The named algorithm must exist and support the problem (the Python layer chose it so).
std::string check_algorithm(const softmax::Problem& p, const std::string& algo) {
  const softmax::CudaAlgorithm* a = find_by_name(softmax::cuda_algorithms(), algo.c_str());
  if (a == nullptr) return "unknown algorithm '" + algo + "'";
  Support s = a->supports(p);
  return s.ok ? std::string() : algo + ": " + s.reason;
}

ffi::Error SoftmaxFwdCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                          bool log, std::string_view algo_view) {
  const std::string algo(algo_view);
  softmax::Problem p;
  std::string err = make_softmax_problem({&x, &*y}, &p);
  if (err.empty()) err = check_algorithm(p, algo);
  if (!err.empty()) return invalid("jaxdnn softmax fwd: " + err);
  if (p.rows * p.cols == 0) return ffi::Error::Success();
  if (ffi::Error e = poison_device(*y, stream); e.failure()) return e;
  return to_error(softmax::cuda_forward(algo.c_str(), p, log, x.untyped_data(),
                                        y->untyped_data(), stream));
}

ffi::Error SoftmaxBwdCuda(cudaStream_t stream, ffi::AnyBuffer y, ffi::AnyBuffer c,
                          ffi::Result<ffi::AnyBuffer> out, int64_t kind,
                          std::string_view algo_view) {
  const std::string algo(algo_view);
  softmax::Problem p;
  std::string err = make_softmax_problem({&y, &c, &*out}, &p);
  if (err.empty() && (kind < 0 || kind >= softmax::kNumLinear)) err = "unknown kind";
  if (err.empty()) err = check_algorithm(p, algo);
  if (!err.empty()) return invalid("jaxdnn softmax bwd: " + err);
  if (p.rows * p.cols == 0) return ffi::Error::Success();
  if (ffi::Error e = poison_device(*out, stream); e.failure()) return e;
  return to_error(softmax::cuda_backward(algo.c_str(), p, static_cast<softmax::Linear>(kind),
                                         y.untyped_data(), c.untyped_data(), out->untyped_data(),
                                         stream));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kSoftmaxFwdCuda, SoftmaxFwdCuda,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<bool>("log")
                           .Attr<std::string_view>("algo"),
                       {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kSoftmaxBwdCuda, SoftmaxBwdCuda,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<int64_t>("kind")
                           .Attr<std::string_view>("algo"),
                       {ffi::Traits::kCmdBufferCompatible});

JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_softmax_fwd", kSoftmaxFwdCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_softmax_bwd", kSoftmaxBwdCuda);

}  // namespace jaxdnn::ffi_util
