// The norm handlers of both platforms: the bindings (same operands and attributes on both
// platforms), buffers -> norm::Problem with every shape checked, the algorithm named in the call
// looked up in the platform's registry, and one platform-templated body per target
// (norm_cpu.cc and norm_cuda.cc instantiate them).
//
// Targets. Every operand is a flat vector in the canonical order of cc/norm/norm.h (flat, so
// that XLA passes the caller's buffers with no relayout copy); the shape attribute gives
// [P, A, C, K, T, Q]. Statistics and affine arrays are float32, or float64 for float64 x:
//   jaxdnn_norm_fwd        x, scale, bias, residual           -> y, mean, var, workspace
//   jaxdnn_norm_infer      x, scale, bias, mean, var, residual -> y
//   jaxdnn_norm_bwd        dy, dmean, dvar, x, scale, mean, var, bias, residual
//                                                 -> dx, dscale, dbias, dresidual, workspace
//   jaxdnn_norm_infer_bwd  dy, x, scale, mean, var, bias, residual
//                                    -> dx, dscale, dbias, dmean, dvar, dresidual, workspace
// CUDA only, the halves of a two-call training forward (norm.h: Algorithm::two_calls;
// jaxdnn/ops/norm.py):
//   jaxdnn_norm_fwd_stats  x, scale, bias                     -> mean, var, workspace
//   jaxdnn_norm_fwd_apply  x, scale, bias, mean, var, workspace, residual -> y
// The fused epilogue (norm.h Epilogue): residual is x-like, or empty for none; the backwards
// take bias (affine) and residual only with relu (else both empty), and write dresidual (x-like)
// only with relu and a residual (else it is empty).
// Attributes: shape (int64[6]), eps (float32); centered (bool, training targets only: false is
// RMS norm); relu (bool, every target but fwd_stats); algo (string: an algorithm of the
// platform's registry for the target's pass).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cc/ffi/common.h"
#include "cc/norm/norm.h"


namespace jaxdnn::ffi_util {

using I64Span = ffi::Span<const int64_t>;

struct NormCheck {
  const norm::Problem& p;
  std::string where;

  DType stat_dtype() const { return p.dtype == DType::kF64 ? DType::kF64 : DType::kF32; }

