// CPU row path (A == 1, T == 1; layer and RMS norm): every statistics group is one contiguous
// row of K values, with its own affine row.
//
// Forward, per row: moments (one read from memory; the block's second look hits L1), then
// y = (x - mean)*rstd*scale + bias from cache.            Traffic: read x, write y.
// Backward, per row: the two group sums (one read of x and dy), then dx and the row's d(scale),
// d(bias) contributions from cache. Each task owns one slice of rows of one (q, c) and writes
// its d(scale), d(bias) partial; cpu_norm.cc reduces the partials in slice order.
//                                                          Traffic: read x, dy, write dx.

#include <vector>

#include "cc/norm/cpu_kernels.h"

namespace jaxdnn::norm::cpu {

// y = (x - m)*rs*g + b over one row.
template <typename T>
JAXDNN_ALWAYS_INLINE void row_apply(const T* __restrict__ x, T* __restrict__ y,
                                    const S<T>* __restrict__ g, const S<T>* __restrict__ b,
                                    int64_t K, S<T> m, S<T> rs) {
  for_lanes<T>(K, [&](int64_t k, auto tag) {
    put(y, k, (at(x, k, tag) - m) * rs * at(g, k, tag) + at(b, k, tag), tag);
  });
}

// Requests the cache lines of x[0..K) ahead of use.
template <typename T>
JAXDNN_ALWAYS_INLINE void prefetch_row(const T* x, int64_t K) {
  for (int64_t k = 0; k < K; k += 64 / int64_t(sizeof(T))) __builtin_prefetch(x + k);
}

template <typename T>
JAXDNN_ALWAYS_INLINE void row_forward_rows(const FwdView<T>& v, bool training, int64_t r0,
                                           int64_t r1) {
  const Shape& s = v.s;
  const int64_t K = s.K;
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = v.x + r * K;
    T* y = v.y + r * K;
    if (training) finish_stats(v, r, contiguous_moments(x, K, v.centered));
    // The next row comes in while this one is written: only the statistics pass reads x from
    // memory, which otherwise idles during the output pass (4096x1024 float32 forward on two
    // AVX2 cores: 1.9-2.1 -> 1.45-1.55 ms; bfloat16 unchanged).
    if (r + 1 < r1) prefetch_row(x + K, K);
    const S<T> m = v.mean[r], rs = rstd_of<T>(v.var[r], v.eps);
    const int64_t p = r / s.C, c = r % s.C, affine = (p / s.Pq() * s.C + c) * K;
    row_apply(x, y, v.scale + affine, v.bias + affine, K, m, rs);
  }
}

// dx of one row and its d(scale), d(bias) contributions (restrict: the pointers never alias,
// which lets the loop vectorise).
template <typename T>
JAXDNN_ALWAYS_INLINE void row_dx(const T* __restrict__ x, const T* __restrict__ dy,
                                 const S<T>* __restrict__ g, T* __restrict__ dx,
                                 S<T>* __restrict__ dg, S<T>* __restrict__ db, int64_t K, S<T> m,
                                 S<T> rs, S<T> c1, S<T> c2) {
  for_lanes<T>(K, [&](int64_t k, auto tag) {
    const auto xc = at(x, k, tag) - m, d = at(dy, k, tag);
    put(dx, k, at(g, k, tag) * rs * d + xc * c1 + c2, tag);
    put(dg, k, at(dg, k, tag) + d * xc * rs, tag);
    put(db, k, at(db, k, tag) + d, tag);
  });
}

