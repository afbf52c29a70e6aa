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

#define JAXDNN_POOL_CPU_HANDLER(handler, op, target)                                    \
  XLA_FFI_DEFINE_HANDLER(handler, PoolCpu<op>,                                          \
                         bind_pool(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));           \
  JAXDNN_REGISTER_CPU_HANDLER(target, handler)
JAXDNN_POOL_CPU_HANDLER(kPoolMaxFwdCpu, pool::Op::kMaxFwd, "jaxdnn_pool_max_fwd");
JAXDNN_POOL_CPU_HANDLER(kPoolMaxFwdIndexCpu, pool::Op::kMaxFwdIndex, "jaxdnn_pool_max_fwd_index");
JAXDNN_POOL_CPU_HANDLER(kPoolMaxGatherCpu, pool::Op::kMaxGather, "jaxdnn_pool_max_gather");
JAXDNN_POOL_CPU_HANDLER(kPoolMaxScatterCpu, pool::Op::kMaxScatter, "jaxdnn_pool_max_scatter");
JAXDNN_POOL_CPU_HANDLER(kPoolAvgFwdCpu, pool::Op::kAvgFwd, "jaxdnn_pool_avg_fwd");
JAXDNN_POOL_CPU_HANDLER(kPoolAvgBwdCpu, pool::Op::kAvgBwd, "jaxdnn_pool_avg_bwd");

}  // namespace jaxdnn::ffi_util
