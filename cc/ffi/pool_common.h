// The pooling handlers of both platforms: decoding of the custom calls, the algorithm named in
// the call looked up in the platform's registry, and one platform-templated body
// (cc/ffi/pool_cpu.cc, cc/ffi/pool_cuda.cc instantiate it).
//
// Every pooling target has the same binding: its operands and results (how many depends on
// the op, see pool.h) and the attributes window, stride, pad_lo, pad_hi (3 ints each, for the
// canonical (N, D, H, W, C) problem of pool.h), count_include_pad and algo (an algorithm of
// the platform's registry for the op's direction).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "cc/ffi/common.h"
#include "cc/pool/pool.h"

namespace jaxdnn::ffi_util {

using I64Span = ffi::Span<const int64_t>;

template <typename Binding>
auto bind_pool(Binding b) {
  return std::move(b).RemainingArgs().RemainingRets()
      .template Attr<I64Span>("window")
      .template Attr<I64Span>("stride")
      .template Attr<I64Span>("pad_lo")
      .template Attr<I64Span>("pad_hi")
      .template Attr<bool>("count_include_pad")
      .template Attr<std::string_view>("algo");
}

struct PoolAttrs {
  I64Span window, stride, pad_lo, pad_hi;
  bool count_include_pad;
};

// A decoded call: the problem, the buffers, and the results (to poison before the kernel).
struct PoolCall {
  pool::Args args;
  pool::Buffers bufs;
  std::optional<ffi::AnyBuffer> results[2];
  bool empty = false;  // nothing to compute: every result has zero elements
};

inline ffi::Error decode_pool_call(pool::Op op, const ffi::RemainingArgs& args,
                                   const ffi::RemainingRets& rets, const PoolAttrs& at,
                                   PoolCall* call) {
  const std::string where = std::string("jaxdnn pool ") + pool::op_name(op) + ": ";
  const bool two_args = op == pool::Op::kMaxGather || op == pool::Op::kMaxScatter;
  const bool two_rets = op == pool::Op::kMaxFwdIndex;
  if (args.size() != (two_args ? 2u : 1u) || rets.size() != (two_rets ? 2u : 1u))
    return invalid(where + "wrong number of operands or results");
  for (I64Span s : {at.window, at.stride, at.pad_lo, at.pad_hi})
    if (s.size() != 3) return invalid(where + "window attributes must have 3 entries");

  auto a = args.get<ffi::AnyBuffer>(0);
  auto r = rets.get<ffi::AnyBuffer>(0);
  if (a.has_error()) return a.error();
  if (r.has_error()) return r.error();
  call->results[0] = **r;
  std::optional<ffi::AnyBuffer> index;  // the index operand or result, if the op has one
  if (two_args) {
    auto i = args.get<ffi::AnyBuffer>(1);
    if (i.has_error()) return i.error();
    index = *i;
  }
  if (two_rets) {
    auto i = rets.get<ffi::AnyBuffer>(1);
    if (i.has_error()) return i.error();
    call->results[1] = **i;
    index = **i;
  }

  // x-like (N, *spatial, C) and y-like (N, *out_spatial, C) shapes by role, rank 3 to 5;
  // missing leading spatial dims are 1 (the attributes always have 3 entries).
  const bool reads_y = op == pool::Op::kMaxScatter || op == pool::Op::kAvgBwd;
  const ffi::AnyBuffer& data = *a;
  const ffi::AnyBuffer& result = *call->results[0];
  I64Span x = reads_y ? result.dimensions() : data.dimensions();
  I64Span y = reads_y ? data.dimensions() : result.dimensions();
  const size_t rank = x.size();
  if (rank < 3 || rank > 5 || y.size() != rank || x[0] != y[0] || x[rank - 1] != y[rank - 1])
    return invalid(where + "operands must be (N, *spatial, C) and (N, *out_spatial, C) with 1 "
                           "to 3 spatial dims");
  pool::Problem& p = call->args.p;
  p.N = x[0];
  p.C = x[rank - 1];
  const size_t lead = 5 - rank;  // leading spatial dims of size 1
  for (size_t i = 0; i < 3; ++i) {
    p.in[i] = i < lead ? 1 : x[1 + i - lead];
    p.out[i] = i < lead ? 1 : y[1 + i - lead];
    p.window[i] = at.window[i];
    p.stride[i] = at.stride[i];
    p.pad_lo[i] = at.pad_lo[i];
    p.pad_hi[i] = at.pad_hi[i];
  }
  Status s = pool::validate(p);
  if (!s.ok()) return invalid(where + s.message);

  auto dt = to_dtype(data.element_type());
  if (!dt || to_dtype(result.element_type()) != dt)
    return invalid(where + "operands must share one float dtype (float32, float64, float16, "
                           "bfloat16)");
  if (index) {
    I64Span d = index->dimensions();
    bool same = d.size() == rank;
    for (size_t i = 0; same && i < rank; ++i) same = d[i] == y[i];
    if (!same)
      return invalid(where + "the index operand must have the output's shape");
    const int64_t win = p.window_size();
    if (index->element_type() == ffi::DataType::U8 && win <= pool::kMaxU8Window)
      call->args.index = pool::IndexType::kU8;
    else if (index->element_type() == ffi::DataType::S32 && win < (int64_t(1) << 31) - 1)
      call->args.index = pool::IndexType::kI32;
    else
      return invalid(where + "the index dtype must be uint8 (windows of at most " +
                     std::to_string(pool::kMaxU8Window) + " elements) or int32");
  }
  call->args.op = op;
  call->args.dtype = *dt;
  call->args.count_include_pad = at.count_include_pad;
  call->bufs.a = data.untyped_data();
  call->bufs.result = call->results[0]->untyped_data();
  if (two_args) call->bufs.index_in = index->untyped_data();
  if (two_rets) call->bufs.index_out = call->results[1]->untyped_data();
  call->empty = result.element_count() == 0;
  return ffi::Error::Success();
}

// The handler of op kOp. Platform provides Ctx (the context argument), algorithms() (its
// registry), poison(ctx, buffer) and run(algo, args, bufs, ctx).
template <typename Platform, pool::Op kOp>
ffi::Error pool_handler(typename Platform::Ctx ctx, ffi::RemainingArgs args,
                        ffi::RemainingRets rets, I64Span window, I64Span stride, I64Span pad_lo,
                        I64Span pad_hi, bool count_include_pad, std::string_view algo) {
  PoolCall call;
  ffi::Error e = decode_pool_call(kOp, args, rets,
                                  {window, stride, pad_lo, pad_hi, count_include_pad}, &call);
  if (e.failure()) return e;
  const std::string where = std::string("jaxdnn pool ") + pool::op_name(kOp) + ": algorithm '" +
                            std::string(algo) + "'";
  const pool::Algorithm* a = pool::find_algorithm(Platform::algorithms(), call.args, algo);
  if (a == nullptr) return invalid(where + " is not registered");
  if (Support s = a->supports(call.args); !s.ok) return invalid(where + ": " + s.reason);
  if (call.empty) return ffi::Error::Success();
  for (auto& r : call.results)
    if (r)
      if (ffi::Error p = Platform::poison(ctx, *r); p.failure()) return p;
  return to_error(Platform::run(*a, call.args, call.bufs, ctx));
}

}  // namespace jaxdnn::ffi_util

// The pooling custom-call targets, one X(Name, op, "target") per kernel: each platform's
// handler file instantiates its handlers from this one list.
#define JAXDNN_POOL_TARGETS(X)                                    \
  X(MaxFwd, pool::Op::kMaxFwd, "jaxdnn_pool_max_fwd")             \
  X(MaxFwdIndex, pool::Op::kMaxFwdIndex, "jaxdnn_pool_max_fwd_index") \
  X(MaxGather, pool::Op::kMaxGather, "jaxdnn_pool_max_gather")    \
  X(MaxScatter, pool::Op::kMaxScatter, "jaxdnn_pool_max_scatter") \
  X(AvgFwd, pool::Op::kAvgFwd, "jaxdnn_pool_avg_fwd")             \
  X(AvgBwd, pool::Op::kAvgBwd, "jaxdnn_pool_avg_bwd")
