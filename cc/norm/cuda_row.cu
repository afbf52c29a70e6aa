// CUDA row path (A == 1, T == 1; layer and RMS norm): every group is one contiguous row of K
// values with its own affine row (q, c).
//
// Cached kernels keep the row in registers, so x is read from memory once:
//   forward   the shared row mapping of cc/common/cuda_rows.h: a group of G threads per row (a
//             warp, four rows per 128-thread block, or a block of 64 .. 512 threads), each
//             thread holding K packs of the row in the storage type; a flat grid, one group
//             per row (a 4096-wide row: 64 bfloat16 or 128 float32 threads x 8 packs, 32
//             registers of row data).
//             mean = shift + sum(x - shift)/K, var = sum((x - mean)^2)/K (exact two-pass over
//             registers, shift = x[0]; a row whose mean comes out non-finite, inf or NaN in it,
//             takes the plain sum(x)/K, jnp.mean's +-inf where x - shift made inf - inf = NaN),
//             y = (x - mean)*rstd*scale + bias; scale and bias are read per row from L1/L2
//             (16-byte loads).
//             Traffic per row: read x, write y (K values each).
//   backward  block (RT, RPB): RT threads per row (a warp when RT == 32, with RPB = 4 rows per
//             block; otherwise the whole block, RPB = 1); each thread holds NV vectors of VEC
//             values, vector i at (i*RT + thread)*VEC, as many as 16 values (a 4096-wide row:
//             256 threads x 2 bfloat16 or 4 float32 vectors; row_config; 32 in 16-bit rows
//             longer than 8192). One wave of blocks; block (slice sb, c, q) walks the rows of
//             its slice, each thread copying its packs of the next rows' x and dy into its own
//             slots of a 2-4 stage ring in shared memory (cp.async: bytes in flight without
//             registers; the thread's scale values after it), then per row: the two row sums
//             (one reduction), dx, and per-thread d(scale), d(bias) accumulators for its
//             columns, combined across row groups and written once per block to the
//             (Q, S_b, C, K) partial planes.
//             Traffic per row: read x, dy, write dx; per block: write 2K partials.
// Rows too long for registers take streaming kernels (values re-read from L2): forward, a block
// per row, Welford per thread + block merge (a non-finite mean: plain two passes over the row,
// as in the cached kernel), then y; backward, one wave of blocks walking rows,
// the sums, then dx with the d(scale), d(bias) partials summed in shared memory (in the block's
// workspace rows beyond kStreamAccBytes).

#include <algorithm>
#include <type_traits>

#include "cc/common/cuda_rows.h"
#include "cc/norm/cuda_kernels.cuh"

