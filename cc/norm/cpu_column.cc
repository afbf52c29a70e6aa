// CPU column path (A > 1, T == 1; batch and group norm, channels-last): per p, x is an
// (A, C*K) matrix whose column j belongs to group c = j / K.
//
// Work is cut into tiles of (one row slice of rows_per_slice(s) rows) x (up to kColumns
// columns). Loops run along rows, one lane per column, so they vectorise with no
// reassociation. When a tile spans whole rows (few channels), R consecutive rows are one
// contiguous "super row" of R*w values: per-column state is replicated R times (replica r
// takes rows r, r+R, ...), so the vector loops run ~1024 values long instead of w, and the
// replicas are folded in order at the end.
// Narrow tiles of whole vectors (w = NV vectors, NV <= kRegVecs: up to 64 float columns)
// take a register path in the stats and apply passes instead: the per-column state of a row
// (Welford's shift, mean, M2) stays in vector registers, three per vector of a block of up to
// kRegBlock vectors, and the block walks the rows one by one, one load per vector of x; the
// apply pass takes four rows per step, loading each vector's coefficients once per step. The
// replicated path keeps that state in L1 and spends three loads and two stores (stats) or
// three extra loads (apply) per vector of x, which made a cache-resident batch norm
// load/store-bound.
//   stats  Welford's update per column on x - shift (shift = the replica's first value);
//          (mean, M2) of the slice to the double workspace; cpu_norm.cc merges them per group.
//          Traffic: read x.
//   apply  y = (x - mean)*(rstd*scale) + bias with per-column coefficients.
//          Traffic: read x, write y.
//   grads  per-column sums of dy*xhat and dy over the slice. Traffic: read x, dy.
//   dx     dx = scale*rstd*dy + (x - mean)*c1 + c2.          Traffic: read x, dy, write dx.
// The fused epilogue (norm.h Epilogue) rides on the replicated path of each pass: apply adds
// the residual and applies the ReLU (traffic + read residual); grads and dx mask dy where the
// recomputed z <= 0 (+ read residual), and dx writes the masked dy as d(residual).

#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "cc/norm/cpu_kernels.h"

namespace jaxdnn::norm::cpu {
namespace column {

constexpr int64_t kColumns = 2048;     // columns per tile
constexpr int64_t kSuperWidth = 1024;  // values per super row when rows are replicated

struct Tile {
  int64_t p, s, a0, a1, j0, j1;  // batch p, slice s: rows [a0, a1), columns [j0, j1)
  int64_t w, R;                  // width j1 - j0; rows per super row

