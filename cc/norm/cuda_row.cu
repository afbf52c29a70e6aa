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
//             registers, shift = x[0]), y = (x - mean)*rstd*scale + bias; scale and bias are
//             read per row from L1/L2 (16-byte loads).
//             Traffic per row: read x, write y (K values each).
//   backward  block (RT, RPB): RT threads per row (a warp when RT == 32, with RPB = 4 rows per
//             block; otherwise the whole block, RPB = 1); each thread holds NV vectors of VEC
//             values, vector i at (i*RT + thread)*VEC. Block (slice sb, c, q) walks the rows
//             of its slice: two row sums, dx, and per-thread d(scale), d(bias) accumulators for
//             its columns, combined across row groups and written once per block to the
//             (Q, S_b, C, K) partial planes.
//             Traffic per row: read x, dy, write dx; per block: write 2K partials.
// Rows too long for registers take streaming kernels (one block per row, values re-read from
// L2): forward Welford per thread + block merge, then y; backward sums, then dx with the
// d(scale), d(bias) partials accumulated in the block's own workspace row.

#include <type_traits>

#include "cc/common/cuda_rows.h"
#include "cc/norm/cuda_kernels.cuh"

namespace jaxdnn::norm::cuda_impl {
namespace {

constexpr int kStreamThreads = 256;

// Sum over the RT threads of a row group (a warp, or the whole block when RT > 32).
template <typename Acc>
__device__ __forceinline__ Acc row_sum(Acc v, Acc* scratch) {
  if (blockDim.x == 32) return cuda::warp_reduce(v, cuda::SumOp{});
  return cuda::block_reduce(v, cuda::SumOp{}, Acc(0), scratch);
}

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

template <typename D, int VEC, int NV>
__global__ void __launch_bounds__(512) row_bwd_kernel(Bwd<D> b, int64_t slices) {
  using Acc = A<D>;
  constexpr int E = NV * VEC;
  __shared__ Acc scratch[32];
  __shared__ Acc part[2][4][32 * E];  // (dscale|dbias, row group, column) when RPB > 1
  cuda::await_prior_grids();
  const int tid = threadIdx.x, RT = blockDim.x;
  const Shape& s = b.s;
  const int64_t K = s.K;
  const BwdBlock blk(s, slices);
  const Acc* scale = b.scale + (blk.q * s.C + blk.c) * K;  // one affine row: L1-resident
  Acc dg[NV][VEC] = {}, db[NV][VEC] = {};
  for (int64_t p = blk.p0 + threadIdx.y; p < blk.p1; p += blockDim.y) {
    const int64_t r = p * s.C + blk.c;
    Acc x[NV][VEC], dy[NV][VEC];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t k = int64_t(i * RT + tid) * VEC;
      if (k < K) {
        load_vals<D, VEC>(b.x + r * K + k, x[i]);
        load_vals<D, VEC>(b.dy + r * K + k, dy[i]);
      }
    }
    const Acc m = b.mean[r], rs = rstd_of<D>(b.var[r], b.eps);
    Acc sg = 0, sgxc = 0;  // sum(g*dy), sum(g*dy*(x - mean))
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t k = int64_t(i * RT + tid) * VEC;
      if (k >= K) continue;
      Acc g[VEC];
      load_params(scale + k, g);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const Acc gd = g[e] * dy[i][e];
        sg += gd;
        sgxc += gd * (x[i][e] - m);
      }
    }
    sg = row_sum(sg, scratch);
    sgxc = row_sum(sgxc, scratch);
    Acc c1, c2;
    b.coef_fn(r, Acc(K), rs, sg, sgxc * rs, &c1, &c2, tid == 0);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t k = int64_t(i * RT + tid) * VEC;
      if (k >= K) continue;
      Acc g[VEC], out[VEC];
      load_params(scale + k, g);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const Acc xc = x[i][e] - m;
        out[e] = g[e] * rs * dy[i][e] + xc * c1 + c2;
        dg[i][e] += dy[i][e] * xc * rs;
        db[i][e] += dy[i][e];
      }
      store_vals<D, VEC>(b.dx + r * K + k, out);
    }
  }
  // Row groups of one block hold partials of the same columns: add them in row-group order.
  if (blockDim.y > 1) {
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        part[0][threadIdx.y][(i * VEC + e) * 32 + tid] = dg[i][e];
        part[1][threadIdx.y][(i * VEC + e) * 32 + tid] = db[i][e];
      }
    __syncthreads();
    if (threadIdx.y != 0) return;
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        for (int y = 1; y < int(blockDim.y); ++y) {
          dg[i][e] += part[0][y][(i * VEC + e) * 32 + tid];
          db[i][e] += part[1][y][(i * VEC + e) * 32 + tid];
        }
  }
  const int64_t out = ((blk.q * slices + blk.sb) * s.C + blk.c) * K;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int64_t k = int64_t(i * RT + tid) * VEC;
    if (k >= K) continue;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      b.ws0[out + k + e] = dg[i][e];
      b.ws1[out + k + e] = db[i][e];
    }
  }
}

// ---- Streaming fallback: rows longer than the register cache ---------------------------------