  // An error for `name` unless it is a vector of `elems` values of dtype `dt`.
  ffi::Error expect(const ffi::AnyBuffer& b, const char* name, int64_t elems, DType dt) const {
    if (b.dimensions().size() != 1 || b.dimensions()[0] != elems ||
        to_dtype(b.element_type()) != dt)
      return invalid(where + ": operand " + name + " does not match the problem");
    return ffi::Error::Success();
  }
  ffi::Error like_x(const ffi::AnyBuffer& b, const char* name) const {
    return expect(b, name, p.s.elems(), p.dtype);
  }
  ffi::Error stats(const ffi::AnyBuffer& b, const char* name) const {
    return expect(b, name, p.s.groups(), stat_dtype());
  }
  // A cotangent of a statistics output: the statistics' shape, or empty for a zero cotangent
  // (the usual case: layer norm's callers never see mean and var).
  ffi::Error stats_cotangent(const ffi::AnyBuffer& b, const char* name) const {
    return b.element_count() == 0 ? expect(b, name, 0, stat_dtype()) : stats(b, name);
  }
  ffi::Error affine(const ffi::AnyBuffer& b, const char* name) const {
    return expect(b, name, p.s.Q * p.s.CK(), stat_dtype());
  }
  // An x-like operand of the epilogue, or (allowed) an empty one.
  ffi::Error like_x_or_empty(const ffi::AnyBuffer& b, const char* name, bool allowed) const {
    if (b.element_count() == 0) return expect(b, name, 0, p.dtype);
    if (!allowed) return invalid(where + ": operand " + name + " must be empty here");
    return like_x(b, name);
  }
  ffi::Error workspace(const ffi::AnyBuffer& b, int64_t bytes) const {
    if (b.dimensions().size() != 1 || b.dimensions()[0] != bytes ||
        b.element_type() != ffi::DataType::U8)
      return invalid(where + ": workspace must be " + std::to_string(bytes) + " bytes (uint8)");
    return ffi::Error::Success();
  }
};

// The problem of a call: the shape attribute is [P, A, C, K, T, Q] (cc/norm/norm.h).
inline ffi::Error decode_norm(const char* target, const ffi::AnyBuffer& x, I64Span shape,
                              float eps, bool centered, norm::Problem* p) {
  const std::string where = std::string("jaxdnn ") + target;
  if (shape.size() != 6) return invalid(where + ": the shape attribute needs 6 entries");
  auto dt = to_dtype(x.element_type());
  if (!dt) return invalid(where + ": unsupported dtype of x");
  p->s = {shape[0], shape[1], shape[2], shape[3], shape[4], shape[5]};
  p->dtype = *dt;
  p->centered = centered;
  p->eps = double(eps);
  Status st = norm::validate(p->s);
  if (!st.ok()) return invalid(where + ": " + st.message);
  return NormCheck{*p, where}.like_x(x, "x");
}

// Returns the first failed check, or success.
inline ffi::Error first_error(std::initializer_list<ffi::Error> errors) {
  for (const ffi::Error& e : errors)
    if (e.failure()) return e;
  return ffi::Error::Success();
}

// The epilogue of a call (norm.h Epilogue): relu, and the residual where it is not empty.
inline void set_epilogue(const ffi::AnyBuffer* residual, bool relu, norm::Problem* p,
                         const void** data) {
  p->epi.relu = relu;
  p->epi.residual = residual && residual->element_count() > 0;
  *data = p->epi.residual ? residual->untyped_data() : nullptr;
}

// Decoders of the targets: check every operand and fill the problem and buffers. The training
// forward, or (y null) the statistics half of the two-call forward.
inline ffi::Error prepare_norm_fwd(const char* target, const ffi::AnyBuffer& x,
                                   const ffi::AnyBuffer& scale, const ffi::AnyBuffer& bias,
                                   const ffi::AnyBuffer* residual, ffi::AnyBuffer* y,
                                   ffi::AnyBuffer& mean, ffi::AnyBuffer& var, ffi::AnyBuffer& ws,
                                   I64Span shape, float eps, bool centered, bool relu,
                                   norm::Problem* p, norm::FwdBuffers* b) {
  if (ffi::Error e = decode_norm(target, x, shape, eps, centered, p); e.failure()) return e;
  const NormCheck c{*p, std::string("jaxdnn ") + target};
  if (ffi::Error e = first_error({c.affine(scale, "scale"), c.affine(bias, "bias"),
                                  residual ? c.like_x_or_empty(*residual, "residual", true)
                                           : ffi::Error::Success(),
                                  y ? c.like_x(*y, "y") : ffi::Error::Success(),
                                  c.stats(mean, "mean"), c.stats(var, "var"),
                                  c.workspace(ws, norm::fwd_workspace_bytes(p->s))});
      e.failure())
    return e;
  *b = {x.untyped_data(), scale.untyped_data(), bias.untyped_data(),
        y ? y->untyped_data() : nullptr, mean.untyped_data(), var.untyped_data(),
        ws.untyped_data()};
  set_epilogue(residual, relu, p, &b->residual);
  return ffi::Error::Success();
}

// The inference forward, or (ws given) the apply half of the two-call forward: mean and var
// (and the statistics half's workspace) in.
inline ffi::Error prepare_norm_apply(const char* target, const ffi::AnyBuffer& x,
                                     const ffi::AnyBuffer& scale, const ffi::AnyBuffer& bias,
                                     const ffi::AnyBuffer& mean, const ffi::AnyBuffer& var,
                                     const ffi::AnyBuffer* ws, const ffi::AnyBuffer& residual,
                                     ffi::AnyBuffer& y, I64Span shape, float eps, bool centered,
                                     bool relu, norm::Problem* p, norm::FwdBuffers* b) {
  if (ffi::Error e = decode_norm(target, x, shape, eps, centered, p); e.failure()) return e;
  const NormCheck c{*p, std::string("jaxdnn ") + target};
  if (ffi::Error e = first_error(
          {c.affine(scale, "scale"), c.affine(bias, "bias"), c.stats(mean, "mean"),
           c.stats(var, "var"), c.like_x_or_empty(residual, "residual", true),
           ws ? c.workspace(*ws, norm::fwd_workspace_bytes(p->s)) : ffi::Error::Success(),
           c.like_x(y, "y")});
      e.failure())
    return e;
  *b = {x.untyped_data(), scale.untyped_data(), bias.untyped_data(), y.untyped_data(),
        const_cast<void*>(mean.untyped_data()), const_cast<void*>(var.untyped_data()),
        ws ? const_cast<void*>(ws->untyped_data()) : nullptr};
  set_epilogue(&residual, relu, p, &b->residual);
  return ffi::Error::Success();
}

// The operands both backward kernels share.
inline void set_bwd_buffers(const ffi::AnyBuffer& dy, const ffi::AnyBuffer& x,
                            const ffi::AnyBuffer& scale, const ffi::AnyBuffer& mean,
                            const ffi::AnyBuffer& var, ffi::AnyBuffer& dx, ffi::AnyBuffer& dscale,
                            ffi::AnyBuffer& dbias, ffi::AnyBuffer& ws, norm::BwdBuffers* b) {
  b->dy = dy.untyped_data();
  b->x = x.untyped_data();
  b->scale = scale.untyped_data();
  b->mean = mean.untyped_data();
  b->var = var.untyped_data();
  b->dx = dx.untyped_data();
  b->dscale = dscale.untyped_data();
  b->dbias = dbias.untyped_data();
  b->ws = ws.untyped_data();
}

// The backward's epilogue operands (see the header): bias and residual with relu only, and
// dresidual exactly when both relu and a residual are there.
inline ffi::Error set_bwd_epilogue(const NormCheck& c, const ffi::AnyBuffer& bias,
                                   const ffi::AnyBuffer& residual, ffi::AnyBuffer& dresidual,
                                   bool relu, norm::Problem* p, norm::BwdBuffers* b) {
  if (ffi::Error e = first_error(
          {relu ? c.affine(bias, "bias") : c.expect(bias, "bias", 0, c.stat_dtype()),
           c.like_x_or_empty(residual, "residual", relu),
           c.like_x_or_empty(dresidual, "dresidual", relu && residual.element_count() > 0)});
      e.failure())
    return e;
  if (relu && residual.element_count() != dresidual.element_count())
    return invalid(c.where + ": dresidual must be x-like exactly when there is a residual");
  set_epilogue(&residual, relu, p, &b->residual);
  b->bias = relu ? bias.untyped_data() : nullptr;
  b->dresidual = p->epi.residual ? dresidual.untyped_data() : nullptr;
  return ffi::Error::Success();
}

// Training backward: dmean/dvar are the cotangents of the statistics outputs (empty: zero, and
// the kernels get null pointers).
inline ffi::Error prepare_norm_bwd(const ffi::AnyBuffer& dy, const ffi::AnyBuffer& dmean,
                                   const ffi::AnyBuffer& dvar, const ffi::AnyBuffer& x,
                                   const ffi::AnyBuffer& scale, const ffi::AnyBuffer& mean,
                                   const ffi::AnyBuffer& var, const ffi::AnyBuffer& bias,
                                   const ffi::AnyBuffer& residual, ffi::AnyBuffer& dx,
                                   ffi::AnyBuffer& dscale, ffi::AnyBuffer& dbias,
                                   ffi::AnyBuffer& dresidual, ffi::AnyBuffer& ws, I64Span shape,
                                   float eps, bool centered, bool relu, norm::Problem* p,
                                   norm::BwdBuffers* b) {
  if (ffi::Error e = decode_norm("norm_bwd", x, shape, eps, centered, p); e.failure()) return e;
  const NormCheck c{*p, "jaxdnn norm_bwd"};
  if (ffi::Error e = first_error({c.like_x(dy, "dy"), c.stats_cotangent(dmean, "dmean"),
                                  c.stats_cotangent(dvar, "dvar"), c.stats(mean, "mean"),
                                  c.stats(var, "var"), c.like_x(dx, "dx"),
                                  c.affine(dscale, "dscale"), c.affine(dbias, "dbias"),
                                  c.workspace(ws, norm::bwd_workspace_bytes(p->s, p->dtype))});
      e.failure())
    return e;
  set_bwd_buffers(dy, x, scale, mean, var, dx, dscale, dbias, ws, b);
  b->training = true;
  b->dmean = dmean.element_count() ? dmean.untyped_data() : nullptr;
  b->dvar = dvar.element_count() ? dvar.untyped_data() : nullptr;
  return set_bwd_epilogue(c, bias, residual, dresidual, relu, p, b);
}

inline ffi::Error prepare_norm_infer_bwd(const ffi::AnyBuffer& dy, const ffi::AnyBuffer& x,
                                         const ffi::AnyBuffer& scale, const ffi::AnyBuffer& mean,
                                         const ffi::AnyBuffer& var, const ffi::AnyBuffer& bias,
                                         const ffi::AnyBuffer& residual, ffi::AnyBuffer& dx,
                                         ffi::AnyBuffer& dscale, ffi::AnyBuffer& dbias,
                                         ffi::AnyBuffer& dmean, ffi::AnyBuffer& dvar,
                                         ffi::AnyBuffer& dresidual, ffi::AnyBuffer& ws,
                                         I64Span shape, float eps, bool relu, norm::Problem* p,
                                         norm::BwdBuffers* b) {
  if (ffi::Error e = decode_norm("norm_infer_bwd", x, shape, eps, true, p); e.failure())
    return e;
  const NormCheck c{*p, "jaxdnn norm_infer_bwd"};
  if (ffi::Error e = first_error({c.like_x(dy, "dy"), c.stats(mean, "mean"), c.stats(var, "var"),
                                  c.like_x(dx, "dx"), c.affine(dscale, "dscale"),
                                  c.affine(dbias, "dbias"), c.stats(dmean, "dmean"),
                                  c.stats(dvar, "dvar"),
                                  c.workspace(ws, norm::bwd_workspace_bytes(p->s, p->dtype))});
      e.failure())
    return e;
  set_bwd_buffers(dy, x, scale, mean, var, dx, dscale, dbias, ws, b);
  b->training = false;
  b->dmean_out = dmean.untyped_data();
  b->dvar_out = dvar.untyped_data();
  return set_bwd_epilogue(c, bias, residual, dresidual, relu, p, b);
}

// Operand lists of the targets (identical on both platforms): kArgs buffers in, kRets out, then
// the shape and eps attributes, for the training targets (kCentered) centered, for every target
// with an epilogue (kRelu) relu, and algo. (A binding is not movable: each step returns a new
// one.)
template <int kArgs, int kRets, bool kCentered, bool kRelu, typename B>
auto bind_norm(B&& b) {
  if constexpr (kArgs > 0) {
    return bind_norm<kArgs - 1, kRets, kCentered, kRelu>(
        std::forward<B>(b).template Arg<ffi::AnyBuffer>());
  } else if constexpr (kRets > 0) {
    return bind_norm<0, kRets - 1, kCentered, kRelu>(
        std::forward<B>(b).template Ret<ffi::AnyBuffer>());
  } else if constexpr (kCentered && kRelu) {
    return std::forward<B>(b).template Attr<I64Span>("shape").template Attr<float>("eps")
        .template Attr<bool>("centered").template Attr<bool>("relu")
        .template Attr<std::string_view>("algo");
  } else if constexpr (kCentered) {
    return std::forward<B>(b).template Attr<I64Span>("shape").template Attr<float>("eps")
        .template Attr<bool>("centered").template Attr<std::string_view>("algo");
  } else {
    static_assert(kRelu, "every target without `centered` has an epilogue");
    return std::forward<B>(b).template Attr<I64Span>("shape").template Attr<float>("eps")
        .template Attr<bool>("relu").template Attr<std::string_view>("algo");
  }
}
template <typename B> auto bind_norm_fwd(B b) { return bind_norm<4, 4, true, true>(std::move(b)); }
template <typename B> auto bind_norm_fwd_stats(B b) {
  return bind_norm<3, 3, true, false>(std::move(b));
}
template <typename B> auto bind_norm_fwd_apply(B b) {
  return bind_norm<7, 1, true, true>(std::move(b));
}
template <typename B> auto bind_norm_infer(B b) {
  return bind_norm<6, 1, false, true>(std::move(b));
}
template <typename B> auto bind_norm_bwd(B b) { return bind_norm<9, 5, true, true>(std::move(b)); }
template <typename B> auto bind_norm_infer_bwd(B b) {
  return bind_norm<7, 7, false, true>(std::move(b));
}

// The algorithm named `name` of the platform's registry for `pass`, which must support p and,
// for a training forward, run as one call (half kAll) or two (a half).
template <typename Platform>
ffi::Error find_norm_algorithm(const char* target, norm::Pass pass, norm::Half half,
                               const norm::Problem& p, std::string_view name,
                               const norm::Algorithm** out) {
  const std::string where = std::string("jaxdnn ") + target + ": algorithm '" +
                            std::string(name) + "'";
  const norm::Algorithm* a = norm::find_algorithm(Platform::algorithms(pass, p), pass, name);
  if (a == nullptr) return invalid(where + " is not registered");
  if (Support s = a->supports(p); !s.ok) return invalid(where + ": " + s.reason);
  if (a->two_calls != (half != norm::Half::kAll))
    return invalid(where + (a->two_calls ? " runs as two calls" : " runs as one call"));
  *out = a;
  return ffi::Error::Success();
}

// The handlers' bodies. Platform provides Ctx (the context argument), bind() and kTraits,
// algorithms(pass, p), poison(ctx, results), forward(algo, p, b, half, ctx),
// inference(algo, p, b, ctx) and backward(algo, p, b, ctx).
template <typename Platform>
struct NormHandlers {
  using Ctx = typename Platform::Ctx;
  using Ret = ffi::Result<ffi::AnyBuffer>;

