// Conv pieces shared by the CPU and CUDA handlers and modules: the binding (same operands and
// attributes on both platforms), buffers + attributes -> conv::Args, the handler body templated
// over the platform, and the Python-facing problem encoding used by the algorithm queries.
#pragma once

#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <string>
#include <vector>

#include "cc/conv/conv.h"
#include "cc/conv/epilogue.h"
#include "cc/conv/variant.h"
#include "cc/ffi/common.h"

namespace jaxdnn::ffi_util {

using I64Span = ffi::Span<const int64_t>;

// Operands of every conv custom call, in order: a, b -> result, workspace, where (a, b, result)
// is (x, w, y) for fwd, (dy, w, dx) for bwd_data and (x, dy, dw) for bwd_filter, all rank 5 in
// the canonical layouts of cc/conv/conv.h, and workspace is the chosen algorithm's scratch
// (uint8, workspace_bytes long; allocated by XLA so the call stays graph-capturable).
// The attributes every conv call ends with (the window, groups, tf32 and the algorithm).
template <typename Binding>
auto with_conv_attrs(Binding b) {
  return std::move(b).template Attr<I64Span>("stride")
      .template Attr<I64Span>("pad_lo")
      .template Attr<I64Span>("pad_hi")
      .template Attr<I64Span>("lhs_dilation")
      .template Attr<I64Span>("rhs_dilation")
      .template Attr<int64_t>("groups")
      .template Attr<bool>("tf32")
      .template Attr<std::string_view>("algo");
}

template <typename Binding>
auto bind_conv(Binding b) {
  return with_conv_attrs(std::move(b).template Arg<ffi::AnyBuffer>()
                             .template Arg<ffi::AnyBuffer>()
                             .template Ret<ffi::AnyBuffer>()
                             .template Ret<ffi::AnyBuffer>());
}

// The DType of a conv operand: the float dtypes of to_dtype and the integer ones that only
// conv runs (int8, int32, int64).
inline std::optional<DType> conv_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::S8: return DType::kS8;
    case ffi::DataType::S32: return DType::kS32;
    case ffi::DataType::S64: return DType::kS64;
    default: return to_dtype(t);
  }
}

struct ConvAttrs {
  I64Span stride, pad_lo, pad_hi, lhs_dilation, rhs_dilation;
  int64_t groups;
  bool tf32;
};

// Builds and validates the problem of a call. On failure returns an error message.
inline std::string make_args(conv::Direction dir, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                             const ffi::AnyBuffer& result, const ConvAttrs& at, conv::Args* out) {
  auto da = a.dimensions(), db = b.dimensions(), dr = result.dimensions();
  if (da.size() != 5 || db.size() != 5 || dr.size() != 5)
    return "conv operands must be rank 5 (canonical layout)";
  for (I64Span s : {at.stride, at.pad_lo, at.pad_hi, at.lhs_dilation, at.rhs_dilation})
    if (s.size() != 3) return "conv window attributes must have 3 entries";
  // x, w, y dims by role.
  ffi::Span<const int64_t> x = da, w = db, y = dr;
  if (dir == conv::Direction::kBwdData) { y = da; w = db; x = dr; }
  if (dir == conv::Direction::kBwdFilter) { x = da; y = db; w = dr; }
  conv::Problem& p = out->p;
  p.N = x[0]; p.C = x[4]; p.K = w[4]; p.G = at.groups;
  for (int i = 0; i < 3; ++i) {
    p.in[i] = x[1 + i]; p.filt[i] = w[i]; p.out[i] = y[1 + i];
    p.stride[i] = at.stride[i]; p.pad_lo[i] = at.pad_lo[i]; p.pad_hi[i] = at.pad_hi[i];
    p.lhs_dil[i] = at.lhs_dilation[i]; p.rhs_dil[i] = at.rhs_dilation[i];
  }
  if (y[0] != p.N || y[4] != p.K || (p.G > 0 && w[3] * p.G != p.C))
    return "conv operand shapes are inconsistent";
  Status s = conv::validate(p);
  if (!s.ok()) return s.message;
  out->dir = dir;
  auto in_t = conv_dtype(a.element_type()), b_t = conv_dtype(b.element_type()),
       out_t = conv_dtype(result.element_type());
  if (!in_t || !b_t || !out_t || *in_t != *b_t)
    return "conv operands must be two arrays of one float dtype, or of int8, int32 or int64";
  out->in = *in_t;
  out->out = *out_t;
  out->tf32 = at.tf32;
  return {};
}

