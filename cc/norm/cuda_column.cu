// CUDA column path (A > 1, T == 1; batch and group norm, channels-last): per p, x is an
// (A, C*K) matrix whose column j belongs to group c = j / K.
//
// Block of 256 threads = (TY row groups) x (TX threads across columns); each thread owns VEC
// consecutive columns (one 16-byte vector when rows are vector-aligned), so a warp reads whole
// contiguous row segments. Block b covers one row slice (rows_per_slice rows, norm.h) of one
// column tile (TX*VEC columns) of one p; thread (tx, ty) walks rows a0+ty, a0+ty+TY, ...,
// with 4 rows of loads in flight.
//   stats  Welford's update per column on x - shift (shift = the slice's first row), row groups
//          tree-merged with Chan's update; the slice's (mean, M2) go to the double workspace.
//          Traffic: read x.
//   apply  y = (x - mean)*(rstd*scale) + bias with per-column coefficients in registers.
//          Blocks run in reverse order, so the first reads hit what the stats pass left in L2.
//          Traffic: read x, write y.
//   grads  per-column sums of dy and dy*(x - mean) over the slice, tree-summed across row
//          groups.  Traffic: read x, dy.
//   dx     dx = scale*rstd*dy + (x - mean)*c1 + c2, reverse block order.
//          Traffic: read x, dy, write dx.

#include "cc/norm/cuda_kernels.cuh"

namespace jaxdnn::norm::cuda_impl {
namespace {

constexpr int kThreads = 256;
constexpr int kLoadsInFlight = 4;  // 16-byte loads each thread issues before using them

struct ColumnGrid {
  int tx, ty;  // threads across columns (a power of two <= 32), row groups (kThreads / tx)
  int64_t tiles, slices, rps, blocks;
};

// This thread's place: batch p, slice s (rows [a0, a1)), first column j.
struct ColumnThread {
  int64_t p, s, a0, a1, j;
  int tx, ty;
  bool active;