  static ffi::Error Fwd(Ctx ctx, ffi::AnyBuffer x, ffi::AnyBuffer scale, ffi::AnyBuffer bias,
                        ffi::AnyBuffer residual, Ret y, Ret mean, Ret var, Ret ws, I64Span shape,
                        float eps, bool centered, bool relu, std::string_view algo) {
    return train(ctx, "norm_fwd", norm::Half::kAll, x, scale, bias, &residual, &*y, *mean, *var,
                 *ws, shape, eps, centered, relu, algo, {&y, &mean, &var, &ws});
  }

  static ffi::Error FwdStats(Ctx ctx, ffi::AnyBuffer x, ffi::AnyBuffer scale, ffi::AnyBuffer bias,
                             Ret mean, Ret var, Ret ws, I64Span shape, float eps, bool centered,
                             std::string_view algo) {
    return train(ctx, "norm_fwd_stats", norm::Half::kStats, x, scale, bias, nullptr, nullptr,
                 *mean, *var, *ws, shape, eps, centered, false, algo, {&mean, &var, &ws});
  }

  static ffi::Error FwdApply(Ctx ctx, ffi::AnyBuffer x, ffi::AnyBuffer scale, ffi::AnyBuffer bias,
                             ffi::AnyBuffer mean, ffi::AnyBuffer var, ffi::AnyBuffer ws,
                             ffi::AnyBuffer residual, Ret y, I64Span shape, float eps,
                             bool centered, bool relu, std::string_view algo) {
    return apply(ctx, "norm_fwd_apply", norm::Pass::kTrain, norm::Half::kApply, x, scale, bias,
                 mean, var, &ws, residual, y, shape, eps, centered, relu, algo);
  }