namespace jaxdnn::norm::cuda_impl {
namespace {

constexpr int kFwdStreamThreads = 256;

template <typename D, int G, int NP, bool kVector>
__global__ void __launch_bounds__(cuda::row_block_threads<G>()) row_fwd_kernel(Fwd<D> f) {
  using Acc = A<D>;
  using Slice = cuda::RowSlice<D, NP, kVector>;
  constexpr int kN = Slice::kN, kRowsPerBlock = cuda::rows_per_block<G>();
  __shared__ Acc scratch[32];
  cuda::await_prior_grids();
  const int64_t R = f.s.groups(), K = f.s.K;
  const cuda::RowMap<G, NP, kN> map{int(threadIdx.x % G), int(K)};
  const auto load = [&](int64_t r) {
    Slice x;
    x.load(f.x + r * K, map);
    return x;
  };
  const auto body = [&](int64_t r, Slice& x) {
    Acc mean, var;
    if (f.training) {
      mean = 0;
      if (f.centered) {
        const Acc shift = to_acc(f.x[r * K]);
        const Acc s = map.fold(Acc(0), [&](Acc s, int k, int e) { return s + (x(k, e) - shift); });
        mean = shift + cuda::group_reduce<G>(s, cuda::SumOp{}, Acc(0), scratch) / Acc(K);
        if (!isfinite(mean)) {  // (the same for every thread of the row)
          const Acc t = map.fold(Acc(0), [&](Acc t, int k, int e) { return t + x(k, e); });
          mean = cuda::group_reduce<G>(t, cuda::SumOp{}, Acc(0), scratch) / Acc(K);
        }
        x.fence();
      }
      const Acc q = map.fold(Acc(0), [&](Acc q, int k, int e) {
        return q + (x(k, e) - mean) * (x(k, e) - mean);
      });
      var = cuda::group_reduce<G>(q, cuda::SumOp{}, Acc(0), scratch) / Acc(K);
      x.fence();
      if (map.lane == 0) {
        f.mean[r] = mean;
        f.var[r] = var;
      }
    } else {
      mean = f.mean[r];
      var = f.var[r];
    }
    const Acc rs = rstd_of<D>(var, f.eps);
    const int64_t p = r / f.s.C, affine = (p / f.s.Pq() * f.s.C + r % f.s.C) * K;
    map.for_packs([&](int k, int c) {
      Acc g[kN], b[kN], y[kN];
      load_params(f.scale + affine + c, g);
      load_params(f.bias + affine + c, b);
#pragma unroll
      for (int e = 0; e < kN; ++e) y[e] = (x(k, e) - mean) * rs * g[e] + b[e];
      cuda::store_acc<D, kVector>(f.y + r * K + c, y);
    });
  };
  cuda::for_each_row(int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / G,
                     int64_t(gridDim.x) * kRowsPerBlock, R, load, body);
}

// Block -> (slice sb, group column c, affine row q) of the backward grid.
struct BwdBlock {
  int64_t sb, c, q, p0, p1;  // rows [p0, p1)
  __device__ BwdBlock(const Shape& s, int64_t slices) {
    const int64_t b = blockIdx.x;
    sb = b % slices;
    c = b / slices % s.C;
    q = b / (slices * s.C);
    p0 = q * s.Pq() + sb * s.Pq() / slices;
    p1 = q * s.Pq() + (sb + 1) * s.Pq() / slices;
  }
};

// Row sums of two values at once: over a warp (RT == 32), else over the block with one barrier.
// `scratch` holds 2 x 32 values; callers alternate between two of them from row to row, so that
// the barrier of one row's sums also orders the previous row's reads of the other before its
// next writes.
template <typename Acc>
__device__ __forceinline__ void row_sum2(Acc& a, Acc& b, Acc (*scratch)[32]) {
  a = cuda::warp_reduce(a, cuda::SumOp{});
  b = cuda::warp_reduce(b, cuda::SumOp{});
  if (blockDim.x == 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) {
    scratch[0][warp] = a;
    scratch[1][warp] = b;
  }
  __syncthreads();
  a = cuda::warp_reduce(lane < warps ? scratch[0][lane] : Acc(0), cuda::SumOp{});
  b = cuda::warp_reduce(lane < warps ? scratch[1][lane] : Acc(0), cuda::SumOp{});
}

// Copies VEC values at src into a thread's ring slot: 16-, 8- and 4-byte units with cp.async (in
// flight while the thread computes); a single 16-bit value, which cp.async cannot copy (rows that
// are not vector-aligned), through a register, so those rows are not prefetched.
template <typename D, int VEC>
__device__ __forceinline__ void ring_copy(D* dst, const D* src, bool pred) {
  constexpr int kBytes = VEC * int(sizeof(D));
  if constexpr (kBytes == 16) cuda::cp_async16(dst, src, pred);
  else if constexpr (kBytes == 8) cuda::cp_async8(dst, src, pred);
  else if constexpr (kBytes == 4) cuda::cp_async4(dst, src, pred);
  else if (pred) *dst = *src;
}

// Waits until the row `stages - 1` commits back is in (the ring's oldest pending row).
__device__ __forceinline__ void ring_wait(int stages) {
  if (stages == 2) cuda::cp_async_wait<1>();
  else if (stages == 3) cuda::cp_async_wait<2>();
  else cuda::cp_async_wait<3>();
}

// kMaxThreads: the block-size bound, 256 or 512 (rows that need more threads), either way with
// up to 128 registers a thread (a 16-value thread keeps 32 accumulators, a 32-value one 64):
// 256-thread blocks two to an SM, 512-thread ones one. At three 256-thread blocks per SM, 80
// registers, it spilled and took 360 us instead of 243 on a 32768x4096 bfloat16 layer norm; two
// 512-thread blocks, 64 registers, took 149 us on a 4000x8192 one (1.32 TB/s; docs/perf/norm.md).
template <typename D, int VEC, int NV, int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads, 512 / kMaxThreads)
    row_bwd_kernel(Bwd<D> b, int64_t slices, int stages) {
  using Acc = A<D>;
  constexpr int E = NV * VEC;
  // (stage, x|dy, pack, thread) slots of VEC values, then (pack, unit, thread) scale units
  extern __shared__ uint4 ring_words[];
  __shared__ Acc scratch[2][2][32];  // (row parity, sum, warp)
  cuda::await_prior_grids();
  const int tid = threadIdx.x, RT = blockDim.x, RPB = blockDim.y;
  const int threads = RT * RPB, lin = threadIdx.y * RT + tid;
  const Shape& s = b.s;
  const int K = int(s.K);  // a cached row is at most 512 x 32 values
  const Acc inv_k = Acc(1) / Acc(K);
  const BwdBlock blk(s, slices);
  // This thread's packs: pack i at column k0 + i * pitch of every row.
  const int k0 = tid * VEC, pitch = RT * VEC;
  const Acc* scale = b.scale + (blk.q * s.C + blk.c) * s.K + k0;  // the block's affine row
  // The ring: `stages` slots of 2 * NV packs per thread, a stage after another; pack i of x of a
  // stage at i * threads * VEC from this thread's base, of dy at (NV + i) * threads * VEC.
  const int stage_len = 2 * NV * threads * VEC, ring_len = stages * stage_len;
  D* const ring = reinterpret_cast<D*>(ring_words) + lin * VEC;
  const auto next = [&](int at) { return at + stage_len == ring_len ? 0 : at + stage_len; };
  // This thread's scale values, copied once into shared memory after the ring (its own slots,
  // so no barrier): unit h (U values) of pack i at unit(i, h), a warp's 16-byte units side by
  // side. Read twice per row from there instead of from L1: on a 32768x4096 bfloat16 layer norm
  // 236 -> 229 us, 8192x16384 273 -> 248 (docs/perf/norm.md).
  constexpr int U = VEC % Vec<Acc>::kN == 0 ? Vec<Acc>::kN : 1, kSub = VEC / U;
  Acc* const sscale =
      reinterpret_cast<Acc*>(reinterpret_cast<D*>(ring_words) + ring_len) + lin * U;
  const auto unit = [&](int i, int h) { return sscale + (i * kSub + h) * threads * U; };
  const auto scale_of = [&](int i, Acc (&g)[VEC]) {
#pragma unroll
    for (int h = 0; h < kSub; ++h) load_params(unit(i, h), part<U>(g, h));
  };
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    if (k0 + i * pitch >= K) continue;
    Acc g[VEC];
    load_params(scale + i * pitch, g);
#pragma unroll
    for (int h = 0; h < kSub; ++h) store_params(unit(i, h), part<U>(g, h));
  }
  // This row group's rows: first, first + RPB, ... < p1 (p-indices); j counts them. Row j is
  // row(j) and its values start at element row(j) * K.
  const int64_t first = blk.p0 + threadIdx.y;
  const int rows = first < blk.p1 ? int((blk.p1 - first + RPB - 1) / RPB) : 0;
  const int64_t r0 = first * s.C + blk.c, row_step = int64_t(RPB) * s.C;
  const auto row = [&](int j) { return r0 + j * row_step; };
  const int64_t elem_step = row_step * s.K;
  const D* fx = b.x + r0 * s.K + k0;  // the next row to fetch
  const D* fdy = b.dy + r0 * s.K + k0;
  const auto fetch = [&](int j, int at) {  // row j into the stage at `at` (none past the last)
    if (j < rows) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const bool in = k0 + i * pitch < K;
        ring_copy<D, VEC>(ring + at + i * threads * VEC, fx + i * pitch, in);
        ring_copy<D, VEC>(ring + at + (NV + i) * threads * VEC, fdy + i * pitch, in);
      }
      fx += elem_step;
      fdy += elem_step;
    }
    cuda::cp_async_commit();  // one group per row, empty or not: ring_wait counts them
  };
  int fs = 0;  // the stage of the next row to fetch
  for (int j = 0; j < stages - 1; ++j, fs = next(fs)) fetch(j, fs);
  Acc dg[NV][VEC] = {}, db[NV][VEC] = {};
  // Row j's statistics and their cotangents, loaded a row ahead (in flight with its copies).
  struct RowStats {
    Acc mean, var;
    typename GradCoef<Acc>::Cotangents ct;
  };
  const auto stats_of = [&](int j) {
    if (j >= rows) return RowStats{};
    const int64_t r = row(j);
    return RowStats{b.mean[r], b.var[r], b.coef_fn.cotangents(r)};
  };
  RowStats st_next = stats_of(0);
  D* dx = b.dx + r0 * s.K + k0;
  for (int j = 0, cs = 0; j < rows; ++j, cs = next(cs), fs = next(fs), dx += elem_step) {
    fetch(j + stages - 1, fs);  // into the stage row j - 1 left
    const RowStats st = st_next;
    st_next = stats_of(j + 1);
    const Acc m = st.mean, rs = rstd_of<D>(st.var, b.eps);
    const D* cx = ring + cs;  // row j's x and dy
    const D* cdy = cx + NV * threads * VEC;
    ring_wait(stages);
    Acc sg = 0, sgxc = 0;  // sum(g*dy), sum(g*dy*(x - mean))
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (k0 + i * pitch >= K) continue;
      Acc x[VEC], d[VEC], g[VEC];
      load_vals<D, VEC>(cx + i * threads * VEC, x);
      load_vals<D, VEC>(cdy + i * threads * VEC, d);
      scale_of(i, g);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const Acc gd = g[e] * d[e];
        sg += gd;
        sgxc += gd * (x[e] - m);
      }
    }
    row_sum2(sg, sgxc, scratch[j & 1]);
    Acc c1, c2;
    b.coef_fn(row(j), st.ct, inv_k, rs, sg, sgxc * rs, &c1, &c2, tid == 0);