  // Super row g covers rows [a0 + g*R, a0 + g*R + rows(g)): rows(g)*w values from `row0`.
  int64_t supers() const { return (a1 - a0 + R - 1) / R; }
  int64_t rows(int64_t g) const { return std::min(R, a1 - a0 - g * R); }
};

struct Tiling {
  int64_t S, rps, chunks;
  explicit Tiling(const Shape& sh)
      : S(num_slices(sh)), rps(rows_per_slice(sh)), chunks((sh.CK() + kColumns - 1) / kColumns) {}
  int64_t count(const Shape& sh) const { return sh.P * S * chunks; }
  Tile tile(const Shape& sh, int64_t t) const {
    const int64_t ch = t % chunks, s = t / chunks % S, p = t / (chunks * S);
    Tile tl{p, s, s * rps, std::min(sh.A, (s + 1) * rps), ch * kColumns,
            std::min(sh.CK(), (ch + 1) * kColumns), 0, 1};
    tl.w = tl.j1 - tl.j0;
    if (tl.w == sh.CK()) tl.R = std::max<int64_t>(1, kSuperWidth / tl.w);  // rows contiguous
    return tl;
  }
};

}  // namespace column

using column::kColumns;
using column::Tile;
using column::Tiling;

constexpr int kRegVecs = 8;  // widest tile (in vectors) of the register path

// Calls fn(integral_constant<int, NV>) and returns true when the tile is NV <= kRegVecs whole
// vectors wide; returns false otherwise. fn must be JAXDNN_INLINE_LAMBDA: eight instantiations
// are more than GCC inlines on its own, and an outlined lambda is compiled for the baseline
// ISA, not for the clone that calls it.
template <typename T, typename Fn>
JAXDNN_ALWAYS_INLINE bool with_narrow(const Tile& t, Fn&& fn) {
  constexpr int N = Lanes<T>::kN;
  if (t.w % N != 0) return false;
  switch (t.w / N) {
    case 1: fn(std::integral_constant<int, 1>{}); return true;
    case 2: fn(std::integral_constant<int, 2>{}); return true;
    case 3: fn(std::integral_constant<int, 3>{}); return true;
    case 4: fn(std::integral_constant<int, 4>{}); return true;
    case 5: fn(std::integral_constant<int, 5>{}); return true;
    case 6: fn(std::integral_constant<int, 6>{}); return true;
    case 7: fn(std::integral_constant<int, 7>{}); return true;
    case 8: fn(std::integral_constant<int, 8>{}); return true;
    default: return false;
  }
}
static_assert(kRegVecs == 8, "with_narrow dispatches NV = 1..8");

// The stats pass's register path walks a tile's rows once per block of at most kRegBlock
// vectors: three state vectors each (Welford's shift, mean, M2) stay in 12 of AVX2's 16 ymm
// registers. With all 8 vectors of a 64-column float tile at once (24 state vectors), GCC kept
// the state on the stack. The AVX-512 clone (32 registers, wide_register_file()) takes all the
// tile's vectors in one block: one thread, batch_norm 8x56x56x64 float32 training forward
// (dev/cpu_norm_bench.cc, Xeon with AVX-512) 769-783 us against 851-855 in two
// blocks; and, its block loop unrolled whole (by 4, the 8-vector state had stayed on the stack),
// 628-658 us against 690-713 (docs/perf/norm.md, another host).
constexpr int kRegBlock = 4;
static_assert(kRegVecs <= 2 * kRegBlock, "for_reg_blocks makes at most two blocks");

// Calls fn(integral_constant<int, NB>, k0) for the blocks [k0, k0 + NB) of NV vectors.
template <int NV, typename Fn>
JAXDNN_ALWAYS_INLINE void for_reg_blocks(Fn&& fn) {
  if constexpr (NV <= kRegBlock) {
    fn(std::integral_constant<int, NV>{}, 0);
  } else {
    if (wide_register_file()) {
      fn(std::integral_constant<int, NV>{}, 0);
      return;
    }
    fn(std::integral_constant<int, kRegBlock>{}, 0);
    fn(std::integral_constant<int, NV - kRegBlock>{}, kRegBlock);
  }
}

// Offset of (row a, first tile column) in an x-like buffer.
inline int64_t row_offset(const Shape& s, const Tile& t, int64_t a) {
  return (t.p * s.A + a) * s.CK() + t.j0;
}

// Replicates per-column values c[0..w) R times: c[r*w + j] = c[j].
template <typename T>
JAXDNN_ALWAYS_INLINE void replicate(S<T>* c, const Tile& t) {
  for (int64_t r = 1; r < t.R; ++r) std::memcpy(c + r * t.w, c, size_t(t.w) * sizeof(S<T>));
}

// Register path of the stats pass: Welford's update per column on x - shift (shift = the
// tile's first row), one row at a time, per register block of NB vectors from vector k0.
template <int NB, typename T>
JAXDNN_ALWAYS_INLINE void column_stats_block(const FwdView<T>& v, const Tile& t, int64_t nslices,
                                             int k0) {
  constexpr int N = Lanes<T>::kN;
  const Shape& s = v.s;
  V<T> shift[NB], mean[NB], m2[NB];
  const T* x0 = v.x + row_offset(s, t, t.a0) + k0 * N;
#pragma GCC unroll 8
  for (int k = 0; k < NB; ++k) {
    shift[k] = v.centered ? vload(x0 + k * N) : V<T>{};
    mean[k] = m2[k] = V<T>{};
  }
  // Whole unrolling (NB <= 8) keeps the state arrays in registers: unrolled by 4, the 8-vector
  // block of the AVX-512 clone kept them on the stack (two loads and two stores per vector of
  // x); and the centred test outside the row loop.
  auto walk = [&](auto centered) JAXDNN_INLINE_LAMBDA {
    const T* x = x0;
    for (int64_t a = t.a0; a < t.a1; ++a, x += s.CK()) {
      const S<T> inv = S<T>(1) / S<T>(a - t.a0 + 1);
#pragma GCC unroll 8
      for (int k = 0; k < NB; ++k) {
        const V<T> xv = vload(x + k * N) - shift[k], d = xv - mean[k];
        if constexpr (decltype(centered)::value) {
          mean[k] += d * inv;
          m2[k] += d * (xv - mean[k]);
        } else {
          m2[k] += xv * xv;
        }
      }
    }
  };
  if (v.centered) walk(std::true_type{});
  else walk(std::false_type{});
  const int64_t off = (t.p * nslices + t.s) * s.CK() + t.j0 + k0 * N;
  for (int k = 0; k < NB; ++k)
    for (int i = 0; i < N; ++i) {
      v.ws0[off + k * N + i] = v.centered ? double(shift[k][i]) + double(mean[k][i]) : 0.0;
      v.ws1[off + k * N + i] = double(m2[k][i]);
    }
}

// buf holds 3*R*w accumulators: shift, mean, M2 per (replica, column).
template <typename T>
JAXDNN_ALWAYS_INLINE void column_stats_tile(const FwdView<T>& v, const Tile& t, int64_t nslices,
                                            S<T>* buf) {
  if (with_narrow<T>(t, [&](auto nv) JAXDNN_INLINE_LAMBDA {
        for_reg_blocks<decltype(nv)::value>([&](auto nb, int k0) JAXDNN_INLINE_LAMBDA {
          column_stats_block<decltype(nb)::value>(v, t, nslices, k0);
        });
      }))
    return;
  const Shape& s = v.s;
  const int64_t w = t.w, n = t.R * w;
  S<T>* shift = buf;
  S<T>* mean = buf + n;
  S<T>* m2 = buf + 2 * n;
  const T* x0 = v.x + row_offset(s, t, t.a0);
  for (int64_t i = 0; i < n; ++i) {  // replica r's shift: its first row (a0 + r, if any)
    shift[i] = v.centered && i < (t.a1 - t.a0) * w ? load_acc(x0[i]) : S<T>(0);
    mean[i] = m2[i] = 0;
  }
  for (int64_t g = 0; g < t.supers(); ++g) {
    const T* x = v.x + row_offset(s, t, t.a0 + g * t.R);
    const int64_t len = t.rows(g) * w;
    if (v.centered) {
      const S<T> inv = S<T>(1) / S<T>(g + 1);
      for_lanes<T>(len, [&](int64_t i, auto tag) {  // Welford's update
        const auto xv = at(x, i, tag) - at(shift, i, tag), d = xv - at(mean, i, tag);
        const auto mu = at(mean, i, tag) + d * inv;
        put(mean, i, mu, tag);
        put(m2, i, at(m2, i, tag) + d * (xv - mu), tag);
      });
    } else {
      for_lanes<T>(len, [&](int64_t i, auto tag) {
        const auto xv = at(x, i, tag);
        put(m2, i, at(m2, i, tag) + xv * xv, tag);
      });
    }
  }
  // Fold replica r into replica 0 in order, Chan's update with one count per replica (rows
  // r, r+R, ...), all columns at once. Means stay relative to replica 0's shift: the shift
  // difference of two nearby values is exact, so the offset costs no precision.
  const int64_t full = (t.a1 - t.a0) / t.R, rem = (t.a1 - t.a0) % t.R;
  S<T> n0 = S<T>(full + (rem > 0));
  for (int64_t r = 1; r < t.R; ++r) {
    const S<T> nb = S<T>(full + (r < rem));
    if (nb == 0) break;
    const S<T> f = nb / (n0 + nb), g = n0 * f;
    const S<T>* shr = shift + r * w;
    const S<T>* mur = mean + r * w;
    const S<T>* m2r = m2 + r * w;
    for (int64_t j = 0; j < w; ++j) {
      const S<T> d = (shr[j] - shift[j]) + (mur[j] - mean[j]);
      mean[j] += d * f;
      m2[j] += m2r[j] + d * d * g;
    }
    n0 += nb;
  }
  const int64_t off = (t.p * nslices + t.s) * s.CK() + t.j0;
  for (int64_t j = 0; j < w; ++j) {
    v.ws0[off + j] = v.centered ? double(shift[j]) + double(mean[j]) : 0.0;
    v.ws1[off + j] = double(m2[j]);
  }
}

// Per-column (mean, rstd) of the tile's w columns (not yet replicated).
template <typename T, typename View>
JAXDNN_ALWAYS_INLINE void column_stats_of(const View& v, const Tile& t, S<T>* mu, S<T>* rs) {
  for (int64_t j = 0; j < t.w; ++j) {
    const int64_t g = t.p * v.s.C + (t.j0 + j) / v.s.K;
    mu[j] = v.mean[g];
    rs[j] = rstd_of<T>(v.var[g], v.eps);
  }
}

// The apply's per-column coefficients from (rstd) gg and the affine parameters: gg *= scale,
// and bb = bias unless bias is null (the forward's, and the backward's recomputation of z
// under the epilogue).
template <typename T>
JAXDNN_ALWAYS_INLINE void affine_coefs(const Shape& s, const Tile& t, const S<T>* scale,
                                       const S<T>* bias, S<T>* gg, S<T>* bb) {
  const int64_t affine = t.p / s.Pq() * s.CK() + t.j0;
  for (int64_t j = 0; j < t.w; ++j) {
    gg[j] *= scale[affine + j];
    if (bias) bb[j] = bias[affine + j];
  }
}

// Register path of the apply pass. The AVX2 clone takes four rows per step: each vector's
// coefficients are loaded once per step (1.75 loads per vector of x) and the step reads 4
// consecutive rows. One thread, batch_norm_inference 8x56x56x64 float32 (dev/cpu_norm_bench.cc,
// against a plain loop y = x*g + h): 1.10-1.20x its time, against 1.26-1.36 with all
// coefficients in registers and every row walked once per 4-vector block, and 1.45-1.53 when
// all 8 vectors' coefficients (24 ymm) went to the stack. The AVX-512 clone keeps all 3*NV
// coefficient vectors in its 32 registers and walks the rows one by one: 477-483 us against
// 581-586 in 4-row steps and 460-474 for the plain loop (Xeon).
template <int NV, typename T>
JAXDNN_ALWAYS_INLINE void column_apply_narrow(const FwdView<T>& v, const Tile& t, const S<T>* mu,
                                             const S<T>* gg, const S<T>* bb) {
  constexpr int N = Lanes<T>::kN;
  const int64_t CK = v.s.CK();
  const T* x = v.x + row_offset(v.s, t, t.a0);
  T* y = v.y + row_offset(v.s, t, t.a0);
  if (wide_register_file()) {
    V<T> m[NV], g[NV], b[NV];
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      m[k] = vload(mu + k * N);
      g[k] = vload(gg + k * N);
      b[k] = vload(bb + k * N);
    }
    for (int64_t a = t.a0; a < t.a1; ++a, x += CK, y += CK) {
#pragma GCC unroll 8
      for (int k = 0; k < NV; ++k) vstore(y + k * N, (vload(x + k * N) - m[k]) * g[k] + b[k]);
    }
    return;
  }
  auto step = [&](auto rows) JAXDNN_INLINE_LAMBDA {  // rows x, y from x, y
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      const V<T> m = vload(mu + k * N), g = vload(gg + k * N), b = vload(bb + k * N);
#pragma GCC unroll 4
      for (int r = 0; r < decltype(rows)::value; ++r)
        vstore(y + r * CK + k * N, (vload(x + r * CK + k * N) - m) * g + b);
    }
  };
  int64_t a = t.a0;
  for (; a + 4 <= t.a1; a += 4, x += 4 * CK, y += 4 * CK) step(std::integral_constant<int, 4>{});
  for (; a < t.a1; ++a, x += CK, y += CK) step(std::integral_constant<int, 1>{});
}

