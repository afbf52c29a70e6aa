// XLA:CPU handlers for the three conv directions (conv_common.h): decode, pick the named
// algorithm, run it on the intra-op thread pool.

#include "cc/conv/cpu_algorithms.h"
#include "cc/ffi/conv_common.h"
#include "cc/ffi/cpu_common.h"
#include "cc/ffi/handlers.h"

namespace jaxdnn::ffi_util {
namespace {

// CPU algorithms get no workspace operand; they allocate their scratch themselves.
ffi::Error run(const conv::CpuAlgorithm& alg, const conv::Args& args, const conv::Buffers& bufs,
               ffi::AnyBuffer& result, ffi::AnyBuffer& /*workspace*/, ffi::ThreadPool pool) {
  poison_host(result);
  return to_error(alg.run(args, bufs, FfiParallel(pool)));
}

Status epilogue(const conv::Epilogue& e, const conv::EpilogueBuffers& b, ffi::ThreadPool pool) {
  return conv::cpu_epilogue(e, b, FfiParallel(pool));
}

using Handlers = ConvHandlers<CpuPlatform, conv::cpu_algorithms, run, epilogue>;

}  // namespace

using conv::Direction;
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_conv_fwd", Handlers::handler<Direction::kFwd>());
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_conv_bwd_data", Handlers::handler<Direction::kBwdData>());
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_conv_bwd_filter", Handlers::handler<Direction::kBwdFilter>());
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_conv_fwd_fused", Handlers::fused_handler());

}  // namespace jaxdnn::ffi_util
