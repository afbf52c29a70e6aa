// CPU column path (A > 1, T == 1; batch and group norm, channels-last): per p, x is an
// (A, C*K) matrix whose column j belongs to group c = j / K.
//
// Work is cut into tiles of (one row slice of rows_per_slice(s) rows) x (up to kColumns
// columns). Every loop runs along a row, one lane per column, so it vectorises with no
// reassociation:
//   stats  Welford's update per column over the slice, straight into the workspace partials
//          (mean, M2); cpu_norm.cc merges them per group.   Traffic: read x.
//   apply  y = (x - mean)*(rstd*scale) + bias with per-column coefficients.
//                                                           Traffic: read x, write y.
//   grads  per-column sums of dy*xhat and dy over the slice. Traffic: read x, dy.
//   dx     dx = scale*rstd*dy + (x - mean)*c1 + c2.          Traffic: read x, dy, write dx.

#include <vector>

#include "cc/norm/cpu_kernels.h"

namespace jaxdnn::norm::cpu {
namespace column {

constexpr int64_t kColumns = 2048;  // columns per tile

struct Tile {
  int64_t p, s, a0, a1, j0, j1;  // batch p, slice s: rows [a0, a1), columns [j0, j1)
};

struct Tiling {
  int64_t S, rps, chunks;
  explicit Tiling(const Shape& sh)
      : S(num_slices(sh)), rps(rows_per_slice(sh)), chunks((sh.CK() + kColumns - 1) / kColumns) {}
  int64_t count(const Shape& sh) const { return sh.P * S * chunks; }
  Tile tile(const Shape& sh, int64_t t) const {
    const int64_t ch = t % chunks, s = t / chunks % S, p = t / (chunks * S);
    return {p, s, s * rps, std::min(sh.A, (s + 1) * rps), ch * kColumns,
            std::min(sh.CK(), (ch + 1) * kColumns)};
  }
};

}  // namespace column

using column::kColumns;
using column::Tile;
using column::Tiling;

// Welford's update per column on x - shift, shift = the column's first value in the slice (so
// a large common offset costs no precision), one lane per column; the partial mean, shift
// added back, and M2 go to the workspace in double. buf holds 3*w accumulators.
template <typename T>
JAXDNN_ALWAYS_INLINE void column_stats_tile(const FwdView<T>& v, const Tile& t, int64_t nslices,
                                            S<T>* buf) {
  const Shape& s = v.s;
  const int64_t CK = s.CK(), w = t.j1 - t.j0, off = (t.p * nslices + t.s) * CK + t.j0;
  S<T>* shift = buf;
  S<T>* mean = buf + w;
  S<T>* m2 = buf + 2 * w;
  const T* x0 = v.x + (t.p * s.A + t.a0) * CK + t.j0;
  for (int64_t j = 0; j < w; ++j) {
    shift[j] = v.centered ? load_acc(x0[j]) : S<T>(0);
    mean[j] = m2[j] = 0;
  }
  for (int64_t a = t.a0; a < t.a1; ++a) {
    const T* x = v.x + (t.p * s.A + a) * CK + t.j0;
    if (v.centered) {
      const S<T> inv = S<T>(1) / S<T>(a - t.a0 + 1);
      for_lanes<T>(w, [&](int64_t j, auto tag) {
        const auto xv = at(x, j, tag) - at(shift, j, tag), d = xv - at(mean, j, tag);
        const auto mu = at(mean, j, tag) + d * inv;
        put(mean, j, mu, tag);
        put(m2, j, at(m2, j, tag) + d * (xv - mu), tag);
      });
    } else {
      for_lanes<T>(w, [&](int64_t j, auto tag) {
        const auto xv = at(x, j, tag);
        put(m2, j, at(m2, j, tag) + xv * xv, tag);
      });
    }
  }
  for (int64_t j = 0; j < w; ++j) {
    v.ws0[off + j] = double(shift[j]) + double(mean[j]);
    v.ws1[off + j] = double(m2[j]);
  }
}

// Per-column (mean, rstd) of tile columns [j0, j1) for batch p.
template <typename T, typename View>
JAXDNN_ALWAYS_INLINE void column_stats_of(const View& v, const Tile& t, S<T>* mu, S<T>* rs) {
  for (int64_t j = t.j0; j < t.j1; ++j) {
    const int64_t g = t.p * v.s.C + j / v.s.K;
    mu[j - t.j0] = v.mean[g];
    rs[j - t.j0] = rstd_of<T>(v.var[g], v.eps);
  }
}

template <typename T>
JAXDNN_ALWAYS_INLINE void column_apply_tile(const FwdView<T>& v, const Tile& t, S<T>* buf) {
  const Shape& s = v.s;
  const int64_t CK = s.CK(), w = t.j1 - t.j0, affine = t.p / s.Pq() * CK + t.j0;
  S<T>* mu = buf;
  S<T>* gg = buf + w;
  column_stats_of<T>(v, t, mu, gg);
  for (int64_t j = 0; j < w; ++j) gg[j] *= v.scale[affine + j];
  const S<T>* bb = v.bias + affine;
  for (int64_t a = t.a0; a < t.a1; ++a) {
    const int64_t row = (t.p * s.A + a) * CK + t.j0;
    const T* x = v.x + row;
    T* y = v.y + row;
    for_lanes<T>(w, [&](int64_t j, auto tag) {
      put(y, j, (at(x, j, tag) - at(mu, j, tag)) * at(gg, j, tag) + at(bb, j, tag), tag);
    });
  }
}

template <typename T>
JAXDNN_ALWAYS_INLINE void column_grads_tile(const BwdView<T>& v, const Tile& t, int64_t nslices,
                                            S<T>* buf) {
  const Shape& s = v.s;
  const int64_t CK = s.CK(), w = t.j1 - t.j0, off = (t.p * nslices + t.s) * CK + t.j0;
  S<T>* mu = buf;
  S<T>* rs = buf + w;
  column_stats_of<T>(v, t, mu, rs);
  S<T>* sdyx = v.ws0 + off;
  S<T>* sdy = v.ws1 + off;
  for (int64_t j = 0; j < w; ++j) sdyx[j] = sdy[j] = 0;
  for (int64_t a = t.a0; a < t.a1; ++a) {
    const int64_t row = (t.p * s.A + a) * CK + t.j0;
    const T* x = v.x + row;
    const T* dy = v.dy + row;
    for_lanes<T>(w, [&](int64_t j, auto tag) {
      const auto d = at(dy, j, tag);
      put(sdyx, j, at(sdyx, j, tag) + d * (at(x, j, tag) - at(mu, j, tag)), tag);
      put(sdy, j, at(sdy, j, tag) + d, tag);
    });
  }
  for (int64_t j = 0; j < w; ++j) sdyx[j] *= rs[j];
}

template <typename T>
JAXDNN_ALWAYS_INLINE void column_dx_tile(const BwdView<T>& v, const Tile& t, S<T>* buf) {
  const Shape& s = v.s;
  const int64_t CK = s.CK(), w = t.j1 - t.j0, affine = t.p / s.Pq() * CK + t.j0;
  S<T>* mu = buf;
  S<T>* gr = buf + w;
  S<T>* c1 = buf + 2 * w;
  S<T>* c2 = buf + 3 * w;
  column_stats_of<T>(v, t, mu, gr);
  for (int64_t j = 0; j < w; ++j) {
    const int64_t g = t.p * s.C + (t.j0 + j) / s.K;
    gr[j] *= v.scale[affine + j];
    c1[j] = v.coef[2 * g];
    c2[j] = v.coef[2 * g + 1];
  }
  for (int64_t a = t.a0; a < t.a1; ++a) {
    const int64_t row = (t.p * s.A + a) * CK + t.j0;
    const T* x = v.x + row;
    const T* dy = v.dy + row;
    T* dx = v.dx + row;
    for_lanes<T>(w, [&](int64_t j, auto tag) {
      put(dx, j,
          at(gr, j, tag) * at(dy, j, tag) + (at(x, j, tag) - at(mu, j, tag)) * at(c1, j, tag) +
              at(c2, j, tag),
          tag);
    });
  }
}

#define JAXDNN_COLUMN_TASKS(T)                                                                  \
  JAXDNN_CPU_CLONES void column_stats_task(const FwdView<T>& v, const Tile& t, int64_t nslices, \
                                           S<T>* buf) {                                         \
    column_stats_tile<T>(v, t, nslices, buf);                                                   \
  }                                                                                             \
  JAXDNN_CPU_CLONES void column_apply_task(const FwdView<T>& v, const Tile& t, S<T>* buf) {     \
    column_apply_tile<T>(v, t, buf);                                                            \
  }                                                                                             \
  JAXDNN_CPU_CLONES void column_grads_task(const BwdView<T>& v, const Tile& t, int64_t nslices,       \
                                           S<T>* buf) {                                         \
    column_grads_tile<T>(v, t, nslices, buf);                                                         \
  }                                                                                             \
  JAXDNN_CPU_CLONES void column_dx_task(const BwdView<T>& v, const Tile& t, S<T>* buf) {        \
    column_dx_tile<T>(v, t, buf);                                                               \
  }
JAXDNN_COLUMN_TASKS(float)
JAXDNN_COLUMN_TASKS(double)
JAXDNN_COLUMN_TASKS(f16_t)
JAXDNN_COLUMN_TASKS(bf16_t)
#undef JAXDNN_COLUMN_TASKS

template <typename T>
void column_stats(const FwdView<T>& v, const Parallel& par) {
  const Tiling tl(v.s);
  par.for_each(tl.count(v.s), [&](int64_t i) {
    std::vector<S<T>> buf(3 * kColumns);
    column_stats_task(v, tl.tile(v.s, i), tl.S, buf.data());
  });
}

template <typename T>
void column_apply(const FwdView<T>& v, const Parallel& par) {
  const Tiling tl(v.s);
  par.for_each(tl.count(v.s), [&](int64_t i) {
    std::vector<S<T>> buf(2 * kColumns);
    column_apply_task(v, tl.tile(v.s, i), buf.data());
  });
}

template <typename T>
void column_grads(const BwdView<T>& v, const Parallel& par) {
  const Tiling tl(v.s);
  par.for_each(tl.count(v.s), [&](int64_t i) {
    std::vector<S<T>> buf(2 * kColumns);
    column_grads_task(v, tl.tile(v.s, i), tl.S, buf.data());
  });
}

template <typename T>
void column_dx(const BwdView<T>& v, const Parallel& par) {
  const Tiling tl(v.s);
  par.for_each(tl.count(v.s), [&](int64_t i) {
    std::vector<S<T>> buf(4 * kColumns);
    column_dx_task(v, tl.tile(v.s, i), buf.data());
  });
}

JAXDNN_NORM_CPU_INSTANTIATE(column_stats, FwdView);
JAXDNN_NORM_CPU_INSTANTIATE(column_apply, FwdView);
JAXDNN_NORM_CPU_INSTANTIATE(column_grads, BwdView);
JAXDNN_NORM_CPU_INSTANTIATE(column_dx, BwdView);

}  // namespace jaxdnn::norm::cpu