// buf holds 3*R*w coefficients.
template <typename T>
JAXDNN_ALWAYS_INLINE void column_apply_tile(const FwdView<T>& v, const Tile& t, S<T>* buf) {
  const Shape& s = v.s;
  const int64_t n = t.R * t.w;
  S<T>* mu = buf;
  S<T>* gg = buf + n;
  S<T>* bb = buf + 2 * n;
  column_stats_of<T>(v, t, mu, gg);
  affine_coefs<T>(v.s, t, v.scale, v.bias, gg, bb);
  const bool fused = v.relu || v.residual;
  if (!fused && with_narrow<T>(t, [&](auto nv) JAXDNN_INLINE_LAMBDA {
        column_apply_narrow<decltype(nv)::value>(v, t, mu, gg, bb);
      }))
    return;
  for (S<T>* c : {mu, gg, bb}) replicate<T>(c, t);
  for (int64_t g = 0; g < t.supers(); ++g) {
    const int64_t row = row_offset(s, t, t.a0 + g * t.R);
    const T* x = v.x + row;
    const T* r = v.residual ? v.residual + row : nullptr;
    T* y = v.y + row;
    for_lanes<T>(t.rows(g) * t.w, [&](int64_t i, auto tag) {
      auto z = (at(x, i, tag) - at(mu, i, tag)) * at(gg, i, tag) + at(bb, i, tag);
      if (fused) {
        if (r) z += at(r, i, tag);
        if (v.relu) z = relu_of(z);
      }
      put(y, i, z, tag);
    });
  }
}

