// XLA:GPU handlers for the pooling ops: decode the call, poison the results, enqueue the
// kernel on XLA's stream. No allocation or synchronisation, so they are CUDA-graph compatible.

#include <cuda_runtime.h>

#include "cc/ffi/cuda_common.h"
#include "cc/ffi/handlers.h"
#include "cc/pool/cuda_pool.h"
#include "cc/ffi/pool_common.h"

namespace jaxdnn::ffi_util {
namespace {

template <pool::Op kOp>
ffi::Error PoolCuda(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                    I64Span window, I64Span stride, I64Span pad_lo, I64Span pad_hi,
                    bool count_include_pad) {
  PoolCall call;
  ffi::Error e = decode_pool_call(kOp, args, rets,
                                  {window, stride, pad_lo, pad_hi, count_include_pad}, &call);
  if (e.failure() || call.empty) return e;
  for (auto& r : call.results)
    if (r)
      if (ffi::Error p = poison_device(*r, stream); p.failure()) return p;
  return to_error(pool::cuda_run(call.args, call.bufs, stream));
}

}  // namespace

#define JAXDNN_POOL_CUDA_HANDLER(name, op, target)                                      \
  XLA_FFI_DEFINE_HANDLER(kPool##name##Cuda, PoolCuda<op>,                                \
                         bind_pool(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()), \
                         {ffi::Traits::kCmdBufferCompatible});                          \
  JAXDNN_REGISTER_CUDA_HANDLER(target, kPool##name##Cuda);
JAXDNN_POOL_TARGETS(JAXDNN_POOL_CUDA_HANDLER)

}  // namespace jaxdnn::ffi_util