  static ffi::Error Infer(Ctx ctx, ffi::AnyBuffer x, ffi::AnyBuffer scale, ffi::AnyBuffer bias,
                          ffi::AnyBuffer mean, ffi::AnyBuffer var, ffi::AnyBuffer residual, Ret y,
                          I64Span shape, float eps, bool relu, std::string_view algo) {
    return apply(ctx, "norm_infer", norm::Pass::kInfer, norm::Half::kAll, x, scale, bias, mean,
                 var, nullptr, residual, y, shape, eps, true, relu, algo);
  }

  static ffi::Error Bwd(Ctx ctx, ffi::AnyBuffer dy, ffi::AnyBuffer dmean, ffi::AnyBuffer dvar,
                        ffi::AnyBuffer x, ffi::AnyBuffer scale, ffi::AnyBuffer mean,
                        ffi::AnyBuffer var, ffi::AnyBuffer bias, ffi::AnyBuffer residual, Ret dx,
                        Ret dscale, Ret dbias, Ret dresidual, Ret ws, I64Span shape, float eps,
                        bool centered, bool relu, std::string_view algo) {
    norm::Problem p;
    norm::BwdBuffers b;
    if (ffi::Error e = prepare_norm_bwd(dy, dmean, dvar, x, scale, mean, var, bias, residual, *dx,
                                        *dscale, *dbias, *dresidual, *ws, shape, eps, centered,
                                        relu, &p, &b);
        e.failure())
      return e;
    return backward(ctx, "norm_bwd", p, b, algo, {&dx, &dscale, &dbias, &dresidual, &ws});
  }

