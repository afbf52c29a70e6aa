// XLA:CPU handlers of the norm targets (cc/ffi/norm_common.h lists them and holds their
// bodies): poison the results on the host, run the kernels on the intra-op thread pool.

#include "cc/ffi/cpu_common.h"
#include "cc/ffi/cpu_parallel.h"
#include "cc/ffi/handlers.h"
#include "cc/ffi/norm_common.h"
#include "cc/norm/cpu_norm.h"

namespace jaxdnn::ffi_util {
namespace {

struct CpuNorm : CpuPlatform {
  using Ctx = ffi::ThreadPool;
  static std::vector<const norm::Algorithm*> algorithms(norm::Pass pass, const norm::Problem& p) {
    return norm::cpu_algorithms(pass, p);
  }
  static ffi::Error poison(Ctx, std::initializer_list<ffi::Result<ffi::AnyBuffer>*> results) {
    for (auto* r : results) poison_host(**r);
    return ffi::Error::Success();
  }
  // (each CPU algorithm is its path's kernels, which the entry points pick from the shape)
  static Status forward(const norm::Algorithm&, const norm::Problem& p,
                        const norm::FwdBuffers& b, norm::Half, Ctx pool) {
    return norm::cpu_forward(p, b, FfiParallel(pool));
  }
  static Status inference(const norm::Algorithm&, const norm::Problem& p,
                          const norm::FwdBuffers& b, Ctx pool) {
    return norm::cpu_inference(p, b, FfiParallel(pool));
  }
  static Status backward(const norm::Algorithm&, const norm::Problem& p,
                         const norm::BwdBuffers& b, Ctx pool) {
    return norm::cpu_backward(p, b, FfiParallel(pool));
  }
};

using H = NormHandlers<CpuNorm>;

}  // namespace

JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_norm_fwd", H::fwd());
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_norm_infer", H::infer());
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_norm_bwd", H::bwd());
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_norm_infer_bwd", H::infer_bwd());

}  // namespace jaxdnn::ffi_util
