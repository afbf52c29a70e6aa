// CUDA column path (A > 1, T == 1; batch and group norm, channels-last): per p, x is an
// (A, C*K) matrix whose column j belongs to group c = j / K.
//
// Block = (TY row groups) x (TX threads across columns), TX a power of two <= 32; each thread
// owns VEC consecutive columns (one 16-byte vector when rows are vector-aligned), so a warp reads
// whole contiguous row segments. Block b covers one row slice (rps rows) of one column tile
// (TX*VEC columns) of one p; thread (tx, ty) walks rows a0+ty, a0+ty+TY, ... with several rows
// of loads in flight (pipelined, cuda_kernels.cuh).
//   stats  batched Welford per column on x - shift (shift = the slice's first row), row groups
//          tree-merged with Chan's update; the slice's (mean, M2) go to the double workspace
//          (column_stats_rows(s) rows per slice, at least norm.h's rows_per_slice). Traffic:
//          read x.
//   apply  y = (x - mean)*(rstd*scale) + bias with per-column coefficients in registers. A
//          flat grid of apply_rows-row slices (float32, C = 64: 16 x 16 threads, 4 rows each),
//          each block loading its coefficients once. A single wave of long-lived blocks
//          (~800 bytes per thread) measured 3-12% slower on the H200 (batch_norm_inference
//          NHWC float32: 2.90 -> 3.24 TB/s with the flat grid). Reverse block order, so that
//          after the stats pass the first reads hit what it left in L2. For 4- and 8-byte types
//          with vector rows, one pack per thread instead (column_flat_apply_kernel), its
//          coefficients recomputed per pack. Traffic: read x, write y.
//   grads  per-column sums of dy and dy*(x - mean) over the slice, tree-summed across row
//          groups. In inference dx = scale*rstd*dy is written on the way (it needs no sums).
//          Traffic: read x, dy (and write dx in inference).
//   dx     training: dx = scale*rstd*dy + (x - mean)*c1 + c2, on apply's grid.
//          Traffic: read x, dy, write dx.
//   epilogue (norm.h Epilogue) in apply, the flat apply and the fused kernel: + residual, ReLU
//          (traffic + read residual); in grads and dx: dy masked where the recomputed z <= 0
//          (+ read residual), dx writing the masked dy as d(residual) (+ write).
//   fused  the single-pass training forward (cuda_kernels.cuh): one kFusedThreads block per row
//          slice of each (p, tile), as many slices as blocks fit; the slice's last rows are
//          stashed in shared memory. Per block: phase 1 as stats, phase 3 as apply over the
//          stash and then the streamed rows in reverse, copied (cp.async) into a ring of the
//          thread's own stash slots, 15 rows in flight per thread.
//          Traffic: read x, write y, re-read the rows that were neither stashed nor L2-resident.

#include "cc/common/env.h"
#include "cc/norm/cuda_kernels.cuh"

namespace jaxdnn::norm::cuda_impl {
namespace {

constexpr int kThreads = 256;
constexpr int kLoadsInFlight = 4;  // 16-byte loads each thread issues before using them

struct ColumnGrid {
  int tx, ty;  // threads across columns (a power of two <= 32), row groups (threads / tx)
  int64_t tiles, rps, slices, blocks;  // column tiles; rows per slice, slices per p
};

// This thread's place: batch p, slice s (rows [a0, a1)), tile columns [j0, j0 + w), first
// column j; its rows are row(i) = a0 + ty + i*TY for i in [0, rows).
struct ColumnThread {
  int64_t p, s, a0, a1, j0, w, j, rows;
  int tx, ty, TY;
  bool active;