// dy masked by the epilogue's ReLU at value i (z from x, the per-column mean, rstd*scale and
// bias, and the residual r, null when there is none), or dy itself without the ReLU.
template <typename T, typename Tag>
JAXDNN_ALWAYS_INLINE auto masked_dy(const BwdView<T>& v, const T* x, const T* dy, const T* r,
                                    const S<T>* mu, const S<T>* gz, const S<T>* bz, int64_t i,
                                    Tag tag) {
  const auto d = at(dy, i, tag);
  if (!v.relu) return d;
  auto z = (at(x, i, tag) - at(mu, i, tag)) * at(gz, i, tag) + at(bz, i, tag);
  if (r) z += at(r, i, tag);
  return relu_mask(z, d);
}

// buf holds 6*R*w values: mean, rstd, the two sums, and (epilogue) rstd*scale and bias per
// (replica, column).
template <typename T>
JAXDNN_ALWAYS_INLINE void column_grads_tile(const BwdView<T>& v, const Tile& t, int64_t nslices,
                                            S<T>* buf) {
  const Shape& s = v.s;
  const int64_t n = t.R * t.w;
  S<T>* mu = buf;
  S<T>* rs = buf + n;
  S<T>* sdyx = buf + 2 * n;
  S<T>* sdy = buf + 3 * n;
  S<T>* gz = buf + 4 * n;
  S<T>* bz = buf + 5 * n;
  column_stats_of<T>(v, t, mu, rs);
  if (v.relu) {
    std::memcpy(gz, rs, size_t(t.w) * sizeof(S<T>));
    affine_coefs<T>(s, t, v.scale, v.bias, gz, bz);
    for (S<T>* c : {gz, bz}) replicate<T>(c, t);
  }
  for (S<T>* c : {mu, rs}) replicate<T>(c, t);
  for (int64_t i = 0; i < n; ++i) sdyx[i] = sdy[i] = 0;
  for (int64_t g = 0; g < t.supers(); ++g) {
    const int64_t row = row_offset(s, t, t.a0 + g * t.R);
    const T* x = v.x + row;
    const T* dy = v.dy + row;
    const T* r = v.residual ? v.residual + row : nullptr;
    for_lanes<T>(t.rows(g) * t.w, [&](int64_t i, auto tag) {
      const auto d = masked_dy(v, x, dy, r, mu, gz, bz, i, tag);
      put(sdyx, i, at(sdyx, i, tag) + d * (at(x, i, tag) - at(mu, i, tag)), tag);
      put(sdy, i, at(sdy, i, tag) + d, tag);
    });
  }
  const int64_t off = (t.p * nslices + t.s) * s.CK() + t.j0;
  for (int64_t j = 0; j < t.w; ++j) {  // fold the replicas in order
    S<T> a = 0, b = 0;
    for (int64_t r = 0; r < t.R; ++r) {
      a += sdyx[r * t.w + j];
      b += sdy[r * t.w + j];
    }
    v.ws0[off + j] = a * rs[j];
    v.ws1[off + j] = b;
  }
}

