// XLA:GPU handlers for the pooling ops (cc/ffi/pool_common.h holds their body): poison the
// results on the device, enqueue the kernel on XLA's stream. No allocation or synchronisation,
// so they are CUDA-graph compatible.

#include <cuda_runtime.h>

#include "cc/ffi/cuda_common.h"
#include "cc/ffi/handlers.h"
#include "cc/pool/cuda_pool.h"
#include "cc/ffi/pool_common.h"

namespace jaxdnn::ffi_util {
namespace {

struct CudaPool {
  using Ctx = cudaStream_t;
  static const std::vector<const pool::Algorithm*>& algorithms() {
    return pool::cuda_algorithms();
  }
  static ffi::Error poison(Ctx stream, ffi::AnyBuffer& b) { return poison_device(b, stream); }
  static constexpr auto run = pool::cuda_run;
};

}  // namespace

#define JAXDNN_POOL_CUDA_HANDLER(name, op, target)                                      \
  XLA_FFI_DEFINE_HANDLER(kPool##name##Cuda, (pool_handler<CudaPool, op>),               \
                         bind_pool(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()), \
                         {ffi::Traits::kCmdBufferCompatible});                          \
  JAXDNN_REGISTER_CUDA_HANDLER(target, kPool##name##Cuda);
JAXDNN_POOL_TARGETS(JAXDNN_POOL_CUDA_HANDLER)

}  // namespace jaxdnn::ffi_util