  __device__ ColumnThread(const Shape& sh, const ColumnGrid& g, int vec, bool reverse) {
    const int64_t b = reverse ? g.blocks - 1 - blockIdx.x : blockIdx.x;
    const int64_t tile = b % g.tiles;
    s = b / g.tiles % g.slices;
    p = b / (g.tiles * g.slices);
    tx = int(threadIdx.x) % g.tx;
    ty = int(threadIdx.x) / g.tx;
    TY = g.ty;
    a0 = s * g.rps;
    a1 = a0 + g.rps < sh.A ? a0 + g.rps : sh.A;
    j0 = tile * g.tx * vec;
    w = sh.CK() - j0 < g.tx * vec ? sh.CK() - j0 : g.tx * vec;
    j = j0 + int64_t(tx) * vec;
    active = j < sh.CK();
    rows = active && a1 - a0 > ty ? (a1 - a0 - ty + TY - 1) / TY : 0;
  }
  __device__ __forceinline__ int64_t row(int64_t i) const { return a0 + ty + i * TY; }
};

// Calls f(row offset, x pack, dy pack, residual pack) for this thread's rows, a few rows of
// loads in flight (the packs are converted where they are used, so that only one row's values
// are live as accumulators). x, dy and res point at this thread's first column in row 0;
// kInputs == 1 reads x alone, 2 x and dy; res, when not null (the epilogue's residual), is read
// too.
template <typename D, int VEC, int kInputs, typename F>
__device__ __forceinline__ void for_rows(const ColumnThread& t, const D* x, const D* dy,
                                         const D* res, int64_t ld, F f) {
  using Pk = PackOf<D, VEC>;
  struct Rows {
    Pk x, dy, res;
  };
  pipelined<kLoadsInFlight / kInputs, false>(
      0, t.rows,
      [&](int64_t i) {
        Rows r{};
        r.x = Pk::load_ro(x + t.row(i) * ld);
        if constexpr (kInputs == 2) r.dy = Pk::load_ro(dy + t.row(i) * ld);
        if (res) r.res = Pk::load_ro(res + t.row(i) * ld);
        return r;
      },
      [&](int64_t i, const Rows& r) { f(t.row(i) * ld, r.x, r.dy, r.res); });
}

// The unpacked residual of a pack (zeros without one: finish_pack and mask_pack skip it).
template <typename Acc, int VEC, typename Pk>
__device__ __forceinline__ void unpack_residual(const Pk& p, bool residual, Acc (&r)[VEC]) {
  if (residual) {
    p.unpack(r);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) r[e] = Acc(0);
  }
}

// Adds `count` rows of VEC columns (rows v[0..count)) to the per-column moments of x - shift,
// n values each: a batched Welford update (fold_deviations), one reciprocal per batch.
template <typename D, int VEC, int U>
__device__ __forceinline__ void add_rows(const PackOf<D, VEC> (&v)[U], int count,
                                         const A<D> (&shift)[VEC], A<D>& n, A<D> (&mean)[VEC],
                                         A<D> (&m2)[VEC]) {
  using Acc = A<D>;
  Acc s1[VEC] = {}, s2[VEC] = {};
  sum_deviations<D, VEC, U>(v, count, shift, mean, s1, s2);
  n += Acc(count);
  const Acc r = Acc(1) / n;
#pragma unroll
  for (int e = 0; e < VEC; ++e) fold_deviations(mean[e], m2[e], s1[e], s2[e], r);
}

// Tree-merges the per-column moments of the TY row groups of a block (thread = ty*TX + tx, TY
// a power of two) with Chan's update in a fixed order; row group 0 ends with the block's.
// Every thread of the block calls it (it synchronises); scratch holds (1 + 2*VEC)*blockDim.x.
template <typename Acc, int VEC>
__device__ __forceinline__ void merge_row_groups(const ColumnThread& t, Acc& n, Acc (&mean)[VEC],
                                                 Acc (&m2)[VEC], int TX, Acc* scratch) {
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int half = t.TY; half > 1; half /= 2) {
    scratch[tid] = n;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      scratch[(1 + e) * nt + tid] = mean[e];
      scratch[(1 + VEC + e) * nt + tid] = m2[e];
    }
    __syncthreads();
    if (t.ty < half / 2) {
      const int o = tid + (half / 2) * TX;
      const Acc no = scratch[o];
      Moments<Acc> m{n, 0, 0};
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        m = {n, mean[e], m2[e]};
        m.merge(no, scratch[(1 + e) * nt + o], scratch[(1 + VEC + e) * nt + o]);
        mean[e] = m.mean;
        m2[e] = m.m2;
      }
      n = m.n;
    }
    __syncthreads();
  }
}