  static ffi::Error InferBwd(Ctx ctx, ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                             ffi::AnyBuffer mean, ffi::AnyBuffer var, ffi::AnyBuffer bias,
                             ffi::AnyBuffer residual, Ret dx, Ret dscale, Ret dbias, Ret dmean,
                             Ret dvar, Ret dresidual, Ret ws, I64Span shape, float eps, bool relu,
                             std::string_view algo) {
    norm::Problem p;
    norm::BwdBuffers b;
    if (ffi::Error e = prepare_norm_infer_bwd(dy, x, scale, mean, var, bias, residual, *dx,
                                              *dscale, *dbias, *dmean, *dvar, *dresidual, *ws,
                                              shape, eps, relu, &p, &b);
        e.failure())
      return e;
    return backward(ctx, "norm_infer_bwd", p, b, algo,
                    {&dx, &dscale, &dbias, &dmean, &dvar, &dresidual, &ws});
  }

 private:
  static ffi::Error train(Ctx ctx, const char* target, norm::Half half, ffi::AnyBuffer& x,
                          ffi::AnyBuffer& scale, ffi::AnyBuffer& bias,
                          const ffi::AnyBuffer* residual, ffi::AnyBuffer* y, ffi::AnyBuffer& mean,
                          ffi::AnyBuffer& var, ffi::AnyBuffer& ws, I64Span shape, float eps,
                          bool centered, bool relu, std::string_view algo,
                          std::initializer_list<Ret*> results) {
    norm::Problem p;
    norm::FwdBuffers b;
    const norm::Algorithm* a = nullptr;
    if (ffi::Error e = prepare_norm_fwd(target, x, scale, bias, residual, y, mean, var, ws, shape,
                                        eps, centered, relu, &p, &b);
        e.failure())
      return e;
    if (ffi::Error e = find_norm_algorithm<Platform>(target, norm::Pass::kTrain, half, p, algo, &a);
        e.failure())
      return e;
    if (ffi::Error e = Platform::poison(ctx, results); e.failure()) return e;
    return to_error(Platform::forward(*a, p, b, half, ctx));
  }

