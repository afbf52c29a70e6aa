// XLA:CPU handlers for the pooling ops: decode the call, poison the results, run the kernel on
// the intra-op thread pool.

#include "cc/ffi/cpu_parallel.h"
#include "cc/ffi/handlers.h"
#include "cc/ffi/pool_common.h"

namespace jaxdnn::ffi_util {
namespace {

template <pool::Op kOp>
ffi::Error PoolCpu(ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets,
                   I64Span window, I64Span stride, I64Span pad_lo, I64Span pad_hi,
                   bool count_include_pad) {
  PoolCall call;
  ffi::Error e = decode_pool_call(kOp, args, rets,
                                  {window, stride, pad_lo, pad_hi, count_include_pad}, &call);
  if (e.failure() || call.empty) return e;
  for (auto& r : call.results)
    if (r) poison_host(*r);
  return to_error(pool::cpu_run(call.args, call.bufs, FfiParallel(pool)));
}

}  // namespace

#define JAXDNN_POOL_CPU_HANDLER(name, op, target)                                       \
  XLA_FFI_DEFINE_HANDLER(kPool##name##Cpu, PoolCpu<op>,                                  \
                         bind_pool(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));           \
  JAXDNN_REGISTER_CPU_HANDLER(target, kPool##name##Cpu);
JAXDNN_POOL_TARGETS(JAXDNN_POOL_CPU_HANDLER)

}  // namespace jaxdnn::ffi_util