#pragma unroll
    for (int i = 0; i < NV; ++i) {  // x and dy again from the ring: fewer registers than keeping them
      if (k0 + i * pitch >= K) continue;
      Acc x[VEC], d[VEC], g[VEC], out[VEC];
      load_vals<D, VEC>(cx + i * threads * VEC, x);
      load_vals<D, VEC>(cdy + i * threads * VEC, d);
      scale_of(i, g);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const Acc xc = x[e] - m;
        out[e] = fma(g[e] * d[e], rs, fma(xc, c1, c2));
        dg[i][e] = fma(d[e], xc * rs, dg[i][e]);
        db[i][e] += d[e];
      }
      store_vals<D, VEC>(dx + i * pitch, out);
    }
  }
  // Row groups of one block hold partials of the same columns: add them in row-group order,
  // through the ring's space (part: (dscale|dbias, row group, value, lane)).
  if (RPB > 1) {
    Acc* part = reinterpret_cast<Acc*>(ring_words);
    const auto at = [&](int t, int y, int v) { return ((t * RPB + y) * E + v) * 32 + tid; };
    __syncthreads();  // every row group is done with its ring slots
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        part[at(0, threadIdx.y, i * VEC + e)] = dg[i][e];
        part[at(1, threadIdx.y, i * VEC + e)] = db[i][e];
      }
    __syncthreads();
    if (threadIdx.y != 0) return;
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        for (int y = 1; y < RPB; ++y) {
          dg[i][e] += part[at(0, y, i * VEC + e)];
          db[i][e] += part[at(1, y, i * VEC + e)];
        }
  }
  const int64_t out = ((blk.q * slices + blk.sb) * s.C + blk.c) * s.K + k0;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    if (k0 + i * pitch >= K) continue;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      b.ws0[out + i * pitch + e] = dg[i][e];
      b.ws1[out + i * pitch + e] = db[i][e];
    }
  }
}