inline conv::Buffers conv_buffers(conv::Direction dir, const ffi::AnyBuffer& a,
                                  const ffi::AnyBuffer& b, ffi::AnyBuffer& result) {
  conv::Buffers bufs;
  bufs.result = result.untyped_data();
  switch (dir) {
    case conv::Direction::kFwd: bufs.x = a.untyped_data(); bufs.w = b.untyped_data(); break;
    case conv::Direction::kBwdData: bufs.y = a.untyped_data(); bufs.w = b.untyped_data(); break;
    case conv::Direction::kBwdFilter: bufs.x = a.untyped_data(); bufs.y = b.untyped_data(); break;
  }
  return bufs;
}

// The common prologue of a conv handler: decode the call, find the named algorithm and its
// variant (cc/conv/variant.h) in registry `all` and check that it supports the problem. On
// success *args (with the variant) and *alg are set.
template <typename Algo>
ffi::Error prepare_conv_call(conv::Direction dir, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                             const ffi::AnyBuffer& result, const ConvAttrs& attrs,
                             std::string_view algo, const std::vector<const Algo*>& all,
                             conv::Args* args, const Algo** alg) {
  const std::string where = std::string("jaxdnn conv ") + conv::direction_name(dir);
  std::string err = make_args(dir, a, b, result, attrs, args);
  if (!err.empty()) return invalid(where + ": " + err);
  *alg = conv::find_algorithm(all, algo, &args->variant, &err);
  if (*alg == nullptr) return invalid(where + ": " + err);
  Support sup = conv::algorithm_supports(**alg, *args);
  if (!sup.ok) return invalid(where + " " + std::string(algo) + ": " + sup.reason);
  return ffi::Error::Success();
}

// The fused forward (cc/conv/epilogue.h), jaxdnn_conv_fwd_fused: x, w, bias, residual -> y, c,
// workspace, with the forward's attributes plus act (int64: an activation.h code, or -1 for
// none) and alpha (float64[1]). bias is (K,) in the accumulator type (float, or double for a
// float64 result), residual like y, and c (the convolution's own result, before the epilogue)
// like y; each may be empty for none.
template <typename Binding>
auto bind_conv_fused(Binding b) {
  return with_conv_attrs(std::move(b).template Arg<ffi::AnyBuffer>()
                             .template Arg<ffi::AnyBuffer>()
                             .template Arg<ffi::AnyBuffer>()
                             .template Arg<ffi::AnyBuffer>()
                             .template Ret<ffi::AnyBuffer>()
                             .template Ret<ffi::AnyBuffer>()
                             .template Ret<ffi::AnyBuffer>())
      .template Attr<int64_t>("act")
      .template Attr<ffi::Span<const double>>("alpha");
}

// The epilogue of a fused call, its operands checked against the problem (y: the result).
inline std::string make_epilogue(const conv::Args& args, const ffi::AnyBuffer& bias,
                                 const ffi::AnyBuffer& residual, ffi::AnyBuffer& y,
                                 ffi::AnyBuffer& c, int64_t act, ffi::Span<const double> alpha,
                                 conv::Epilogue* e, conv::EpilogueBuffers* b) {
  const conv::Problem& p = args.p;
  if (is_integer(args.out)) return "the fused epilogue takes float results";
  if (alpha.size() != 1) return "alpha must hold one value";
  if (act < -1 || act >= activation::kNumOps) return "unknown activation code";
  const DType acc = args.out == DType::kF64 ? DType::kF64 : DType::kF32;
  auto like = [&](const ffi::AnyBuffer& t, DType dt, int64_t n) {
    return t.element_count() == 0 ||
           (t.element_count() == n && to_dtype(t.element_type()) == dt);
  };
  if (!like(bias, acc, p.K)) return "bias must be empty or (K,) in the accumulator type";
  if (!like(residual, args.out, p.y_elems())) return "residual must be empty or like y";
  if (!like(c, args.out, p.y_elems())) return "c must be empty or like y";
  *e = {act >= 0, act >= 0 ? activation::Op(act) : activation::Op::kRelu, alpha[0],
        p.N * p.out_spatial(), p.K, args.out};
  *b = {y.untyped_data(), c.element_count() ? c.untyped_data() : nullptr,
        bias.element_count() ? bias.untyped_data() : nullptr,
        residual.element_count() ? residual.untyped_data() : nullptr};
  return {};
}