  __device__ ColumnThread(const Shape& sh, const ColumnGrid& g, int vec, bool reverse) {
    const int64_t b = reverse ? g.blocks - 1 - blockIdx.x : blockIdx.x;
    const int64_t tile = b % g.tiles;
    s = b / g.tiles % g.slices;
    p = b / (g.tiles * g.slices);
    tx = int(threadIdx.x) % g.tx;
    ty = int(threadIdx.x) / g.tx;
    a0 = s * g.rps;
    a1 = a0 + g.rps < sh.A ? a0 + g.rps : sh.A;
    j = (tile * g.tx + tx) * vec;
    active = j < sh.CK();
  }
};

// Calls f(row offset, x values, dy values) for this thread's rows in order, loading a few rows
// ahead. x and dy point at this thread's first column in row 0; kInputs == 1 reads x alone.
template <typename D, int VEC, int kInputs, typename F>
__device__ __forceinline__ void for_rows(const ColumnThread& t, const ColumnGrid& g, const D* x,
                                         const D* dy, int64_t ld, F f) {
  constexpr int U = kLoadsInFlight / kInputs;  // rows in flight
  for (int64_t a = t.a0 + t.ty; a < t.a1; a += U * g.ty) {
    A<D> xv[U][VEC], dv[U][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (a + u * g.ty < t.a1) {
        load_vals<D, VEC>(x + (a + u * g.ty) * ld, xv[u]);
        if constexpr (kInputs == 2) load_vals<D, VEC>(dy + (a + u * g.ty) * ld, dv[u]);
      }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (a + u * g.ty < t.a1) f((a + u * g.ty) * ld, xv[u], dv[u]);
  }
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) column_stats_kernel(Fwd<D> f, ColumnGrid g) {
  using Acc = A<D>;
  __shared__ Acc sn[kThreads];
  __shared__ Acc smean[VEC][kThreads], sm2[VEC][kThreads];
  const Shape& s = f.s;
  const int64_t CK = s.CK();
  const ColumnThread t(s, g, VEC, false);
  const D* col = f.x + t.p * s.A * CK + t.j;
  Acc shift[VEC] = {}, mean[VEC] = {}, m2[VEC] = {}, n = 0;
  if (t.active) {
    if (f.centered) load_vals<D, VEC>(col + t.a0 * CK, shift);
    for_rows<D, VEC, 1>(t, g, col, nullptr, CK,
                        [&](int64_t, const Acc(&v)[VEC], const Acc(&)[VEC]) {
                          n += 1;
                          const Acc inv = Acc(1) / n;
#pragma unroll
                          for (int e = 0; e < VEC; ++e) {  // Welford's update
                            const Acc xv = v[e] - shift[e], d = xv - mean[e];
                            mean[e] += d * inv;
                            m2[e] += d * (xv - mean[e]);
                          }
                        });
  }
  // Tree-merge the row groups of each column (Chan's update, fixed order).
  const int tid = threadIdx.x;
  for (int half = g.ty; half > 1; half /= 2) {
    sn[tid] = n;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      smean[e][tid] = mean[e];
      sm2[e][tid] = m2[e];
    }
    __syncthreads();
    if (t.ty < half / 2) {
      const int o = tid + (half / 2) * g.tx;
      Moments<Acc> m{n, 0, 0};
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        m = {n, mean[e], m2[e]};
        m.merge(sn[o], smean[e][o], sm2[e][o]);
        mean[e] = m.mean;
        m2[e] = m.m2;
      }
      n = m.n;
    }
    __syncthreads();
  }
  if (t.ty == 0 && t.active) {
    const int64_t off = (t.p * g.slices + t.s) * CK + t.j;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {  // not centred (RMS): the mean is 0, M2 the sum of squares
      const double m = double(shift[e]) + double(mean[e]);
      f.ws0[off + e] = f.centered ? m : 0.0;
      f.ws1[off + e] = f.centered ? double(m2[e]) : double(m2[e]) + double(n) * m * m;
    }
  }
}

// Per-column (mean, rstd) of this thread's columns.
template <typename D, int VEC, typename View>
__device__ __forceinline__ void column_moments(const View& v, const ColumnThread& t,
                                               A<D> (&mu)[VEC], A<D> (&rs)[VEC]) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const int64_t grp = t.p * v.s.C + (t.j + e) / v.s.K;
    mu[e] = v.mean[grp];
    rs[e] = rstd_of<D>(v.var[grp], v.eps);
  }
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) column_apply_kernel(Fwd<D> f, ColumnGrid g) {
  using Acc = A<D>;
  const Shape& s = f.s;
  const int64_t CK = s.CK();
  const ColumnThread t(s, g, VEC, true);
  if (!t.active) return;
  Acc mu[VEC], gg[VEC], bb[VEC], sc[VEC];
  column_moments<D, VEC>(f, t, mu, gg);
  const int64_t affine = t.p / s.Pq() * CK + t.j;
  load_params(f.scale + affine, sc);
  load_params(f.bias + affine, bb);
#pragma unroll
  for (int e = 0; e < VEC; ++e) gg[e] *= sc[e];
  const int64_t base = t.p * s.A * CK + t.j;
  for_rows<D, VEC, 1>(t, g, f.x + base, nullptr, CK,
                   [&](int64_t off, const Acc(&v)[VEC], const Acc(&)[VEC]) {
                     Acc out[VEC];
#pragma unroll
                     for (int e = 0; e < VEC; ++e) out[e] = (v[e] - mu[e]) * gg[e] + bb[e];
                     store_vals<D, VEC>(f.y + base + off, out);
                   });
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) column_grads_kernel(Bwd<D> b, ColumnGrid g) {
  using Acc = A<D>;
  __shared__ Acc s1[VEC][kThreads], s2[VEC][kThreads];
  const Shape& s = b.s;
  const int64_t CK = s.CK();
  const ColumnThread t(s, g, VEC, false);
  Acc mu[VEC], rs[VEC], sdy[VEC] = {}, sdyx[VEC] = {};
  if (t.active) {
    column_moments<D, VEC>(b, t, mu, rs);
    const int64_t base = t.p * s.A * CK + t.j;
    for_rows<D, VEC, 2>(t, g, b.x + base, b.dy + base, CK,
                     [&](int64_t, const Acc(&x)[VEC], const Acc(&d)[VEC]) {
#pragma unroll
                       for (int e = 0; e < VEC; ++e) {
                         sdy[e] += d[e];
                         sdyx[e] += d[e] * (x[e] - mu[e]);
                       }
                     });
  }
  const int tid = threadIdx.x;
  for (int half = g.ty; half > 1; half /= 2) {  // tree-sum the row groups, fixed order
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      s1[e][tid] = sdy[e];
      s2[e][tid] = sdyx[e];
    }
    __syncthreads();
    if (t.ty < half / 2) {
      const int o = tid + (half / 2) * g.tx;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        sdy[e] += s1[e][o];
        sdyx[e] += s2[e][o];
      }
    }
    __syncthreads();
  }
  if (t.ty == 0 && t.active) {
    const int64_t off = (t.p * g.slices + t.s) * CK + t.j;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      b.ws0[off + e] = sdyx[e] * rs[e];
      b.ws1[off + e] = sdy[e];
    }
  }
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) column_dx_kernel(Bwd<D> b, ColumnGrid g) {
  using Acc = A<D>;
  const Shape& s = b.s;
  const int64_t CK = s.CK();
  const ColumnThread t(s, g, VEC, true);
  if (!t.active) return;
  Acc mu[VEC], gr[VEC], sc[VEC], c1[VEC], c2[VEC];
  column_moments<D, VEC>(b, t, mu, gr);
  load_params(b.scale + t.p / s.Pq() * CK + t.j, sc);
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const int64_t grp = t.p * s.C + (t.j + e) / s.K;
    gr[e] *= sc[e];
    c1[e] = b.coef[2 * grp];
    c2[e] = b.coef[2 * grp + 1];
  }
  const int64_t base = t.p * s.A * CK + t.j;
  for_rows<D, VEC, 2>(t, g, b.x + base, b.dy + base, CK,
                   [&](int64_t off, const Acc(&x)[VEC], const Acc(&d)[VEC]) {
                     Acc out[VEC];
#pragma unroll
                     for (int e = 0; e < VEC; ++e)
                       out[e] = gr[e] * d[e] + (x[e] - mu[e]) * c1[e] + c2[e];
                     store_vals<D, VEC>(b.dx + base + off, out);
                   });
}