// ---- Streaming fallback: rows longer than the register cache ---------------------------------

template <typename D>
__global__ void __launch_bounds__(kFwdStreamThreads) row_fwd_stream_kernel(Fwd<D> f) {
  using Acc = A<D>;
  __shared__ Moments<Acc> sm[kFwdStreamThreads];
  __shared__ Acc scratch[32];
  cuda::await_prior_grids();
  const int tid = threadIdx.x;
  const int64_t K = f.s.K;
  for (int64_t r = blockIdx.x; r < f.s.groups(); r += gridDim.x) {
    const D* x = f.x + r * K;
    Acc mean, var;
    if (f.training) {
      const Acc shift = f.centered ? to_acc(x[0]) : Acc(0);
      Moments<Acc> m{0, 0, 0};
      for (int64_t k = tid; k < K; k += kFwdStreamThreads) {
        const Acc v[1] = {to_acc(x[k]) - shift};
        if (f.centered) add_chunk<Acc, 1>(m, v, 1);
        else m.merge(1, 0, v[0] * v[0]);
      }
      m = merge_group(m, sm, 0, tid, kFwdStreamThreads, 1);
      mean = shift + m.mean;
      var = m.m2 / Acc(K);
      if (!isfinite(mean)) {  // (the same for every thread of the block)
        auto sum = [&](auto term) {
          Acc t = 0;
          for (int64_t k = tid; k < K; k += kFwdStreamThreads) t += term(to_acc(x[k]));
          return cuda::block_reduce(t, cuda::SumOp{}, Acc(0), scratch);
        };
        mean = sum([](Acc v) { return v; }) / Acc(K);
        var = sum([&](Acc v) { return (v - mean) * (v - mean); }) / Acc(K);
      }
      if (tid == 0) {
        f.mean[r] = mean;
        f.var[r] = var;
      }
      __syncthreads();  // sm is reused by the next row
    } else {
      mean = f.mean[r];
      var = f.var[r];
    }
    const Acc rs = rstd_of<D>(var, f.eps);
    const int64_t p = r / f.s.C, affine = (p / f.s.Pq() * f.s.C + r % f.s.C) * K;
    for (int64_t k = tid; k < K; k += kFwdStreamThreads)
      f.y[r * K + k] =
          from_acc<D>((to_acc(x[k]) - mean) * rs * f.scale[affine + k] + f.bias[affine + k]);
  }
}

