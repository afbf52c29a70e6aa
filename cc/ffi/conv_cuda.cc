// XLA:GPU handlers for the three conv directions (conv_common.h): decode, pick the named
// algorithm, enqueue it on XLA's stream. No allocation or synchronisation, so they are
// CUDA-graph compatible.

#include <cuda_runtime.h>

#include <string>

#include "cc/conv/cuda_algorithms.h"
#include "cc/ffi/conv_common.h"
#include "cc/ffi/cuda_common.h"
#include "cc/ffi/handlers.h"

namespace jaxdnn::ffi_util {
namespace {

// The algorithm's scratch is the workspace operand, which XLA allocates.
ffi::Error run(const conv::CudaAlgorithm& alg, const conv::Args& args, const conv::Buffers& bufs,
               ffi::AnyBuffer& result, ffi::AnyBuffer& workspace, cudaStream_t stream) {
  const int64_t need = alg.workspace_bytes(args);
  if (int64_t(workspace.size_bytes()) < need)
    return ffi::Error::Internal("jaxdnn conv " + std::string(alg.name) + ": workspace of " +
                                std::to_string(workspace.size_bytes()) + " bytes, needs " +
                                std::to_string(need));
  if (ffi::Error p = poison_device(result, stream); p.failure()) return p;
  return to_error(alg.run(args, bufs, need > 0 ? workspace.untyped_data() : nullptr, stream));
}

using Handlers = ConvHandlers<CudaPlatform, conv::cuda_algorithms, run, conv::cuda_epilogue>;

}  // namespace

using conv::Direction;
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_conv_fwd", Handlers::handler<Direction::kFwd>());
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_conv_bwd_data", Handlers::handler<Direction::kBwdData>());
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_conv_bwd_filter", Handlers::handler<Direction::kBwdFilter>());
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_conv_fwd_fused", Handlers::fused_handler());

}  // namespace jaxdnn::ffi_util
