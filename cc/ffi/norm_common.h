// Norm pieces shared by the CPU and CUDA handlers: the bindings (same operands and attributes
// on both platforms) and buffers -> norm::Problem with every shape checked.
//
// Targets (all operands in the canonical shapes of cc/norm/norm.h; the shape is read from x
// (P, A, C, K, T) and scale (Q, C, K); statistics and affine arrays are float32, or float64
// for float64 x):
//   jaxdnn_norm_fwd        x, scale, bias                     -> y, mean, var, workspace
//   jaxdnn_norm_infer      x, scale, bias, mean, var          -> y
//   jaxdnn_norm_bwd        dy, dmean, dvar, x, scale, mean, var -> dx, dscale, dbias, workspace
//   jaxdnn_norm_infer_bwd  dy, x, scale, mean, var            -> dx, dscale, dbias, dmean, dvar,
//                                                                workspace
// Attributes: eps (float32); centered (bool, training targets only: false is RMS norm).
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "cc/ffi/common.h"
#include "cc/norm/norm.h"

namespace jaxdnn::ffi_util {

struct NormCheck {
  const norm::Problem& p;
  std::string where;

  DType stat_dtype() const { return p.dtype == DType::kF64 ? DType::kF64 : DType::kF32; }

  // An error for `name` unless it has `dims` and dtype `dt`.
  ffi::Error expect(const ffi::AnyBuffer& b, const char* name, std::initializer_list<int64_t> dims,
                    DType dt) const {
    auto d = b.dimensions();
    bool ok = d.size() == dims.size() && to_dtype(b.element_type()) == dt;
    size_t i = 0;
    for (int64_t want : dims) ok = ok && d[i++] == want;
    if (!ok) return invalid(where + ": operand " + name + " does not match the problem");
    return ffi::Error::Success();
  }
  ffi::Error like_x(const ffi::AnyBuffer& b, const char* name) const {
    return expect(b, name, {p.s.P, p.s.A, p.s.C, p.s.K, p.s.T}, p.dtype);
  }
  ffi::Error stats(const ffi::AnyBuffer& b, const char* name) const {
    return expect(b, name, {p.s.P, p.s.C}, stat_dtype());
  }
  ffi::Error affine(const ffi::AnyBuffer& b, const char* name) const {
    return expect(b, name, {p.s.Q, p.s.C, p.s.K}, stat_dtype());
  }
  ffi::Error workspace(const ffi::AnyBuffer& b, int64_t elems) const {
    if (to_dtype(b.element_type()) != stat_dtype() || int64_t(b.element_count()) < elems)
      return invalid(where + ": workspace needs " + std::to_string(elems) + " elements");
    return ffi::Error::Success();
  }
};

// The problem of a call, from x (P, A, C, K, T) and scale (Q, C, K).
inline ffi::Error decode_norm(const char* target, const ffi::AnyBuffer& x,
                              const ffi::AnyBuffer& scale, float eps, bool centered,
                              norm::Problem* p) {
  const std::string where = std::string("jaxdnn ") + target;
  auto xd = x.dimensions(), sd = scale.dimensions();
  if (xd.size() != 5 || sd.size() != 3)
    return invalid(where + ": x must be rank 5 and scale rank 3 (canonical shapes)");
  auto dt = to_dtype(x.element_type());
  if (!dt) return invalid(where + ": unsupported dtype of x");
  p->s = {xd[0], xd[1], xd[2], xd[3], xd[4], sd[0]};
  p->dtype = *dt;
  p->centered = centered;
  p->eps = double(eps);
  if (sd[1] != p->s.C || sd[2] != p->s.K) return invalid(where + ": scale does not match x");
  Status st = norm::validate(p->s);
  if (!st.ok()) return invalid(where + ": " + st.message);
  return ffi::Error::Success();
}

// Returns the first failed check, or success.
inline ffi::Error first_error(std::initializer_list<ffi::Error> errors) {
  for (const ffi::Error& e : errors)
    if (e.failure()) return e;
  return ffi::Error::Success();
}

// Decoders of the four targets: check every operand and fill the problem and buffers.
inline ffi::Error prepare_norm_fwd(const ffi::AnyBuffer& x, const ffi::AnyBuffer& scale,
                                   const ffi::AnyBuffer& bias, ffi::AnyBuffer& y,
                                   ffi::AnyBuffer& mean, ffi::AnyBuffer& var, ffi::AnyBuffer& ws,
                                   float eps, bool centered, norm::Problem* p,
                                   norm::FwdBuffers* b) {
  if (ffi::Error e = decode_norm("norm_fwd", x, scale, eps, centered, p); e.failure()) return e;
  const NormCheck c{*p, "jaxdnn norm_fwd"};
  if (ffi::Error e = first_error({c.affine(scale, "scale"), c.affine(bias, "bias"),
                                  c.like_x(y, "y"), c.stats(mean, "mean"), c.stats(var, "var"),
                                  c.workspace(ws, norm::fwd_workspace_elems(p->s))});
      e.failure())
    return e;
  *b = {x.untyped_data(), scale.untyped_data(), bias.untyped_data(), y.untyped_data(),
        mean.untyped_data(), var.untyped_data(), ws.untyped_data()};
  return ffi::Error::Success();
}

inline ffi::Error prepare_norm_infer(const ffi::AnyBuffer& x, const ffi::AnyBuffer& scale,
                                     const ffi::AnyBuffer& bias, const ffi::AnyBuffer& mean,
                                     const ffi::AnyBuffer& var, ffi::AnyBuffer& y, float eps,
                                     norm::Problem* p, norm::FwdBuffers* b) {
  if (ffi::Error e = decode_norm("norm_infer", x, scale, eps, true, p); e.failure()) return e;
  const NormCheck c{*p, "jaxdnn norm_infer"};
  if (ffi::Error e = first_error({c.affine(scale, "scale"), c.affine(bias, "bias"),
                                  c.stats(mean, "mean"), c.stats(var, "var"), c.like_x(y, "y")});
      e.failure())
    return e;
  *b = {x.untyped_data(), scale.untyped_data(), bias.untyped_data(), y.untyped_data(),
        const_cast<void*>(mean.untyped_data()), const_cast<void*>(var.untyped_data()), nullptr};
  return ffi::Error::Success();
}

// Training backward: dmean/dvar are the cotangents of the statistics outputs.
inline ffi::Error prepare_norm_bwd(const ffi::AnyBuffer& dy, const ffi::AnyBuffer& dmean,
                                   const ffi::AnyBuffer& dvar, const ffi::AnyBuffer& x,
                                   const ffi::AnyBuffer& scale, const ffi::AnyBuffer& mean,
                                   const ffi::AnyBuffer& var, ffi::AnyBuffer& dx,
                                   ffi::AnyBuffer& dscale, ffi::AnyBuffer& dbias,
                                   ffi::AnyBuffer& ws, float eps, bool centered,
                                   norm::Problem* p, norm::BwdBuffers* b) {
  if (ffi::Error e = decode_norm("norm_bwd", x, scale, eps, centered, p); e.failure()) return e;
  const NormCheck c{*p, "jaxdnn norm_bwd"};
  if (ffi::Error e = first_error({c.like_x(dy, "dy"), c.stats(dmean, "dmean"),
                                  c.stats(dvar, "dvar"), c.stats(mean, "mean"),
                                  c.stats(var, "var"), c.like_x(dx, "dx"),
                                  c.affine(dscale, "dscale"), c.affine(dbias, "dbias"),
                                  c.workspace(ws, norm::bwd_workspace_elems(p->s))});
      e.failure())
    return e;
  b->training = true;
  b->dy = dy.untyped_data();
  b->dmean = dmean.untyped_data();
  b->dvar = dvar.untyped_data();
  b->x = x.untyped_data();
  b->scale = scale.untyped_data();
  b->mean = mean.untyped_data();
  b->var = var.untyped_data();
  b->dx = dx.untyped_data();
  b->dscale = dscale.untyped_data();
  b->dbias = dbias.untyped_data();
  b->ws = ws.untyped_data();
  return ffi::Error::Success();
}

inline ffi::Error prepare_norm_infer_bwd(const ffi::AnyBuffer& dy, const ffi::AnyBuffer& x,
                                         const ffi::AnyBuffer& scale, const ffi::AnyBuffer& mean,
                                         const ffi::AnyBuffer& var, ffi::AnyBuffer& dx,
                                         ffi::AnyBuffer& dscale, ffi::AnyBuffer& dbias,
                                         ffi::AnyBuffer& dmean, ffi::AnyBuffer& dvar,
                                         ffi::AnyBuffer& ws, float eps, norm::Problem* p,
                                         norm::BwdBuffers* b) {
  if (ffi::Error e = decode_norm("norm_infer_bwd", x, scale, eps, true, p); e.failure()) return e;
  const NormCheck c{*p, "jaxdnn norm_infer_bwd"};
  if (ffi::Error e = first_error({c.like_x(dy, "dy"), c.stats(mean, "mean"), c.stats(var, "var"),
                                  c.like_x(dx, "dx"), c.affine(dscale, "dscale"),
                                  c.affine(dbias, "dbias"), c.stats(dmean, "dmean"),
                                  c.stats(dvar, "dvar"),
                                  c.workspace(ws, norm::bwd_workspace_elems(p->s))});
      e.failure())
    return e;
  b->training = false;
  b->dy = dy.untyped_data();
  b->x = x.untyped_data();
  b->scale = scale.untyped_data();
  b->mean = mean.untyped_data();
  b->var = var.untyped_data();
  b->dx = dx.untyped_data();
  b->dscale = dscale.untyped_data();
  b->dbias = dbias.untyped_data();
  b->dmean_out = dmean.untyped_data();
  b->dvar_out = dvar.untyped_data();
  b->ws = ws.untyped_data();
  return ffi::Error::Success();
}

// Operand lists of the four targets (identical on both platforms).
template <typename B>
auto bind_norm_fwd(B b) {
  return std::move(b).template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>()
      .template Attr<float>("eps").template Attr<bool>("centered");
}
template <typename B>
auto bind_norm_infer(B b) {
  return std::move(b).template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<float>("eps");
}
template <typename B>
auto bind_norm_bwd(B b) {
  return std::move(b).template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>()
      .template Attr<float>("eps").template Attr<bool>("centered");
}
template <typename B>
auto bind_norm_infer_bwd(B b) {
  return std::move(b).template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>()
      .template Attr<float>("eps");
}

}  // namespace jaxdnn::ffi_util