// One block per slice of rows, kBwdStreamThreads threads striding the row in packs of VEC
// values, in one wave of blocks. Sweep j over the row's columns writes row j's dx (its x and dy
// re-read, from L2: sweep j - 1 read them) and takes row j + 1's two sums (its x and dy read from
// memory), so the reads of one row overlap the other's dx and there is one row reduction per
// sweep; rows + 1 sweeps in all (the first only sums, the last only writes dx). Loads of a
// batch of U packs are issued ahead of its dx stores, which they could alias as far as the
// compiler knows. Each thread owns the same columns in every sweep, so its d(scale), d(bias)
// sums (dg, db) need no barrier: they live in shared memory ((2, K)) where they fit, else in the
// block's own workspace rows (512 blocks of 256 threads each with its workspace rows, 64 MB at
// 16384 wide, spilled from L2 to HBM: 0.4 TB/s in bfloat16, 0.8 in float32; docs/perf/norm.md).
constexpr int kBwdStreamThreads = 1024;

template <typename D, int VEC>
__global__ void __launch_bounds__(kBwdStreamThreads)
    row_bwd_stream_kernel(Bwd<D> b, int64_t slices, bool in_smem) {
  using Acc = A<D>;
  using Pk = PackOf<D, VEC>;
  constexpr int U = std::clamp(16 / int(sizeof(Pk)), 1, 4);  // packs per batch: 16 bytes of each array
  constexpr int W = std::min(VEC, Vec<Acc>::kN);  // d(scale), d(bias) values per access
  extern __shared__ uint4 acc_words[];  // (d(scale), d(bias), K) when in_smem
  __shared__ Acc scratch[2][2][32];     // (sweep parity, sum, warp)
  cuda::await_prior_grids();
  const int tid = threadIdx.x;
  const Shape& s = b.s;
  const int64_t K = s.K;
  const int packs = int(K / VEC), step = kBwdStreamThreads * U;  // a row: K / VEC packs
  const BwdBlock blk(s, slices);
  const Acc inv_k = Acc(1) / Acc(K);
  const Acc* scale = b.scale + (blk.q * s.C + blk.c) * K;
  const int64_t out = ((blk.q * slices + blk.sb) * s.C + blk.c) * K;
  Acc* const dg = in_smem ? reinterpret_cast<Acc*>(acc_words) : b.ws0 + out;
  Acc* const db = in_smem ? dg + K : b.ws1 + out;
  for (int64_t k = tid; k < K; k += kBwdStreamThreads) dg[k] = db[k] = 0;
  __syncthreads();  // the sweeps' threads own packs, not the columns zeroed above
  struct Row {
    int64_t r = 0;
    Acc m = 0, rs = 0, c1 = 0, c2 = 0;  // c1, c2 once its sums are in
    typename GradCoef<Acc>::Cotangents ct{};
  };
  const auto row_at = [&](int64_t p) {
    Row w;
    if (p < blk.p1) {
      w.r = p * s.C + blk.c;
      w.m = b.mean[w.r];
      w.rs = rstd_of<D>(b.var[w.r], b.eps);
      w.ct = b.coef_fn.cotangents(w.r);
    }
    return w;
  };
  Row cur, nxt = row_at(blk.p0);
  for (int64_t p = blk.p0 - 1; p < blk.p1; ++p) {  // the sweep writing row p and summing row p + 1
    const bool has_cur = p >= blk.p0, has_nxt = p + 1 < blk.p1;
    const D* cx = b.x + cur.r * K;
    const D* cdy = b.dy + cur.r * K;
    const D* nx = b.x + nxt.r * K;
    const D* ndy = b.dy + nxt.r * K;
    D* dx = b.dx + cur.r * K;
    Acc sg = 0, sgxc = 0;  // row p + 1's sum(g*dy), sum(g*dy*(x - mean))
    for (int base = tid; base < packs; base += step) {
      // Row p's x, dy (their last use: evict first from L2), row p + 1's (kept for sweep p + 1).
      Pk vx[U], vd[U], wx[U], wd[U];
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int64_t k = int64_t(base + i * kBwdStreamThreads) * VEC;
        if (base + i * kBwdStreamThreads >= packs) continue;
        if (has_cur) vx[i] = Pk::load_stream(cx + k), vd[i] = Pk::load_stream(cdy + k);
        if (has_nxt) wx[i] = Pk::load(nx + k), wd[i] = Pk::load(ndy + k);
      }
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int64_t k = int64_t(base + i * kBwdStreamThreads) * VEC;
        if (base + i * kBwdStreamThreads >= packs) continue;
        Acc g[VEC], x[VEC], d[VEC];
        load_params(scale + k, g);
        if (has_cur) {
          vx[i].unpack(x);
          vd[i].unpack(d);
          Acc o[VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            o[e] = fma(g[e] * d[e], cur.rs, fma(x[e] - cur.m, cur.c1, cur.c2));
          store_vals<D, VEC>(dx + k, o);
#pragma unroll
          for (int h = 0; h < VEC; h += W) {  // dg, db a 16-byte word at a time
            Acc sdg[W], sdb[W];
            load_params(dg + k + h, sdg);
            load_params(db + k + h, sdb);
#pragma unroll
            for (int e = 0; e < W; ++e) {
              sdg[e] = fma(d[h + e], (x[h + e] - cur.m) * cur.rs, sdg[e]);
              sdb[e] += d[h + e];
            }
            store_params(dg + k + h, sdg);
            store_params(db + k + h, sdb);
          }
        }
        if (has_nxt) {
          wx[i].unpack(x);
          wd[i].unpack(d);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const Acc gd = g[e] * d[e];
            sg += gd;
            sgxc += gd * (x[e] - nxt.m);
          }
        }
      }
    }
    if (!has_nxt) break;
    row_sum2(sg, sgxc, scratch[p & 1]);
    b.coef_fn(nxt.r, nxt.ct, inv_k, nxt.rs, sg, sgxc * nxt.rs, &nxt.c1, &nxt.c2, tid == 0);
    cur = nxt;
    nxt = row_at(p + 2);
  }
  __syncthreads();
  if (in_smem)
    for (int64_t k = tid; k < K; k += kBwdStreamThreads) {
      b.ws0[out + k] = dg[k];
      b.ws1[out + k] = db[k];
    }
}