// The handlers of the three directions on one platform (cpu_common.h: CpuPlatform,
// cuda_common.h: CudaPlatform). kRegistry returns the platform's algorithms
// (cc/conv/*_algorithms.h); kRun(algorithm, args, buffers, result, workspace, context) runs the
// decoded, non-empty call, kEpilogue(epilogue, buffers, context) the fused forward's pass.
template <typename Platform, auto kRegistry, auto kRun, auto kEpilogue>
struct ConvHandlers {
  template <conv::Direction kDir>
  static ffi::Error Call(typename Platform::Context ctx, ffi::AnyBuffer a, ffi::AnyBuffer b,
                         ffi::Result<ffi::AnyBuffer> result, ffi::Result<ffi::AnyBuffer> workspace,
                         I64Span stride, I64Span pad_lo, I64Span pad_hi, I64Span lhs_dilation,
                         I64Span rhs_dilation, int64_t groups, bool tf32, std::string_view algo) {
    conv::Args args;
    std::decay_t<decltype(kRegistry().front())> alg = nullptr;
    ffi::Error e = prepare_conv_call(
        kDir, a, b, *result, {stride, pad_lo, pad_hi, lhs_dilation, rhs_dilation, groups, tf32},
        algo, kRegistry(), &args, &alg);
    if (e.failure() || result->element_count() == 0) return e;
    return kRun(*alg, args, conv_buffers(kDir, a, b, *result), *result, *workspace, ctx);
  }

  // The forward into c (or y when c is not asked for), then the epilogue's pass into y unless
  // the algorithm's kernels applied it as they stored (conv::FusedEpilogue).
  static ffi::Error Fused(typename Platform::Context ctx, ffi::AnyBuffer x, ffi::AnyBuffer w,
                          ffi::AnyBuffer bias, ffi::AnyBuffer residual,
                          ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> c,
                          ffi::Result<ffi::AnyBuffer> workspace, I64Span stride, I64Span pad_lo,
                          I64Span pad_hi, I64Span lhs_dilation, I64Span rhs_dilation,
                          int64_t groups, bool tf32, std::string_view algo, int64_t act,
                          ffi::Span<const double> alpha) {
    conv::Args args;
    std::decay_t<decltype(kRegistry().front())> alg = nullptr;
    ffi::Error e = prepare_conv_call(
        conv::Direction::kFwd, x, w, *y,
        {stride, pad_lo, pad_hi, lhs_dilation, rhs_dilation, groups, tf32}, algo, kRegistry(),
        &args, &alg);
    if (e.failure() || y->element_count() == 0) return e;
    conv::Epilogue epi;
    conv::EpilogueBuffers eb;
    const std::string err = make_epilogue(args, bias, residual, *y, *c, act, alpha, &epi, &eb);
    if (!err.empty()) return invalid("jaxdnn conv fwd_fused: " + err);
    ffi::AnyBuffer& conv_out = eb.c ? *c : *y;
    const conv::FusedEpilogue fused{epi, eb};
    args.epilogue = &fused;
    e = kRun(*alg, args, conv_buffers(conv::Direction::kFwd, x, w, conv_out), conv_out,
             *workspace, ctx);
    if (e.failure() || fused.applied) return e;
    return to_error(kEpilogue(epi, eb, ctx));
  }

  template <conv::Direction kDir>
  static XLA_FFI_Handler* handler() {
    XLA_FFI_DEFINE_HANDLER(h, Call<kDir>, bind_conv(Platform::bind()), Platform::kTraits);
    return h;
  }

  static XLA_FFI_Handler* fused_handler() {
    XLA_FFI_DEFINE_HANDLER(h, Fused, bind_conv_fused(Platform::bind()), Platform::kTraits);
    return h;
  }
};

// Python encodes a problem as 29 ints: N C K G, in[3], filt[3], out[3], stride[3], pad_lo[3],
// pad_hi[3], lhs_dil[3], rhs_dil[3], tf32 (jaxdnn/ops/conv.py: ConvSpec.encode()).
inline conv::Problem decode_problem(const std::vector<int64_t>& v) {
  conv::Problem p;
  p.N = v.at(0); p.C = v.at(1); p.K = v.at(2); p.G = v.at(3);
  for (int i = 0; i < 3; ++i) {
    p.in[i] = v.at(4 + i); p.filt[i] = v.at(7 + i); p.out[i] = v.at(10 + i);
    p.stride[i] = v.at(13 + i); p.pad_lo[i] = v.at(16 + i); p.pad_hi[i] = v.at(19 + i);
    p.lhs_dil[i] = v.at(22 + i); p.rhs_dil[i] = v.at(25 + i);
  }
  return p;
}

inline DType dtype_from_name(const std::string& s) {
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kS8, DType::kS32,
                  DType::kS64})
    if (s == dtype_name(t)) return t;
  throw std::invalid_argument("unsupported dtype '" + s + "'");
}

}  // namespace jaxdnn::ffi_util