// Calls f(e, group, affine index) for the VEC columns j + e of batch p (one division by K and
// one by Pq for all of them; Div: cuda::FastDiv where the indices fit 32 bits, cuda::PlainDiv).
template <int VEC, typename Div, typename F>
__device__ __forceinline__ void for_columns(const Shape& s, int64_t p, int64_t j, const Div& K,
                                            const Div& Pq, F f) {
  int64_t c = K.div(j), k = j - c * s.K;
  const int64_t affine = Pq.div(p) * s.CK() + j;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    f(e, p * s.C + c, affine + e);
    if (++k == s.K) {
      k = 0;
      ++c;
    }
  }
}
template <int VEC, typename F>
__device__ __forceinline__ void for_columns(const Shape& s, const ColumnThread& t, F f) {
  for_columns<VEC>(s, t.p, t.j, cuda::PlainDiv(s.K), cuda::PlainDiv(s.Pq()), f);
}

// Per-column mean and rstd*scale of the VEC columns j + e of batch p (from the statistics
// outputs, or inputs in inference), and the bias.
template <typename D, int VEC, typename Div>
__device__ __forceinline__ void column_coefs(const Fwd<D>& f, int64_t p, int64_t j, const Div& K,
                                             const Div& Pq, A<D> (&mu)[VEC], A<D> (&gg)[VEC],
                                             A<D> (&bb)[VEC]) {
  const int64_t affine = Pq.div(p) * f.s.CK() + j;  // (16-byte aligned on the vector path)
  load_params(f.scale + affine, gg);
  load_params(f.bias + affine, bb);
  for_columns<VEC>(f.s, p, j, K, Pq, [&](int e, int64_t grp, int64_t) {
    mu[e] = f.mean[grp];
    gg[e] *= rstd_of<D>(f.var[grp], f.eps);
  });
}
template <typename D, int VEC>
__device__ __forceinline__ void column_coefs(const Fwd<D>& f, const ColumnThread& t,
                                             A<D> (&mu)[VEC], A<D> (&gg)[VEC], A<D> (&bb)[VEC]) {
  column_coefs<D, VEC>(f, t.p, t.j, cuda::PlainDiv(f.s.K), cuda::PlainDiv(f.s.Pq()), mu, gg, bb);
}

// The slice's partial moments: the block's row groups tree-merged, then written by row group 0
// to the workspace at (p, slice, column); CK = s.CK(). Every thread of the block calls it (it
// synchronises).
template <typename D, int VEC>
__device__ __forceinline__ void store_block_moments(const Fwd<D>& f, const ColumnGrid& g,
                                                    const ColumnThread& t, int64_t CK, A<D>& n,
                                                    A<D> (&mean)[VEC], A<D> (&m2)[VEC],
                                                    const A<D> (&shift)[VEC], A<D>* scratch) {
  merge_row_groups<A<D>, VEC>(t, n, mean, m2, g.tx, scratch);
  if (t.ty == 0 && t.active) {
    const int64_t off = (t.p * g.slices + t.s) * CK + t.j;
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      store_partial(f.ws0, f.ws1, off + e, shift[e], n, mean[e], m2[e], f.centered);
  }
}

// Blocks of the stats kernel that fit an SM by registers: 4 (64 registers) for 32- and 64-bit
// types, 3 (85) for 16-bit ones, whose threads hold twice the columns.
template <typename D>
constexpr int stats_blocks_per_sm() {
  return sizeof(D) == 2 ? 3 : 4;
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads, stats_blocks_per_sm<D>())
    column_stats_kernel(Fwd<D> f, ColumnGrid g) {
  using Acc = A<D>;
  cuda::await_prior_grids();
  __shared__ Acc scratch[(1 + 2 * VEC) * kThreads];
  const Shape& s = f.s;
  const int64_t CK = s.CK();
  const ColumnThread t(s, g, VEC, false);
  const D* col = f.x + t.p * s.A * CK + t.j;
  Acc shift[VEC] = {}, mean[VEC] = {}, m2[VEC] = {}, n = 0;
  if (t.active) {
    if (f.centered) load_vals<D, VEC>(col + t.a0 * CK, shift);
    batched<kLoadsInFlight, false>(
        0, t.rows, [&](int64_t i) { return PackOf<D, VEC>::load_ro(col + t.row(i) * CK); },
        [&](int64_t, const auto& v, int count) {
          add_rows<D, VEC, kLoadsInFlight>(v, count, shift, n, mean, m2);
        });
  }
  store_block_moments<D, VEC>(f, g, t, CK, n, mean, m2, shift, scratch);
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads, 4) column_apply_kernel(Fwd<D> f, ColumnGrid g) {
  using Acc = A<D>;
  cuda::await_prior_grids();
  const Shape& s = f.s;
  const int64_t CK = s.CK();
  const ColumnThread t(s, g, VEC, true);
  if (!t.active) return;
  Acc mu[VEC], gg[VEC], bb[VEC];
  column_coefs<D, VEC>(f, t, mu, gg, bb);
  const int64_t base = t.p * s.A * CK + t.j;
  const bool residual = f.residual != nullptr;
  for_rows<D, VEC, 1>(t, f.x + base, nullptr, residual ? f.residual + base : nullptr, CK,
                      [&](int64_t off, const auto& v, const auto&, const auto& rp) {
                        Acc out[VEC], r[VEC];
                        v.unpack(out);
                        unpack_residual<Acc, VEC>(rp, residual, r);
#pragma unroll
                        for (int e = 0; e < VEC; ++e) out[e] = (out[e] - mu[e]) * gg[e] + bb[e];
                        finish_pack<Acc, VEC>(r, residual, f.relu, out);
                        store_vals<D, VEC>(f.y + base + off, out);
                      });
}