// ---- Launch configuration ---------------------------------------------------------------------

struct RowConfig {
  int vec = 1, nv = 1, rt = 32, rpb = 4;
  bool cached = false;
};

// The backward's thread shape: the most values per thread (NV packs of VEC, up to `max_e`, the
// register budget) that still leave the row a warp of threads, since the per-row work (the row
// sums, the coefficients, the copies' addresses) is the same for every thread whatever its
// share: a 4096-wide row takes 256 threads x 16 values (at 8 values a thread, 512 threads, that
// work was half of the instructions; docs/perf/norm.md). Up to `max_rt` threads
// per row; beyond that the row streams.
inline RowConfig row_config(int64_t K, int kvec, bool aligned, int max_e, int max_rt) {
  RowConfig c;
  c.vec = (aligned && K % kvec == 0) ? kvec : 1;
  const int64_t vecs = (K + c.vec - 1) / c.vec;
  while (c.nv < 8 && 2 * c.nv * c.vec <= max_e && (vecs + 2 * c.nv - 1) / (2 * c.nv) >= 32)
    c.nv *= 2;
  const int64_t threads = (vecs + c.nv - 1) / c.nv;
  c.rt = int(std::max<int64_t>(32, (threads + 31) / 32 * 32));
  c.rpb = c.rt == 32 ? 4 : 1;
  c.cached = threads <= max_rt;
  return c;
}