// buf holds 5*R*w coefficients (the fifth plane: the epilogue's bias).
template <typename T>
JAXDNN_ALWAYS_INLINE void column_dx_tile(const BwdView<T>& v, const Tile& t, S<T>* buf) {
  const Shape& s = v.s;
  const int64_t n = t.R * t.w;
  S<T>* mu = buf;
  S<T>* gr = buf + n;
  S<T>* c1 = buf + 2 * n;
  S<T>* c2 = buf + 3 * n;
  S<T>* bz = buf + 4 * n;
  column_stats_of<T>(v, t, mu, gr);
  affine_coefs<T>(s, t, v.scale, v.relu ? v.bias : nullptr, gr, bz);
  for (int64_t j = 0; j < t.w; ++j) {
    const int64_t g = t.p * s.C + (t.j0 + j) / s.K;
    c1[j] = v.coef[2 * g];
    c2[j] = v.coef[2 * g + 1];
  }
  for (S<T>* c : {mu, gr, c1, c2}) replicate<T>(c, t);
  if (v.relu) replicate<T>(bz, t);
  for (int64_t g = 0; g < t.supers(); ++g) {
    const int64_t row = row_offset(s, t, t.a0 + g * t.R);
    const T* x = v.x + row;
    const T* dy = v.dy + row;
    const T* r = v.residual ? v.residual + row : nullptr;
    T* dx = v.dx + row;
    T* dres = v.dres ? v.dres + row : nullptr;
    for_lanes<T>(t.rows(g) * t.w, [&](int64_t i, auto tag) {
      const auto d = masked_dy(v, x, dy, r, mu, gr, bz, i, tag);
      put(dx, i, at(gr, i, tag) * d + (at(x, i, tag) - at(mu, i, tag)) * at(c1, i, tag) +
                     at(c2, i, tag),
          tag);
      if (dres) put(dres, i, d, tag);
    });
  }
}