  static ffi::Error apply(Ctx ctx, const char* target, norm::Pass pass, norm::Half half,
                          ffi::AnyBuffer& x, ffi::AnyBuffer& scale, ffi::AnyBuffer& bias,
                          ffi::AnyBuffer& mean, ffi::AnyBuffer& var, const ffi::AnyBuffer* ws,
                          const ffi::AnyBuffer& residual, Ret& y, I64Span shape, float eps,
                          bool centered, bool relu, std::string_view algo) {
    norm::Problem p;
    norm::FwdBuffers b;
    const norm::Algorithm* a = nullptr;
    if (ffi::Error e = prepare_norm_apply(target, x, scale, bias, mean, var, ws, residual, *y,
                                          shape, eps, centered, relu, &p, &b);
        e.failure())
      return e;
    if (ffi::Error e = find_norm_algorithm<Platform>(target, pass, half, p, algo, &a); e.failure())
      return e;
    if (ffi::Error e = Platform::poison(ctx, {&y}); e.failure()) return e;
    return to_error(pass == norm::Pass::kTrain ? Platform::forward(*a, p, b, half, ctx)
                                               : Platform::inference(*a, p, b, ctx));
  }

  static ffi::Error backward(Ctx ctx, const char* target, const norm::Problem& p,
                             const norm::BwdBuffers& b, std::string_view algo,
                             std::initializer_list<Ret*> results) {
    const norm::Algorithm* a = nullptr;
    if (ffi::Error e = find_norm_algorithm<Platform>(target, norm::Pass::kBwd, norm::Half::kAll, p,
                                                     algo, &a);
        e.failure())
      return e;
    if (ffi::Error e = Platform::poison(ctx, results); e.failure()) return e;
    return to_error(Platform::backward(*a, p, b, ctx));
  }
 public:
  // The XLA handlers of the targets, bound on Platform's context with its traits (bind(),
  // kTraits: cpu_common.h's CpuPlatform, cuda_common.h's CudaPlatform).
#define JAXDNN_NORM_TARGET(fn, impl, binder)                                      \
  static XLA_FFI_Handler* fn() {                                                  \
    XLA_FFI_DEFINE_HANDLER(h, impl, binder(Platform::bind()), Platform::kTraits); \
    return h;                                                                     \
  }
  JAXDNN_NORM_TARGET(fwd, Fwd, bind_norm_fwd)
  JAXDNN_NORM_TARGET(fwd_stats, FwdStats, bind_norm_fwd_stats)
  JAXDNN_NORM_TARGET(fwd_apply, FwdApply, bind_norm_fwd_apply)
  JAXDNN_NORM_TARGET(infer, Infer, bind_norm_infer)
  JAXDNN_NORM_TARGET(bwd, Bwd, bind_norm_bwd)
  JAXDNN_NORM_TARGET(infer_bwd, InferBwd, bind_norm_infer_bwd)
#undef JAXDNN_NORM_TARGET
};

}  // namespace jaxdnn::ffi_util