template <typename F>
void with_nv(int nv, F f) {
  switch (nv) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

template <typename D, typename F>
void with_vec(int vec, F f) {
  if (vec == 1) f(std::integral_constant<int, 1>{});
  else f(std::integral_constant<int, Vec<D>::kN>{});
}

}  // namespace

template <typename D>
Status row_forward(const Fwd<D>& f, cudaStream_t st) {
  constexpr int kVecN = Vec<D>::kN;
  const bool aligned = cuda::vec_aligned(f.x) && cuda::vec_aligned(f.y) &&
                       cuda::vec_aligned(f.scale) && cuda::vec_aligned(f.bias) &&
                       f.s.K % kVecN == 0;
  const int64_t rows = f.s.groups();
  Status status;
  auto run = [&](auto group, auto packs, auto vector) {
    constexpr int G = decltype(group)::value, threads = cuda::row_block_threads<G>();
    constexpr auto kernel = row_fwd_kernel<D, G, decltype(packs)::value, decltype(vector)::value>;
    status = cuda::launch("norm row_fwd_kernel", kernel,
                          cuda::grid_for(rows, cuda::rows_per_block<G>()), threads, 0, st, f);
  };
  // Packs of a row: 16-byte vectors when aligned, else single values.
  const auto shape = [&](int64_t packs, auto vector) {
    return cuda::with_row_shape<cuda::kRowPacks, cuda::kMaxRowThreads>(
        packs, [&](auto g, auto k) { run(g, k, vector); });
  };
  const bool cached = aligned ? shape(f.s.K / kVecN, std::true_type{})
                              : shape(f.s.K, std::false_type{});
  if (cached) return status;
  return cuda::launch("norm row_fwd_stream_kernel", row_fwd_stream_kernel<D>,
                      cuda::grid_for(rows, 1, 132 * 16), kFwdStreamThreads, 0, st, f);
}

// The cached backward's ring: as many stages of (x, dy) for the block's packs as fit in
// kRingBytes, 2 to 4 (a 4096-wide row: 4 stages of 16 KB in bfloat16, 3 of 32 KB in float32).
constexpr int64_t kRingBytes = 96 << 10;
// The streaming backward keeps its d(scale), d(bias) sums in shared memory up to this size (a
// 20480-wide float32 row).
constexpr int64_t kStreamAccBytes = 160 << 10;