#define JAXDNN_COLUMN_TASKS(T)                                                                \
  JAXDNN_CPU_CLONES void column_stats_task(const FwdView<T>& v, const Tile& t,                \
                                           int64_t nslices, S<T>* buf) {                      \
    column_stats_tile<T>(v, t, nslices, buf);                                                 \
  }                                                                                           \
  JAXDNN_CPU_CLONES void column_apply_task(const FwdView<T>& v, const Tile& t, S<T>* buf) {   \
    column_apply_tile<T>(v, t, buf);                                                          \
  }                                                                                           \
  JAXDNN_CPU_CLONES void column_grads_task(const BwdView<T>& v, const Tile& t,                \
                                           int64_t nslices, S<T>* buf) {                      \
    column_grads_tile<T>(v, t, nslices, buf);                                                 \
  }                                                                                           \
  JAXDNN_CPU_CLONES void column_dx_task(const BwdView<T>& v, const Tile& t, S<T>* buf) {      \
    column_dx_tile<T>(v, t, buf);                                                             \
  }
JAXDNN_COLUMN_TASKS(float)
JAXDNN_COLUMN_TASKS(double)
JAXDNN_COLUMN_TASKS(f16_t)
JAXDNN_COLUMN_TASKS(bf16_t)
#undef JAXDNN_COLUMN_TASKS

// Runs task(tile, slices, scratch) on every tile of the column problem, each task with its
// own `planes` x kColumns scratch values (uninitialised: every task writes before it reads).
template <typename T, typename View, typename Task>
void over_tiles(const View& v, const Parallel& par, int planes, Task&& task) {
  const Tiling tl(v.s);
  par.for_each(tl.count(v.s), [&](int64_t i) {
    task(tl.tile(v.s, i), tl.S, thread_scratch<S<T>>(planes * kColumns));
  });
}

template <typename T>
void column_stats(const FwdView<T>& v, const Parallel& par) {
  over_tiles<T>(v, par, 3, [&](auto tile, auto slices, S<T>* buf) {
    column_stats_task(v, tile, slices, buf);
  });
}

template <typename T>
void column_apply(const FwdView<T>& v, const Parallel& par) {
  over_tiles<T>(v, par, 3, [&](auto tile, auto, S<T>* buf) { column_apply_task(v, tile, buf); });
}

template <typename T>
void column_grads(const BwdView<T>& v, const Parallel& par) {
  over_tiles<T>(v, par, 6, [&](auto tile, auto slices, S<T>* buf) {
    column_grads_task(v, tile, slices, buf);
  });
}

template <typename T>
void column_dx(const BwdView<T>& v, const Parallel& par) {
  over_tiles<T>(v, par, 5, [&](auto tile, auto, S<T>* buf) { column_dx_task(v, tile, buf); });
}

JAXDNN_NORM_CPU_INSTANTIATE(column_stats, FwdView);
JAXDNN_NORM_CPU_INSTANTIATE(column_apply, FwdView);
JAXDNN_NORM_CPU_INSTANTIATE(column_grads, BwdView);
JAXDNN_NORM_CPU_INSTANTIATE(column_dx, BwdView);

}  // namespace jaxdnn::norm::cpu
