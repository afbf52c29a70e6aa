// XLA:GPU handlers for the activation kernels (activation_common.h): decode, then enqueue on
// XLA's stream. No allocation or synchronisation, so they are CUDA-graph compatible.

#include "cc/activation/cuda_activation.h"
#include "cc/ffi/activation_common.h"
#include "cc/ffi/cuda_common.h"
#include "cc/ffi/handlers.h"

namespace jaxdnn::ffi_util {
namespace {

using Handlers =
    ActivationHandlers<CudaPlatform, activation::cuda_forward, activation::cuda_backward>;

}  // namespace

JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_activation_fwd", Handlers::fwd());
JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_activation_bwd", Handlers::bwd());

}  // namespace jaxdnn::ffi_util