template <typename D>
Status row_backward(const Bwd<D>& b, int64_t* slices, cudaStream_t st) {
  // Values per thread: up to kMaxE (the register budget at 256 threads a row); 16-bit rows
  // longer than 512 x kMaxE values take kLongE (512 threads x 32 values: a 16384-wide bfloat16
  // row, 2.9 TB/s cached against 0.4 streamed; at 4096 wide, 128 threads x 32 values took 295 us
  // against 237 for 256 x 16; docs/perf/norm.md).
  constexpr int kMaxE = sizeof(D) == 8 ? 8 : 16, kLongE = sizeof(D) == 2 ? 32 : kMaxE;
  const Shape& s = b.s;
  const bool aligned = cuda::vec_aligned(b.x) && cuda::vec_aligned(b.dy) &&
                       cuda::vec_aligned(b.dx) && cuda::vec_aligned(b.scale);
  RowConfig c = row_config(s.K, Vec<D>::kN, aligned, kMaxE, 512);
  if (!c.cached) c = row_config(s.K, Vec<D>::kN, aligned, kLongE, 512);
  *slices = row_bwd_max_slices(s);
  if (s.Q * *slices * s.C == 0) return Status::Ok();
  // One wave of blocks, each walking rows / wave rows of its affine row (no second, partial
  // wave); *slices becomes the blocks per affine row.
  const auto wave = [&](const char* what, auto kernel, dim3 block, size_t smem, auto arg) {
    int per_sm = 0;
    Status status = cuda::check(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
        what);
    if (status.ok())
      status = cuda::check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                               &per_sm, kernel, int(block.x * block.y), smem),
                           what);
    if (!status.ok()) return status;
    const int64_t blocks = int64_t(std::max(per_sm, 1)) * std::max(cuda::sm_count(), 1);
    *slices = std::clamp<int64_t>((blocks + s.Q * s.C - 1) / (s.Q * s.C), 1, *slices);
    return cuda::launch(what, kernel, unsigned(s.Q * *slices * s.C), block, smem, st, b, *slices,
                        arg);
  };
  if (!c.cached) {
    const int64_t acc = 2 * s.K * int64_t(sizeof(A<D>));
    const bool in_smem = acc <= kStreamAccBytes;
    Status status;
    with_vec<D>(c.vec, [&](auto vec) {
      status = wave("norm row_bwd_stream_kernel", row_bwd_stream_kernel<D, vec()>,
                    dim3(kBwdStreamThreads), in_smem ? size_t(acc) : 0, in_smem);
    });
    return status;
  }
  const int threads = c.rt * c.rpb;
  const auto run = [&](auto kernel, int nv, int vec) {
    const int64_t stage = 2 * nv * threads * vec * int64_t(sizeof(D));
    const int stages = int(std::clamp<int64_t>(kRingBytes / stage, 2, 4));
    const int64_t scales = int64_t(nv) * vec * threads * int64_t(sizeof(A<D>));
    return wave("norm row_bwd_kernel", kernel, dim3(c.rt, c.rpb), size_t(stages * stage + scales),
                stages);
  };
  Status status = Status::Error("norm row_bwd_kernel: no configuration for the row");
  with_vec<D>(c.vec, [&](auto vec) {
    with_nv(c.nv, [&](auto nv) {
      constexpr int kNV = nv(), kVec = vec();
      if constexpr (kNV * kVec <= kMaxE) {
        // More than 256 threads only where row_config gave the most values per thread.
        constexpr bool kWide = kNV == 8 || 2 * kNV * kVec > kMaxE;
        if (threads <= 256) status = run(row_bwd_kernel<D, kVec, kNV, 256>, kNV, kVec);
        else if constexpr (kWide) status = run(row_bwd_kernel<D, kVec, kNV, 512>, kNV, kVec);
      } else if constexpr (kNV * kVec <= kLongE) {  // only rows of more than 512 x kMaxE values
        status = run(row_bwd_kernel<D, kVec, kNV, 512>, kNV, kVec);
      }
    });
  });
  return status;
}

JAXDNN_NORM_CUDA_INSTANTIATE(row_forward, Fwd);
template Status row_backward<float>(const Bwd<float>&, int64_t*, cudaStream_t);
template Status row_backward<double>(const Bwd<double>&, int64_t*, cudaStream_t);
template Status row_backward<__half>(const Bwd<__half>&, int64_t*, cudaStream_t);
template Status row_backward<__nv_bfloat16>(const Bwd<__nv_bfloat16>&, int64_t*, cudaStream_t);

}  // namespace jaxdnn::norm::cuda_impl