// The flat apply's packs (VEC values each, packs < 2^31) and divisors: packs per row (CK / VEC),
// rows per batch p (A), batches per affine row (Pq), columns per group (K).
struct FlatColumns {
  unsigned packs;
  cuda::FastDiv row_packs, rows, Pq, K;
};

// The apply as a flat grid (vector path, 4- and 8-byte types): one pack per thread in blocks of
// kFlatThreads, blocks in reverse (so that the first ones read what the statistics pass left in
// L2); the pack's VEC columns' coefficients from the statistics and parameters (a few KB,
// L1-resident), its column and batch by multiply-high divisions. H200, float32 batch_norm NHWC
// 64x112x112x64 (kernel trace, docs/perf/norm.md): 97.8 us in 128-thread blocks (XLA's
// elementwise fusion: 96.6, also 128), 100.0 in 256-thread ones, the 64-row column_apply 100.2;
// group_norm NHWC 32x56x56x256: 50.9, 51.6 and ~53 (XLA 49.6). In bfloat16 the per-pack
// coefficients of 8 columns cost more than they save (batch_norm_inference 68.3 us flat against
// column_apply's 56.7), so 16-bit types keep column_apply.
constexpr int kFlatThreads = 128;
template <typename D, int VEC>
__global__ void __launch_bounds__(kFlatThreads)
    column_flat_apply_kernel(Fwd<D> f, FlatColumns fc) {
  using Acc = A<D>;
  cuda::await_prior_grids();
  const int i = int((gridDim.x - 1 - blockIdx.x) * unsigned(kFlatThreads) + threadIdx.x);
  if (unsigned(i) >= fc.packs) return;
  const int row = fc.row_packs.div(i);  // p*A + a
  const int p = fc.rows.div(row), j = (i - row * int(fc.row_packs.d)) * VEC;
  Acc mu[VEC], gg[VEC], bb[VEC];
  column_coefs<D, VEC>(f, p, j, fc.K, fc.Pq, mu, gg, bb);
  Acc out[VEC], r[VEC] = {};
  PackOf<D, VEC>::load_ro(f.x + int64_t(i) * VEC).unpack(out);
  const bool residual = f.residual != nullptr;
  if (residual) PackOf<D, VEC>::load_ro(f.residual + int64_t(i) * VEC).unpack(r);
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = (out[e] - mu[e]) * gg[e] + bb[e];
  finish_pack<Acc, VEC>(r, residual, f.relu, out);
  store_vals<D, VEC>(f.y + int64_t(i) * VEC, out);
}

