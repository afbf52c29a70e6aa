// XLA:CPU handlers for the activation kernels (activation_common.h): decode, then run on the
// intra-op thread pool.

#include "cc/activation/activation.h"
#include "cc/ffi/activation_common.h"
#include "cc/ffi/cpu_common.h"
#include "cc/ffi/handlers.h"

namespace jaxdnn::ffi_util {
namespace {

using Handlers = ActivationHandlers<CpuPlatform, activation::cpu_forward, activation::cpu_backward>;

}  // namespace

JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_activation_fwd", Handlers::fwd());
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_activation_bwd", Handlers::bwd());

}  // namespace jaxdnn::ffi_util
