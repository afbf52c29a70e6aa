// The CPU norm registry and entry points: run the path's passes (norm.h), and merge the
// partials.
//
// Merges run in a fixed order (slices, then k), so the result depends only on the shape:
//   stats   per group (p, c): Chan's update over the (slice, k) partials -> mean, var
//   grads   per group: sg = sum scale*sum(dy), sgx = sum scale*sum(dy*xhat) -> dx coefficients
//   params  per affine entry (q, j): d(scale), d(bias) = sums of the partials of its rows

#include <cstring>
#include <limits>
#include <vector>

#include "cc/norm/cpu_kernels.h"
#include "cc/norm/cpu_norm.h"

namespace jaxdnn::norm {
namespace cpu {
namespace {

// Groups per merge task.
constexpr int64_t kMergeGroups = 64;

template <typename T>
void merge_stats(const FwdView<T>& v, const Parallel& par) {
  const Shape& s = v.s;
  par.for_each((s.groups() + kMergeGroups - 1) / kMergeGroups, [&](int64_t task) {
    const int64_t g1 = std::min(s.groups(), (task + 1) * kMergeGroups);
    for (int64_t g = task * kMergeGroups; g < g1; ++g) merge_group_stats(v, g);
  });
}

template <typename T>
void merge_grads(const BwdView<T>& v, const Parallel& par) {
  const Shape& s = v.s;
  const int64_t nsl = num_slices(s), CK = s.CK();
  const double n = double(s.group_size());
  par.for_each((s.groups() + kMergeGroups - 1) / kMergeGroups, [&](int64_t task) {
    const int64_t g1 = std::min(s.groups(), (task + 1) * kMergeGroups);
    for (int64_t g = task * kMergeGroups; g < g1; ++g) {
      const int64_t p = g / s.C, c = g % s.C;
      const S<T>* scale = v.scale + (p / s.Pq() * s.C + c) * s.K;
      double sg = 0, sgx = 0;
      for (int64_t sl = 0; sl < nsl; ++sl)
        for (int64_t k = 0; k < s.K; ++k) {
          const int64_t off = (p * nsl + sl) * CK + c * s.K + k;
          sg += double(scale[k]) * double(v.ws1[off]);
          sgx += double(scale[k]) * double(v.ws0[off]);
        }
      group_coefficients(v, g, n, sg, sgx, v.coef + 2 * g, v.coef + 2 * g + 1);
    }
  });
}

// dscale[q, j] = sum_r ws0[(q*R + r)*CK + j], dbias likewise from ws1, in r order.
template <typename T>
void reduce_params(const BwdView<T>& v, int64_t R, const Parallel& par) {
  constexpr int64_t kCols = 256;
  const int64_t CK = v.s.CK(), chunks = (CK + kCols - 1) / kCols;
  par.for_each(v.s.Q * chunks, [&](int64_t task) {
    const int64_t q = task / chunks, j0 = task % chunks * kCols, w = std::min(kCols, CK - j0);
    double a0[kCols] = {}, a1[kCols] = {};
    for (int64_t r = 0; r < R; ++r) {
      const int64_t off = (q * R + r) * CK + j0;
      for (int64_t j = 0; j < w; ++j) {
        a0[j] += double(v.ws0[off + j]);
        a1[j] += double(v.ws1[off + j]);
      }
    }
    for (int64_t j = 0; j < w; ++j) {
      v.dscale[q * CK + j0 + j] = S<T>(a0[j]);
      v.dbias[q * CK + j0 + j] = S<T>(a1[j]);
    }
  });
}

template <typename T>
FwdView<T> fwd_view(const Problem& p, const FwdBuffers& b) {
  auto* ws = static_cast<double*>(b.ws);
  const int64_t plane = fwd_partials(p.s);
  return {p.s, p.centered, S<T>(p.eps), static_cast<const T*>(b.x),
          static_cast<const S<T>*>(b.scale), static_cast<const S<T>*>(b.bias),
          static_cast<T*>(b.y), static_cast<S<T>*>(b.mean), static_cast<S<T>*>(b.var),
          ws, ws ? ws + plane : nullptr, static_cast<const T*>(b.residual), p.epi.relu};
}

template <typename T>
BwdView<T> bwd_view(const Problem& p, const BwdBuffers& b) {
  auto* ws = static_cast<S<T>*>(b.ws);
  const bool row = path_of(p.s) == Path::kRow;
  const int64_t plane = bwd_partials(p.s);
  return {p.s, p.centered, b.training, S<T>(p.eps),
          static_cast<const T*>(b.dy), static_cast<const S<T>*>(b.dmean),
          static_cast<const S<T>*>(b.dvar), static_cast<const T*>(b.x),
          static_cast<const S<T>*>(b.scale), static_cast<const S<T>*>(b.mean),
          static_cast<const S<T>*>(b.var), static_cast<T*>(b.dx),
          static_cast<S<T>*>(b.dscale), static_cast<S<T>*>(b.dbias),
          static_cast<S<T>*>(b.dmean_out), static_cast<S<T>*>(b.dvar_out),
          ws, ws ? ws + plane : nullptr, (row || !ws) ? nullptr : ws + 2 * plane,
          p.epi.relu, static_cast<const S<T>*>(b.bias), static_cast<const T*>(b.residual),
          static_cast<T*>(b.dresidual)};
}

template <typename T>
void fill(S<T>* p, int64_t n, S<T> v) {
  for (int64_t i = 0; i < n; ++i) p[i] = v;
}

template <typename T>
void forward(const Problem& p, const FwdBuffers& b, bool training, const Parallel& par) {
  const FwdView<T> v = fwd_view<T>(p, b);
  if (p.s.elems() == 0) {  // nothing to normalise; empty groups have NaN statistics
    if (training) {
      fill<T>(v.mean, p.s.groups(), std::numeric_limits<S<T>>::quiet_NaN());
      fill<T>(v.var, p.s.groups(), std::numeric_limits<S<T>>::quiet_NaN());
    }
    return;
  }
  switch (path_of(p.s)) {
    case Path::kRow:
      row_forward(v, training, par);
      return;
    case Path::kColumn:
      if (training) {
        column_stats(v, par);
        merge_stats(v, par);
      }
      column_apply(v, par);
      return;
    case Path::kSegment:
      if (training) {
        segment_stats(v, par);
        merge_stats(v, par);
      }
      segment_apply(v, par);
      return;
  }
}

template <typename T>
void backward(const Problem& p, const BwdBuffers& b, const Parallel& par) {
  const BwdView<T> v = bwd_view<T>(p, b);
  const Shape& s = p.s;
  if (s.elems() == 0) {  // all sums are empty
    fill<T>(v.dscale, s.Q * s.CK(), 0);
    fill<T>(v.dbias, s.Q * s.CK(), 0);
    if (!v.training) {
      fill<T>(v.dmean_out, s.groups(), 0);
      fill<T>(v.dvar_out, s.groups(), 0);
    }
    return;
  }
  switch (path_of(s)) {
    case Path::kRow:
      row_backward(v, par);
      reduce_params(v, row_bwd_slices(s), par);
      return;
    case Path::kColumn:
      column_grads(v, par);
      merge_grads(v, par);
      reduce_params(v, s.Pq() * num_slices(s), par);
      column_dx(v, par);
      return;
    case Path::kSegment:
      segment_grads(v, par);
      merge_grads(v, par);
      reduce_params(v, s.Pq() * num_slices(s), par);
      segment_dx(v, par);
      return;
  }
}

template <typename Fn>
Status with_dtype(const Problem& p, const char* what, Fn&& fn) {
  Status st = validate(p.s);
  if (!st.ok()) return Status::Error(std::string("norm ") + what + ": " + st.message);
  if (!dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) { fn(tag); }))
    return Status::Error(std::string("norm ") + what + ": unsupported dtype " +
                         dtype_name(p.dtype));
  return Status::Ok();
}

}  // namespace
}  // namespace cpu