// The backward's per-column coefficients of the VEC columns from t.j: mean, rstd, gz =
// scale*rstd (as column_coefs forms it), and the bias (bz, read only for the epilogue's ReLU).
template <typename D, int VEC>
__device__ __forceinline__ void epilogue_columns(const Bwd<D>& b, const ColumnThread& t,
                                                 A<D> (&mu)[VEC], A<D> (&rs)[VEC],
                                                 A<D> (&gz)[VEC], A<D> (&bz)[VEC]) {
  for_columns<VEC>(b.s, t, [&](int e, int64_t grp, int64_t aff) {
    mu[e] = b.mean[grp];
    rs[e] = rstd_of<D>(b.var[grp], b.eps);
    gz[e] = b.scale[aff];
    gz[e] *= rs[e];
    bz[e] = b.relu ? b.bias[aff] : A<D>(0);
  });
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) column_grads_kernel(Bwd<D> b, ColumnGrid g) {
  using Acc = A<D>;
  cuda::await_prior_grids();
  __shared__ Acc s1[VEC][kThreads], s2[VEC][kThreads];
  const Shape& s = b.s;
  const int64_t CK = s.CK();
  const ColumnThread t(s, g, VEC, false);
  Acc mu[VEC], rs[VEC], gr[VEC], gz[VEC], bz[VEC], sdy[VEC] = {}, sdyx[VEC] = {};
  if (t.active) {
    epilogue_columns<D, VEC>(b, t, mu, rs, gz, bz);
#pragma unroll
    for (int e = 0; e < VEC; ++e) gr[e] = b.coef_fn.training ? Acc(0) : gz[e];
    const int64_t base = t.p * s.A * CK + t.j;
    const bool residual = b.residual != nullptr;
    for_rows<D, VEC, 2>(t, b.x + base, b.dy + base, residual ? b.residual + base : nullptr, CK,
                        [&](int64_t off, const auto& x, const auto& dy, const auto& rp) {
                          Acc xv[VEC], d[VEC], dx[VEC], r[VEC];
                          x.unpack(xv);
                          dy.unpack(d);
                          if (b.relu) {
                            unpack_residual<Acc, VEC>(rp, residual, r);
                            mask_pack<Acc, VEC>(xv, r, residual, mu, gz, bz, d);
                          }
#pragma unroll
                          for (int e = 0; e < VEC; ++e) {
                            sdy[e] += d[e];
                            sdyx[e] += d[e] * (xv[e] - mu[e]);
                            dx[e] = gr[e] * d[e];
                          }
                          if (!b.coef_fn.training) {  // inference: dx (and d(residual)) here
                            store_vals<D, VEC>(b.dx + base + off, dx);
                            if (b.dres) store_vals<D, VEC>(b.dres + base + off, d);
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
  cuda::await_prior_grids();
  const Shape& s = b.s;
  const int64_t CK = s.CK();
  const ColumnThread t(s, g, VEC, true);
  if (!t.active) return;
  Acc mu[VEC], rs[VEC], gr[VEC], bz[VEC], c1[VEC], c2[VEC];
  epilogue_columns<D, VEC>(b, t, mu, rs, gr, bz);
  for_columns<VEC>(s, t, [&](int e, int64_t grp, int64_t) {
    c1[e] = b.coef[2 * grp];
    c2[e] = b.coef[2 * grp + 1];
  });
  const int64_t base = t.p * s.A * CK + t.j;
  const bool residual = b.residual != nullptr;
  for_rows<D, VEC, 2>(t, b.x + base, b.dy + base, residual ? b.residual + base : nullptr, CK,
                      [&](int64_t off, const auto& x, const auto& dy, const auto& rp) {
                        Acc xv[VEC], d[VEC], out[VEC], r[VEC];
                        x.unpack(xv);
                        dy.unpack(d);
                        if (b.relu) {
                          unpack_residual<Acc, VEC>(rp, residual, r);
                          mask_pack<Acc, VEC>(xv, r, residual, mu, gr, bz, d);
                        }
#pragma unroll
                        for (int e = 0; e < VEC; ++e)
                          out[e] = gr[e] * d[e] + (xv[e] - mu[e]) * c1[e] + c2[e];
                        store_vals<D, VEC>(b.dx + base + off, out);
                        if (b.dres) store_vals<D, VEC>(b.dres + base + off, d);
                      });
}

// Phase 3 of the fused kernel: the streamed rows in flight per thread (+ 1), through a ring of
// its own stash slots. H200, batch_norm NHWC 64x112x112x64 float32 (dev/norm_fwd_bench.cu):
// the fused kernel takes 169-171 us with 16, 171-172 with 8 and 177-179 with the batched
// register loads (pipelined) it replaced; bfloat16 97-99 against 99.
constexpr int kFusedRing = 16;

template <typename D, int VEC>
__global__ void __launch_bounds__(kFusedThreads, 1)
    column_fused_kernel(Fwd<D> f, ColumnGrid g, int64_t keep) {
  using Acc = A<D>;
  using Pk = PackOf<D, VEC>;
  extern __shared__ uint4 stash_words[];
  __shared__ Acc scratch[(1 + 2 * VEC) * kFusedThreads];
  D* const stash = reinterpret_cast<D*>(stash_words);
  const Shape& s = f.s;
  const int64_t CK = s.CK();
  const ColumnThread t(s, g, VEC, false);
  JAXDNN_NORM_PHASE(0);
  // Rows [kept, a1) of the slice stay in shared memory, row-major over the tile's w columns:
  // this thread's rows from index `split` on.
  const int64_t kept = t.a1 - min(t.a1 - t.a0, keep / t.w);
  const int64_t ahead = kept - t.a0 - t.ty;
  const int64_t split = ahead <= 0 ? 0 : min(t.rows, (ahead + t.TY - 1) / t.TY);
  const D* x = f.x + t.p * s.A * CK + t.j;  // this thread's column in row 0 of batch p
  auto global = [&](int64_t i) { return x + t.row(i) * CK; };
  auto local = [&](int64_t i) { return stash + (t.row(i) - kept) * t.w + (t.j - t.j0); };
  for (int64_t i = split; i < t.rows; ++i) cuda::cp_async16(local(i), global(i));

  // Phase 1: batched Welford per column over the streamed rows, then (copies landed) the
  // stashed ones.
  Acc shift[VEC] = {}, mean[VEC] = {}, m2[VEC] = {}, n = 0;
  if (t.active) {
    if (f.centered) load_vals<D, VEC>(x + t.a0 * CK, shift);
    auto add = [&](int64_t, const auto& v, int count) {
      add_rows<D, VEC, kFusedInFlight>(v, count, shift, n, mean, m2);
    };
    batched<kFusedInFlight, false>(
        0, split, [&](int64_t i) { return Pk::load_ro(global(i)); }, add);
    cuda::cp_async_wait_all();
    batched<kFusedInFlight, false>(split, t.rows, [&](int64_t i) { return Pk::load(local(i)); },
                                   add);
  }
  store_block_moments<D, VEC>(f, g, t, CK, n, mean, m2, shift, scratch);
  JAXDNN_NORM_PHASE(1);
  grid_sync();

  // Phase 2: group (p, c) merges the (slice, k) partials of its K columns.
  merge_groups(f, g.slices * s.K, SliceParts<cuda::PlainDiv>(s, g.slices, g.rps));
  grid_sync();
  JAXDNN_NORM_PHASE(2);

  // Phase 3: y from the stash, then from the streamed rows, latest-read first.
  if (!t.active) return;
  Acc mu[VEC], gg[VEC], bb[VEC];
  column_coefs<D, VEC>(f, t, mu, gg, bb);
  D* const y = f.y + t.p * s.A * CK + t.j;
  const D* const res = f.residual ? f.residual + t.p * s.A * CK + t.j : nullptr;
  auto apply = [&](int64_t i, const Pk& v) {
    Acc out[VEC], r[VEC] = {};
    v.unpack(out);
    if (res) Pk::load_ro(res + t.row(i) * CK).unpack(r);  // (the epilogue's residual)
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = (out[e] - mu[e]) * gg[e] + bb[e];
    finish_pack<Acc, VEC>(r, res != nullptr, f.relu, out);
    store_vals<D, VEC>(y + t.row(i) * CK, out);
  };
  pipelined<kFusedInFlight, true>(split, t.rows, [&](int64_t i) { return Pk::load(local(i)); },
                                  apply);
  if (t.rows - split >= kFusedRing) {  // through the thread's stash slots, done with
    ring_stream<kFusedRing, Pk>(
        split, [&](int64_t q) { return global(split - 1 - q); },
        [&](int k) { return local(split + k); },
        [&](int64_t q, const Pk& v) { apply(split - 1 - q, v); });
  } else {
    pipelined<kFusedInFlight, true>(0, split,
                                    [&](int64_t i) { return Pk::load_stream(global(i)); }, apply);
  }
  JAXDNN_NORM_PHASE(3);
}

// The grid of `threads`-thread blocks over slices of `rps` rows.
ColumnGrid column_grid(const Shape& s, int vec, int threads, int64_t rps) {
  ColumnGrid g;
  const int64_t vecs = (s.CK() + vec - 1) / vec;
  g.tx = 1;
  while (g.tx < 32 && g.tx < vecs) g.tx *= 2;
  g.ty = threads / g.tx;
  g.tiles = (vecs + g.tx - 1) / g.tx;
  g.rps = std::max<int64_t>(1, rps);
  g.slices = (s.A + g.rps - 1) / g.rps;
  g.blocks = s.P * g.slices * g.tiles;
  return g;
}

// Rows per slice when `blocks` blocks share the (p, column tile)s of s: each (p, tile) its share
// of them, never fewer rows than rows_per_slice (the workspace's slices); 0 when there are fewer
// blocks than (p, tile)s.
int64_t shared_rows(const Shape& s, int vec, int64_t blocks) {
  const int64_t per_p = blocks / (s.P * column_grid(s, vec, kThreads, 1).tiles);
  return per_p == 0 ? 0 : std::max(rows_per_slice(s), (s.A + per_p - 1) / per_p);
}

// The fused kernel's grid: as many row slices per (p, column tile) as `blocks` resident blocks
// allow; no blocks when there are fewer than (p, tile)s.
ColumnGrid fused_grid(const Shape& s, int vec, int64_t blocks) {
  const int64_t rps = shared_rows(s, vec, blocks);
  return rps == 0 ? ColumnGrid{} : column_grid(s, vec, kFusedThreads, rps);
}

// Rows per block of the elementwise passes (apply, dx), by element size E: 64 rows of float32
// (C = 64: 16 x 16 threads, 4 rows of 16 bytes each, 16 KB per block). 16-bit types take 128,
// so that a thread still has 4 loads in flight and a block moves the same bytes: with 64 rows,
// bfloat16 batch_norm_inference ran at 1.7 TB/s against float32's 2.9 (docs/perf/norm.md). float32
// with 16, 32, 128 or 256 rows: 274, 148, 103 and 106 us against 64's 100 (batch_norm_inference
// NHWC 64x112x112x64, kernel trace): fewer rows load the coefficients for fewer
// packs, more rows issue their loads in more batches of kLoadsInFlight.
template <typename E>
constexpr int64_t apply_rows() {
  return sizeof(E) == 2 ? 128 : 64;
}

// Launches `vector` (kernel<D, 16-byte VEC>) when every row of the buffers starts 16-byte
// aligned, else `scalar` (kernel<D, 1>), over slices of rps rows.
template <typename View, typename Kernel>
Status launch_columns(const View& v, bool aligned, Kernel scalar, Kernel vector, int vec_n,
                      int64_t rps, const char* name, cudaStream_t st) {
  const bool vec = aligned && v.s.CK() % vec_n == 0;
  const ColumnGrid g = column_grid(v.s, vec ? vec_n : 1, kThreads, rps);
  return cuda::launch(name, vec ? vector : scalar, unsigned(g.blocks), kThreads, 0, st, v, g);
}

}  // namespace

// Rows per slice of the statistics pass: about three blocks per SM (one wave of the 16-bit
// kernel's), long-lived blocks whose tree merge and first loads are paid once per 1-2K rows. H200,
// batch_norm NHWC 64x112x112x64 float32 (docs/perf/norm.md): 2048-row slices 51.8 us, the
// partial passes' 512 (rows_per_slice) 57.3.
int64_t column_stats_rows(const Shape& s, int vec) {
  const int64_t rps = shared_rows(s, vec, 3 * int64_t(cuda::sm_count()));
  return rps == 0 ? rows_per_slice(s) : rps;
}

template <typename D>
Status column_stats(const Fwd<D>& f, cudaStream_t st) {
  return launch_columns(f, cuda::vec_aligned(f.x), column_stats_kernel<D, 1>,
                        column_stats_kernel<D, Vec<D>::kN>, Vec<D>::kN,
                        column_stats_rows(f.s, Vec<D>::kN), "norm column_stats_kernel", st);
}

template <typename D>
Support column_flat_support(const Shape& s) {
  constexpr int N = Vec<D>::kN;
  if (sizeof(D) < 4) return Support::No("the flat apply is for 4- and 8-byte types");
  if (s.CK() % N != 0)
    return Support::No("rows of C*K = " + std::to_string(s.CK()) + " values are not whole " +
                       "16-byte vectors");
  if (s.elems() / N >= (int64_t(1) << 31)) return Support::No("more than 2^31 vectors");
  return Support::Yes();
}

template <typename D>
Status column_flat_apply(const Fwd<D>& f, cudaStream_t st) {
  constexpr int N = Vec<D>::kN;
  const Shape& s = f.s;
  if (!fwd_aligned(f))
    return Status::Error("norm column flat apply: x, y and the residual must be 16-byte aligned");
  if constexpr (sizeof(D) >= 4) {
    const int64_t packs = s.elems() / N;
    const FlatColumns fc{unsigned(packs), cuda::FastDiv(uint32_t(s.CK() / N)),
                         cuda::FastDiv(uint32_t(s.A)), cuda::FastDiv(uint32_t(s.Pq())),
                         cuda::FastDiv(uint32_t(s.K))};
    return cuda::launch("norm column_flat_apply_kernel", column_flat_apply_kernel<D, N>,
                        unsigned((packs + kFlatThreads - 1) / kFlatThreads), kFlatThreads, 0, st,
                        f, fc);
  }
  return Status::Error("norm column flat apply: 16-bit types take the tiled apply");
}

template <typename D>
Status column_apply(const Fwd<D>& f, cudaStream_t st) {
  return launch_columns(f, fwd_aligned(f), column_apply_kernel<D, 1>,
                        column_apply_kernel<D, Vec<D>::kN>, Vec<D>::kN, apply_rows<D>(),
                        "norm column_apply_kernel", st);
}

template <typename D>
Status column_grads(const Bwd<D>& b, cudaStream_t st) {
  return launch_columns(b, bwd_aligned(b), column_grads_kernel<D, 1>,
                        column_grads_kernel<D, Vec<D>::kN>, Vec<D>::kN, rows_per_slice(b.s),
                        "norm column_grads_kernel", st);
}

template <typename D>
Status column_dx(const Bwd<D>& b, cudaStream_t st) {
  return launch_columns(b, bwd_aligned(b), column_dx_kernel<D, 1>,
                        column_dx_kernel<D, Vec<D>::kN>, Vec<D>::kN, apply_rows<D>(),
                        "norm column_dx_kernel", st);
}

template <typename D>
Support column_fused_support(const Shape& s) {
  constexpr int N = Vec<D>::kN;
  if (s.CK() % N != 0)
    return Support::No("rows of C*K = " + std::to_string(s.CK()) + " values are not whole " +
                       "16-byte vectors");
  FusedCapacity cap;
  if (Status st = fused_capacity<column_fused_kernel<D, N>>(&cap); !st.ok())
    return Support::No(st.message);
  if (fused_grid(s, N, cap.blocks).blocks == 0)
    return Support::No("more (batch, column tile)s than co-resident blocks (" +
                       std::to_string(cap.blocks) + ")");
  return Support::Yes();
}

template <typename D>
Status column_fused(const Fwd<D>& f, cudaStream_t st) {
  constexpr int N = Vec<D>::kN;
  if (!fwd_aligned(f))
    return Status::Error("norm column single pass: x, y and the residual must be 16-byte "
                         "aligned");
  constexpr auto kernel = column_fused_kernel<D, N>;
  FusedCapacity cap;
  Status status = fused_capacity<kernel>(&cap);
  if (!status.ok()) return status;
  const ColumnGrid g = fused_grid(f.s, N, cap.blocks);
  if (g.blocks == 0) return Status::Error("norm column single pass: the grid does not fit");
  return launch_cooperative(kernel, g.blocks, cap.stash_bytes, st, "norm column_fused_kernel", f,
                            g, cap.stash_bytes / int64_t(sizeof(D)));
}

JAXDNN_NORM_CUDA_INSTANTIATE(column_stats, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(column_apply, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(column_grads, Bwd);
JAXDNN_NORM_CUDA_INSTANTIATE(column_dx, Bwd);
JAXDNN_NORM_CUDA_INSTANTIATE(column_flat_apply, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(column_fused, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE_SUPPORT(column_flat_support);
JAXDNN_NORM_CUDA_INSTANTIATE_SUPPORT(column_fused_support);

}  // namespace jaxdnn::norm::cuda_impl
