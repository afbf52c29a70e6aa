// XLA:CPU handlers for the pooling ops (cc/ffi/pool_common.h holds their body): poison the
// results on the host, run the kernel on the intra-op thread pool.

#include "cc/ffi/cpu_parallel.h"
#include "cc/ffi/handlers.h"
#include "cc/ffi/pool_common.h"

namespace jaxdnn::ffi_util {
namespace {

struct CpuPool {
  using Ctx = ffi::ThreadPool;
  static const std::vector<const pool::Algorithm*>& algorithms() { return pool::cpu_algorithms(); }
  static ffi::Error poison(Ctx, ffi::AnyBuffer& b) {
    poison_host(b);
    return ffi::Error::Success();
  }
  // (the CPU has one algorithm per direction)
  static Status run(const pool::Algorithm&, const pool::Args& a, const pool::Buffers& b,
                    Ctx pool) {
    return pool::cpu_run(a, b, FfiParallel(pool));
  }
};

}  // namespace

#define JAXDNN_POOL_CPU_HANDLER(name, op, target)                                       \
  XLA_FFI_DEFINE_HANDLER(kPool##name##Cpu, (pool_handler<CpuPool, op>),                \
                         bind_pool(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));           \
  JAXDNN_REGISTER_CPU_HANDLER(target, kPool##name##Cpu);
JAXDNN_POOL_TARGETS(JAXDNN_POOL_CPU_HANDLER)

}  // namespace jaxdnn::ffi_util
