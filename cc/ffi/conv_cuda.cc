// XLA:GPU handlers for the three conv directions: decode, pick the named algorithm, enqueue
// it on XLA's stream. No allocation or synchronisation, so they are CUDA-graph compatible.

#include <cuda_runtime.h>

#include <string>

#include "cc/conv/cuda_algorithms.h"
#include "cc/ffi/conv_common.h"
#include "cc/ffi/cuda_common.h"
#include "cc/ffi/handlers.h"

namespace jaxdnn::ffi_util {
namespace {

template <conv::Direction kDir>
ffi::Error ConvCuda(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Result<ffi::AnyBuffer> result, ffi::Result<ffi::AnyBuffer> workspace,
                    I64Span stride, I64Span pad_lo, I64Span pad_hi, I64Span lhs_dilation,
                    I64Span rhs_dilation, int64_t groups, bool tf32, std::string_view algo) {
  conv::Args args;
  const conv::CudaAlgorithm* alg = nullptr;
  ffi::Error e = prepare_conv_call(
      kDir, a, b, *result, {stride, pad_lo, pad_hi, lhs_dilation, rhs_dilation, groups, tf32}, algo,
      conv::cuda_algorithms(), &args, &alg);
  if (e.failure() || result->element_count() == 0) return e;
  const int64_t need = alg->workspace_bytes(args);
  if (int64_t(workspace->size_bytes()) < need)
    return ffi::Error::Internal("jaxdnn conv " + std::string(algo) + ": workspace of " +
                                std::to_string(workspace->size_bytes()) + " bytes, needs " +
                                std::to_string(need));
  if (ffi::Error p = poison_device(*result, stream); p.failure()) return p;
  return to_error(alg->run(args, conv_buffers(kDir, a, b, *result),
                           need > 0 ? workspace->untyped_data() : nullptr, stream));
}

}  // namespace

#define JAXDNN_CONV_CUDA_HANDLER(name, dir)                                                   \
  XLA_FFI_DEFINE_HANDLER(name, ConvCuda<dir>,                                                 \
                         bind_conv(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()), \
                         {ffi::Traits::kCmdBufferCompatible})
JAXDNN_CONV_CUDA_HANDLER(kConvFwdCuda, conv::Direction::kFwd);
JAXDNN_CONV_CUDA_HANDLER(kConvBwdDataCuda, conv::Direction::kBwdData);
JAXDNN_CONV_CUDA_HANDLER(kConvBwdFilterCuda, conv::Direction::kBwdFilter);

JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_conv_fwd", kConvFwdCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_conv_bwd_data", kConvBwdDataCuda);
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_conv_bwd_filter", kConvBwdFilterCuda);

}  // namespace jaxdnn::ffi_util