ColumnGrid column_grid(const Shape& s, int vec) {
  ColumnGrid g;
  const int64_t vecs = (s.CK() + vec - 1) / vec;
  g.tx = 1;
  while (g.tx < 32 && g.tx < vecs) g.tx *= 2;
  g.ty = kThreads / g.tx;
  g.tiles = (vecs + g.tx - 1) / g.tx;
  g.slices = num_slices(s);
  g.rps = rows_per_slice(s);
  g.blocks = s.P * g.slices * g.tiles;
  return g;
}

// Launches kernel<D, VEC> over the column grid with VEC = a 16-byte vector when every row of
// the given buffers starts 16-byte aligned, else 1.
template <typename D, template <typename, int> class Launch, typename View>
Status launch_columns(const View& v, bool aligned, const char* name, cudaStream_t st) {
  const bool vec = aligned && v.s.CK() % Vec<D>::kN == 0;
  const ColumnGrid g = column_grid(v.s, vec ? Vec<D>::kN : 1);
  if (vec) Launch<D, Vec<D>::kN>::run(v, g, st);
  else Launch<D, 1>::run(v, g, st);
  return cuda::check_launch(name);
}

#define JAXDNN_COLUMN_LAUNCH(Name, kernel, View)                                         \
  template <typename D, int VEC>                                                         \
  struct Name {                                                                          \
    static void run(const View<D>& v, const ColumnGrid& g, cudaStream_t st) {            \
      kernel<D, VEC><<<unsigned(g.blocks), kThreads, 0, st>>>(v, g);                     \
    }                                                                                    \
  };
JAXDNN_COLUMN_LAUNCH(StatsLaunch, column_stats_kernel, Fwd)
JAXDNN_COLUMN_LAUNCH(ApplyLaunch, column_apply_kernel, Fwd)
JAXDNN_COLUMN_LAUNCH(GradsLaunch, column_grads_kernel, Bwd)
JAXDNN_COLUMN_LAUNCH(DxLaunch, column_dx_kernel, Bwd)
#undef JAXDNN_COLUMN_LAUNCH

}  // namespace

template <typename D>
Status column_stats(const Fwd<D>& f, cudaStream_t st) {
  return launch_columns<D, StatsLaunch>(f, cuda::vec_aligned(f.x), "norm column_stats_kernel", st);
}

template <typename D>
Status column_apply(const Fwd<D>& f, cudaStream_t st) {
  return launch_columns<D, ApplyLaunch>(f,
                                        cuda::vec_aligned(f.x) && cuda::vec_aligned(f.y) &&
                                            cuda::vec_aligned(f.scale) && cuda::vec_aligned(f.bias),
                                        "norm column_apply_kernel", st);
}

template <typename D>
Status column_grads(const Bwd<D>& b, cudaStream_t st) {
  return launch_columns<D, GradsLaunch>(b, cuda::vec_aligned(b.x) && cuda::vec_aligned(b.dy),
                                        "norm column_grads_kernel", st);
}

template <typename D>
Status column_dx(const Bwd<D>& b, cudaStream_t st) {
  return launch_columns<D, DxLaunch>(
      b,
      cuda::vec_aligned(b.x) && cuda::vec_aligned(b.dy) && cuda::vec_aligned(b.dx) &&
          cuda::vec_aligned(b.scale),
      "norm column_dx_kernel", st);
}

JAXDNN_NORM_CUDA_INSTANTIATE(column_stats, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(column_apply, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(column_grads, Bwd);
JAXDNN_NORM_CUDA_INSTANTIATE(column_dx, Bwd);

}  // namespace jaxdnn::norm::cuda_impl
