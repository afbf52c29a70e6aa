// XLA:CPU handlers for the three conv directions: decode, pick the named algorithm, run it on
// the intra-op thread pool.

#include <string>

#include "cc/conv/cpu_algorithms.h"
#include "cc/ffi/conv_common.h"
#include "cc/ffi/cpu_parallel.h"
#include "cc/ffi/handlers.h"

namespace jaxdnn::ffi_util {
namespace {

template <conv::Direction kDir>
ffi::Error ConvCpu(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                   ffi::Result<ffi::AnyBuffer> result, ffi::Result<ffi::AnyBuffer> /*workspace*/,
                   I64Span stride, I64Span pad_lo, I64Span pad_hi, I64Span lhs_dilation,
                   I64Span rhs_dilation, int64_t groups, bool tf32, std::string_view algo) {
  conv::Args args;
  const conv::CpuAlgorithm* alg = nullptr;
  ffi::Error e = prepare_conv_call(
      kDir, a, b, *result, {stride, pad_lo, pad_hi, lhs_dilation, rhs_dilation, groups, tf32}, algo,
      conv::cpu_algorithms(), &args, &alg);
  if (e.failure() || result->element_count() == 0) return e;
  poison_host(*result);
  return to_error(alg->run(args, conv_buffers(kDir, a, b, *result), FfiParallel(pool)));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kConvFwdCpu, ConvCpu<conv::Direction::kFwd>,
                       bind_conv(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER(kConvBwdDataCpu, ConvCpu<conv::Direction::kBwdData>,
                       bind_conv(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER(kConvBwdFilterCpu, ConvCpu<conv::Direction::kBwdFilter>,
                       bind_conv(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_conv_fwd", kConvFwdCpu);
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_conv_bwd_data", kConvBwdDataCpu);
JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_conv_bwd_filter", kConvBwdFilterCpu);

}  // namespace jaxdnn::ffi_util