template <typename D>
__global__ void __launch_bounds__(kStreamThreads) row_fwd_stream_kernel(Fwd<D> f) {
  using Acc = A<D>;
  __shared__ Moments<Acc> sm[kStreamThreads];
  cuda::await_prior_grids();
  const int tid = threadIdx.x;
  const int64_t K = f.s.K;
  for (int64_t r = blockIdx.x; r < f.s.groups(); r += gridDim.x) {
    const D* x = f.x + r * K;
    Acc mean, var;
    if (f.training) {
      const Acc shift = f.centered ? to_acc(x[0]) : Acc(0);
      Moments<Acc> m{0, 0, 0};
      for (int64_t k = tid; k < K; k += kStreamThreads) {
        const Acc v[1] = {to_acc(x[k]) - shift};
        if (f.centered) add_chunk<Acc, 1>(m, v, 1);
        else m.merge(1, 0, v[0] * v[0]);
      }
      m = merge_group(m, sm, 0, tid, kStreamThreads, 1);
      mean = shift + m.mean;
      var = m.m2 / Acc(K);
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
    for (int64_t k = tid; k < K; k += kStreamThreads)
      f.y[r * K + k] =
          from_acc<D>((to_acc(x[k]) - mean) * rs * f.scale[affine + k] + f.bias[affine + k]);
  }
}

template <typename D>
__global__ void __launch_bounds__(kStreamThreads) row_bwd_stream_kernel(Bwd<D> b, int64_t slices) {
  using Acc = A<D>;
  __shared__ Acc scratch[32];
  cuda::await_prior_grids();
  const int tid = threadIdx.x;
  const Shape& s = b.s;
  const int64_t K = s.K;
  const BwdBlock blk(s, slices);
  const Acc* scale = b.scale + (blk.q * s.C + blk.c) * K;
  const int64_t out = ((blk.q * slices + blk.sb) * s.C + blk.c) * K;
  for (int64_t k = tid; k < K; k += kStreamThreads) b.ws0[out + k] = b.ws1[out + k] = 0;
  for (int64_t p = blk.p0; p < blk.p1; ++p) {
    const int64_t r = p * s.C + blk.c;
    const D* x = b.x + r * K;
    const D* dy = b.dy + r * K;
    const Acc m = b.mean[r], rs = rstd_of<D>(b.var[r], b.eps);
    Acc sg = 0, sgxc = 0;
    for (int64_t k = tid; k < K; k += kStreamThreads) {
      const Acc gd = scale[k] * to_acc(dy[k]);
      sg += gd;
      sgxc += gd * (to_acc(x[k]) - m);
    }
    sg = cuda::block_reduce(sg, cuda::SumOp{}, Acc(0), scratch);
    sgxc = cuda::block_reduce(sgxc, cuda::SumOp{}, Acc(0), scratch);
    Acc c1, c2;
    b.coef_fn(r, Acc(K), rs, sg, sgxc * rs, &c1, &c2, tid == 0);
    for (int64_t k = tid; k < K; k += kStreamThreads) {  // each thread owns columns k
      const Acc xc = to_acc(x[k]) - m, d = to_acc(dy[k]);
      b.dx[r * K + k] = from_acc<D>(scale[k] * rs * d + xc * c1 + c2);
      b.ws0[out + k] += d * xc * rs;
      b.ws1[out + k] += d;
    }
  }
}

// ---- Launch configuration ---------------------------------------------------------------------

struct RowConfig {
  int vec = 1, nv = 1, rt = 32, rpb = 4;
  bool cached = false;
};

// Smallest NV (up to the register budget of `max_e` values per thread) that covers the row
// with at most `target` threads, else as many threads as needed up to `max_rt`; beyond that
// the row streams.
inline RowConfig row_config(int64_t K, int kvec, bool aligned, int max_e, int target,
                            int max_rt) {
  RowConfig c;
  c.vec = (aligned && K % kvec == 0) ? kvec : 1;
  const int64_t vecs = (K + c.vec - 1) / c.vec;
  for (int nv = 1; nv <= 8 && nv * c.vec <= max_e; nv *= 2) {
    c.nv = nv;
    if ((vecs + nv - 1) / nv <= target) break;
  }
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
                      cuda::grid_for(rows, 1, 132 * 16), kStreamThreads, 0, st, f);
}

template <typename D>
Status row_backward(const Bwd<D>& b, int64_t slices, cudaStream_t st) {
  constexpr int kMaxE = sizeof(D) == 8 ? 8 : 16;
  const bool aligned = cuda::vec_aligned(b.x) && cuda::vec_aligned(b.dy) &&
                       cuda::vec_aligned(b.dx) && cuda::vec_aligned(b.scale);
  // Up to 512 threads before 16 values per thread: the dscale/dbias accumulators double the
  // registers per value, and 8 values per thread keep four 512-thread blocks' worth resident.
  const RowConfig c = row_config(b.s.K, Vec<D>::kN, aligned, kMaxE, 512, 512);
  const int64_t blocks = b.s.Q * slices * b.s.C;
  if (blocks == 0) return Status::Ok();
  if (!c.cached)
    return cuda::launch("norm row_bwd_stream_kernel", row_bwd_stream_kernel<D>, unsigned(blocks),
                        kStreamThreads, 0, st, b, slices);
  Status status = Status::Error("norm row_bwd_kernel: no configuration for the row");
  with_vec<D>(c.vec, [&](auto vec) {
    with_nv(c.nv, [&](auto nv) {
      if constexpr (nv() * vec() <= kMaxE)
        status = cuda::launch("norm row_bwd_kernel", row_bwd_kernel<D, vec(), nv()>,
                              unsigned(blocks), dim3(c.rt, c.rpb), 0, st, b, slices);
    });
  });
  return status;
}

JAXDNN_NORM_CUDA_INSTANTIATE(row_forward, Fwd);
template Status row_backward<float>(const Bwd<float>&, int64_t, cudaStream_t);
template Status row_backward<double>(const Bwd<double>&, int64_t, cudaStream_t);
template Status row_backward<__half>(const Bwd<__half>&, int64_t, cudaStream_t);
template Status row_backward<__nv_bfloat16>(const Bwd<__nv_bfloat16>&, int64_t, cudaStream_t);

}  // namespace jaxdnn::norm::cuda_impl