std::vector<const Algorithm*> cpu_algorithms(Pass pass, const Problem&) {
  static const auto row = [](const Problem& p) { return on_path(p, Path::kRow); };
  static const auto column = [](const Problem& p) { return on_path(p, Path::kColumn); };
  static const auto segment = [](const Problem& p) { return on_path(p, Path::kSegment); };
  static const Algorithm kAll[3][3] = {
      {{"row", Pass::kTrain, row}, {"column", Pass::kTrain, column},
       {"segment", Pass::kTrain, segment}},
      {{"row", Pass::kInfer, row}, {"column", Pass::kInfer, column},
       {"segment", Pass::kInfer, segment}},
      {{"row", Pass::kBwd, row}, {"column", Pass::kBwd, column},
       {"segment", Pass::kBwd, segment}}};
  const Algorithm* of_pass = kAll[int(pass)];
  return {&of_pass[0], &of_pass[1], &of_pass[2]};
}

Status cpu_forward(const Problem& p, const FwdBuffers& b, const Parallel& par) {
  return cpu::with_dtype(p, "forward", [&](auto tag) {
    cpu::forward<decltype(tag)>(p, b, /*training=*/true, par);
  });
}

Status cpu_inference(const Problem& p, const FwdBuffers& b, const Parallel& par) {
  return cpu::with_dtype(p, "inference", [&](auto tag) {
    cpu::forward<decltype(tag)>(p, b, /*training=*/false, par);
  });
}

Status cpu_backward(const Problem& p, const BwdBuffers& b, const Parallel& par) {
  return cpu::with_dtype(p, "backward", [&](auto tag) { cpu::backward<decltype(tag)>(p, b, par); });
}

}  // namespace jaxdnn::norm