// One backward task: rows [lo, hi) of affine row q, group column c; dg/db (K each) receive
// the slice's d(scale), d(bias).
template <typename T>
JAXDNN_ALWAYS_INLINE void row_backward_slice(const BwdView<T>& v, int64_t q, int64_t c,
                                             int64_t lo, int64_t hi, S<T>* dg, S<T>* db) {
  const Shape& s = v.s;
  const int64_t K = s.K;
  const S<T>* g = v.scale + (q * s.C + c) * K;
  for (int64_t k = 0; k < K; ++k) dg[k] = db[k] = 0;
  for (int64_t p = q * s.Pq() + lo; p < q * s.Pq() + hi; ++p) {
    const int64_t r = p * s.C + c;
    const T* x = v.x + r * K;
    const T* dy = v.dy + r * K;
    T* dx = v.dx + r * K;
    const S<T> m = v.mean[r], rs = rstd_of<T>(v.var[r], v.eps);
    S<T> sg, sgxc;  // pass 1: sum(g*dy), sum(g*dy*(x - mean))
    lane_grad_sums<true>(x, dy, g, K, m, &sg, &sgxc);
    S<T> c1, c2;
    group_coefficients(v, r, double(K), double(sg), double(sgxc) * double(rs), &c1, &c2);
    row_dx(x, dy, g, dx, dg, db, K, m, rs, c1, c2);  // pass 2, from cache
  }
}

// Per-dtype entry points compiled for each ISA.
#define JAXDNN_ROW_TASKS(T)                                                                   \
  JAXDNN_CPU_CLONES void row_forward_task(const FwdView<T>& v, bool training, int64_t r0,     \
                                          int64_t r1) {                                       \
    row_forward_rows<T>(v, training, r0, r1);                                                 \
  }                                                                                           \
  JAXDNN_CPU_CLONES void row_backward_task(const BwdView<T>& v, int64_t q, int64_t c,         \
                                           int64_t lo, int64_t hi, S<T>* dg, S<T>* db) {      \
    row_backward_slice<T>(v, q, c, lo, hi, dg, db);                                           \
  }
JAXDNN_ROW_TASKS(float)
JAXDNN_ROW_TASKS(double)
JAXDNN_ROW_TASKS(f16_t)
JAXDNN_ROW_TASKS(bf16_t)
#undef JAXDNN_ROW_TASKS

template <typename T>
void row_forward(const FwdView<T>& v, bool training, const Parallel& par) {
  const int64_t rows = v.s.groups();
  const int64_t per_task = std::max<int64_t>(1, 32768 / std::max<int64_t>(v.s.K, 1));
  par.for_each((rows + per_task - 1) / per_task, [&](int64_t t) {
    row_forward_task(v, training, t * per_task, std::min(rows, (t + 1) * per_task));
  });
}

template <typename T>
void row_backward(const BwdView<T>& v, const Parallel& par) {
  const Shape& s = v.s;
  const int64_t slices = row_bwd_slices(s);
  // Task (q, sb, c) covers rows [sb*Pq/slices, (sb+1)*Pq/slices) of affine row q; its partial
  // lands at (q, sb, c, :) of the (Q, slices, C, K) planes.
  par.for_each(s.Q * slices * s.C, [&](int64_t t) {
    const int64_t c = t % s.C, sb = t / s.C % slices, q = t / (s.C * slices);
    const int64_t lo = sb * s.Pq() / slices, hi = (sb + 1) * s.Pq() / slices;
    S<T>* const acc = thread_scratch<S<T>>(2 * s.K);  // d(scale), d(bias) of the slice
    row_backward_task(v, q, c, lo, hi, acc, acc + s.K);
    const int64_t at = (q * slices + sb) * s.CK() + c * s.K;
    for (int64_t k = 0; k < s.K; ++k) {
      v.ws0[at + k] = acc[k];
      v.ws1[at + k] = acc[s.K + k];
    }
  });
}

template void row_forward<float>(const FwdView<float>&, bool, const Parallel&);
template void row_forward<double>(const FwdView<double>&, bool, const Parallel&);
template void row_forward<f16_t>(const FwdView<f16_t>&, bool, const Parallel&);
template void row_forward<bf16_t>(const FwdView<bf16_t>&, bool, const Parallel&);
JAXDNN_NORM_CPU_INSTANTIATE(row_backward, BwdView);

}  // namespace jaxdnn::norm::cpu
