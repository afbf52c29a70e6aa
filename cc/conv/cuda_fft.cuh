// FFT convolution: the core shared by kCudaFft (cuda_fft.cu, one FFT plane per image) and
// kCudaFftTiling (cuda_fft_tiling.cu, overlap-save tiles of at most 64 x 64). Our own
// shared-memory FFT kernels (no cuFFT), one complex GEMM per frequency, float32 throughout.
// 2-D problems (D = T = Z = 1), stride 1, no dilation, groups 1, any padding; float32,
// float16 and bfloat16 operands (float64: unsupported).
//
// Math along one axis (2-D is the product of two). With xp the padded input,
// xp[i] = x[i - pad_lo] (zero off the tensor), i < Hp = H + pad_lo + pad_hi = P + R - 1:
//   fwd         y[p]   = sum_r xp[p + r] w[r]    correlation   Y  = X  . conj(W)
//   bwd_data    dxp[i] = sum_r dy[i - r] w[r]    convolution   DX = DY . W
//   bwd_filter  dw[r]  = sum_p dy[p] xp[p + r]   correlation   DW = X  . conj(DY)
// An L-point circular transform gives these exactly when no product wraps around: T output
// rows of one tile and R taps need L >= T + R - 1 (overlap-save). Tile t of an axis maps FFT
// slots j (input) and m (result) to tensor rows:
//   fwd         slot j <- x  row t*T + j - pad_lo              y  row t*T + m <- slot m
//   bwd_data    slot j <- dy row t*T + j + pad_lo - (R - 1)    dx row t*T + m <- slot m + R - 1
//   bwd_filter  slot j <- x  row t*T + j - pad_lo;  slot j <- dy row t*T + j (j < T only);
//               dw[r] <- slot r, summed over all tiles by the GEMM
// (dx rows read by no output, i.e. under negative padding, are zero). The tiled axis is the
// output's: (P, Q) for fwd and bwd_filter, (H, W) for bwd_data. The plan (per algorithm)
// picks L and T per axis; L = 2^a 3^b.
//
// Data flow, spectra complex64 in the workspace, frequency-major (F, planes, channels) with
// F = Lh * (Lw/2 + 1) (the half spectrum of real planes), planes a = (n, tile_h, tile_w):
//   forward_kernel  NHWC tensor -> spectrum. One block per (plane a, 2*kPairs channels): the
//                   load reads channels innermost (the NHWC transpose happens here), packs
//                   channel pairs into complex planes (re = 2p, im = 2p + 1), zero-fills the
//                   window padding; in-place FFT over the used rows, then all columns; the
//                   store splits each pair into two half spectra:
//                   X_2p = (Z[f] + conj Z[-f]) / 2,  X_2p+1 = (Z[f] - conj Z[-f]) / 2i.
//   cgemm_kernel    per frequency: fwd  Y[a][k] = sum_c X[a][c] conj(W[c][k]),
//                   bwd_data DX[a][c] = sum_k DY[a][k] W[c][k],
//                   bwd_filter DW[c][k] = sum_a X[a][c] conj(DY[a][k]) (+= over batches).
//   inverse_kernel  spectrum -> NHWC tensor: rebuilds Z = X_2p + i X_2p+1 on the full plane
//                   from the two half spectra, inverse FFT over all columns then only the rows
//                   it keeps, crops, scales by 1 / (Lh Lw), converts, writes channels innermost.
// The filter spectrum is made once per call; x/dy/y/dx spectra in batches of planes so that the
// workspace stays bounded (kBatchBytes).
//
// The FFT: in-place decimation in frequency, radix 4 / 2 / 3 stages over all lines of the
// block's planes at once (a line = one row or one column), one __syncthreads per stage.
// Output is digit-reversed: frequency k of an L-point line sits at element pos(k); the
// inverse transform starts from natural order, so only pos() lookups in the loads/stores
// are needed, never a reordering pass. Twiddles exp(-2 pi i m / L) are computed per block in
// double (sincospi) and rounded once, so the FFT error is the usual O(eps log L).
//
// Shared memory per transform block (256 threads): kPairs planes (Lh, RS) complex, RS = Lw | 1
// (odd, so butterflies along rows and along columns are both bank-conflict free; the plane
// stride is padded so the kPairs planes fall on disjoint banks), plus twiddle and pos tables.
// kPairs = 4, 2 or 1: as many as fit 72 KB (64 x 64: 2 pairs, 68 KB, 3 blocks per SM). One
// plane must fit in a block (227 KB on H200: up to 128 x 128, 162 x 162, 256 x 96).
//
// Work (C -> K channels, R x S taps, A planes of T x T outputs, F = Lh (Lw/2 + 1)): the GEMMs
// do F * A * C * K complex multiply-adds = 8 F A C K flops, against 2 A T^2 C K R S for a
// direct or GEMM convolution, so fewer flops once R * S > 4 F / T^2 (~3 for a whole 56x56
// image). The transforms add a fixed cost: each tensor and spectrum crosses memory once
// (~20 instructions per element besides), which predicts a win over float32 GEMMs from 5x5
// filters on. Example, N = 64, 56x56, 64 -> 64, 7x7, one 64 x 64 plane per image: 4.4 GFLOP of
// GEMM against 80.5; X, W and Y spectra of 69 MB each, x and y 51 MB each.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cc/common/cuda_async.h"
#include "cc/common/cuda_util.h"
#include "cc/conv/cuda_algorithms.h"

namespace jaxdnn::conv::fft {

constexpr int kMaxStages = 16;
constexpr int kThreads = 256;                          // transform kernel blocks
constexpr int64_t kBatchBytes = int64_t(256) << 20;    // x/dy/y/dx spectra of one batch
constexpr int64_t kMaxWorkspace = int64_t(4) << 30;    // refuse plans needing more
constexpr int64_t kPairSmemBudget = 72 << 10;          // transform smem when kPairs > 1

using cuda::FastDiv;

// ---- FFT plan ---------------------------------------------------------------------------------

// An L-point in-place decimation-in-frequency FFT: stage s splits blocks of sub[s] * radix[s]
// elements into radix[s] sub-blocks of sub[s] (butterfly span sub[s], twiddle index step
// tw_step[s] = L / (sub[s] * radix[s])).
struct AxisFft {
  int L = 1, stages = 0;
  int radix[kMaxStages] = {}, sub[kMaxStages] = {}, tw_step[kMaxStages] = {};
  FastDiv sub_div[kMaxStages];
  FastDiv len;  // divides by L
};

inline AxisFft make_axis(int L) {
  AxisFft ax;
  ax.L = L;
  ax.len = FastDiv(uint32_t(L));
  int rest = L, block = L;
  auto add = [&](int r) {
    ax.radix[ax.stages] = r;
    ax.sub[ax.stages] = block / r;
    ax.sub_div[ax.stages] = FastDiv(uint32_t(block / r));
    ax.tw_step[ax.stages] = L / block;
    block /= r;
    rest /= r;
    ++ax.stages;
  };
  while (rest % 4 == 0) add(4);
  if (rest % 2 == 0) add(2);
  while (rest % 3 == 0) add(3);
  return ax;
}

struct Fft2d {
  AxisFft ax[2];    // along h (columns of the plane), along w (rows)
  int row_stride;   // RS: complex elements per plane row, Lw rounded up to odd
  FastDiv half_w;   // divides by Lw / 2 + 1
};

inline Fft2d make_fft(int Lh, int Lw) {
  return Fft2d{{make_axis(Lh), make_axis(Lw)}, Lw | 1, FastDiv(uint32_t(Lw / 2 + 1))};
}

// Complex elements between the kPairs planes of a block: padded so that plane p starts
// 2 * p * 16 / kPairs banks after plane 0 (conflict-free when lines run pair-fastest).
template <int kPairs>
__host__ __device__ __forceinline__ int plane_stride(int Lh, int RS) {
  const int mod = 32 / kPairs, want = 16 / kPairs, s = Lh * RS;
  return kPairs == 1 ? s : s + ((want - s % mod) % mod + mod) % mod;
}

// Dynamic shared memory of a transform block: twiddles, planes, pos tables.
template <int kPairs>
int64_t transform_smem(const Fft2d& f) {
  const int Lh = f.ax[0].L, Lw = f.ax[1].L;
  const int64_t planes = int64_t(kPairs) * plane_stride<kPairs>(Lh, f.row_stride);
  return int64_t(sizeof(float2)) * (Lh + Lw + planes) + int64_t(sizeof(int)) * (Lh + Lw);
}

// The smallest 2^a 3^b >= n (n >= 1).
inline int64_t smooth_length(int64_t n) {
  int64_t best = -1;
  for (int64_t p2 = 1; best < 0 || p2 < best; p2 *= 2) {
    int64_t v = p2;
    while (v < n) v *= 3;
    if (best < 0 || v < best) best = v;
  }
  return best;
}

// Tensor rows feeding the FFT slots of tile t along one axis: slot j < slots reads row
// t * step + off + j when it lies in [0, size), else zero.
struct Window {
  int size, step, off, slots;
};

// Tensor rows written from the FFT slots of tile t along one axis: row d of the tile's rows
// [t * step, min(t * step + step, size)) takes slot d - t * step + off if valid_lo <= d <
// valid_hi, else zero.
struct Crop {
  int size, step, off, valid_lo, valid_hi;
};

// The planes of one launch: plane a0 + blockIdx / groups, channels in groups of 2 * kPairs.
struct Planes {
  int tiles[2];  // tiles along h, w: plane a = (n * tiles_h + t_h) * tiles_w + t_w
  int a0, count;
  int B;         // channels, innermost in the tensor and the spectrum
  int groups;    // channel groups per plane
};

template <typename In>
struct ForwardArgs {
  const In* src;  // (images, win[0].size, win[1].size, B)
  float2* spec;   // (F, count, B)
  Fft2d fft;
  Window win[2];
  Planes planes;
};

template <typename Out>
struct InverseArgs {
  const float2* spec;  // (F, count, B)
  Out* dst;            // (images, crop[0].size, crop[1].size, B)
  Fft2d fft;
  Crop crop[2];
  Planes planes;
  float scale;
};

// ---- device: butterflies and FFT passes -------------------------------------------------------

__device__ __forceinline__ float2 cadd(float2 a, float2 b) {
  return make_float2(a.x + b.x, a.y + b.y);
}
__device__ __forceinline__ float2 csub(float2 a, float2 b) {
  return make_float2(a.x - b.x, a.y - b.y);
}
__device__ __forceinline__ float2 cmul(float2 a, float2 b) {
  return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
// -i * a (forward) or +i * a (inverse)
template <bool kInverse> __device__ __forceinline__ float2 rot(float2 a) {
  return kInverse ? make_float2(-a.y, a.x) : make_float2(a.y, -a.x);
}

template <bool kInverse> __device__ __forceinline__ void dft(float2 (&v)[2]) {
  const float2 a = v[0], b = v[1];
  v[0] = cadd(a, b);
  v[1] = csub(a, b);
}

template <bool kInverse> __device__ __forceinline__ void dft(float2 (&v)[3]) {
  constexpr float kSin60 = 0.86602540378443864676f;
  const float2 t = cadd(v[1], v[2]), d = csub(v[1], v[2]);
  const float2 m = make_float2(v[0].x - 0.5f * t.x, v[0].y - 0.5f * t.y);
  const float2 s = rot<kInverse>(make_float2(kSin60 * d.x, kSin60 * d.y));
  v[0] = cadd(v[0], t);
  v[1] = cadd(m, s);
  v[2] = csub(m, s);
}

template <bool kInverse> __device__ __forceinline__ void dft(float2 (&v)[4]) {
  const float2 a = cadd(v[0], v[2]), b = csub(v[0], v[2]);
  const float2 c = cadd(v[1], v[3]), d = rot<kInverse>(csub(v[1], v[3]));
  v[0] = cadd(a, c);
  v[2] = csub(a, c);
  v[1] = cadd(b, d);
  v[3] = csub(b, d);
}

// One radix-R stage over `lines` lines; line l starts at base(l), elements `stride` apart.
// Butterflies run line-fastest so a warp touches 32 lines at the same offset.
template <int R, bool kInverse, typename LineBase>
__device__ __forceinline__ void radix_stage(float2* planes, const AxisFft& ax, int s,
                                            const float2* tw, int lines, FastDiv lines_div,
                                            int stride, LineBase base) {
  const int sub = ax.sub[s], tw_step = ax.tw_step[s], count = lines * (ax.L / R);
  for (int b = threadIdx.x; b < count; b += kThreads) {
    const int q = lines_div.div(b), line = b - q * lines;
    const int blk = ax.sub_div[s].div(q), j = q - blk * sub;
    float2* x = planes + base(line) + (blk * sub * R + j) * stride;
    float2 v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = x[r * sub * stride];
    dft<kInverse>(v);
#pragma unroll
    for (int r = 1; r < R; ++r) {
      float2 w = tw[r * j * tw_step];
      if (kInverse) w.y = -w.y;
      v[r] = cmul(v[r], w);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) x[r * sub * stride] = v[r];
  }
}

// In-place DIF FFT of `lines` lines (all threads of the block; ends synchronised). Frequency k
// of a line ends at element pos(k).
template <bool kInverse, typename LineBase>
__device__ __forceinline__ void fft_pass(float2* planes, const AxisFft& ax, const float2* tw,
                                         int lines, int stride, LineBase base) {
  const FastDiv lines_div{uint32_t(lines)};
  for (int s = 0; s < ax.stages; ++s) {
    switch (ax.radix[s]) {
      case 4: radix_stage<4, kInverse>(planes, ax, s, tw, lines, lines_div, stride, base); break;
      case 3: radix_stage<3, kInverse>(planes, ax, s, tw, lines, lines_div, stride, base); break;
      default: radix_stage<2, kInverse>(planes, ax, s, tw, lines, lines_div, stride, base); break;
    }
    __syncthreads();
  }
}

// Twiddles tw[m] = exp(-2 pi i m / L) and pos(k) = sum_s digit_s(k) * sub[s] for both axes:
// entries [0, Lh) for h, [Lh, Lh + Lw) for w. Ends synchronised.
__device__ __forceinline__ void init_tables(const Fft2d& f, float2* tw, int* pos) {
  const int Lh = f.ax[0].L;
  for (int i = threadIdx.x; i < Lh + f.ax[1].L; i += kThreads) {
    const AxisFft& ax = f.ax[i < Lh ? 0 : 1];
    const int k = i < Lh ? i : i - Lh;
    double s, c;
    sincospi(-2.0 * k / ax.L, &s, &c);
    tw[i] = make_float2(float(c), float(s));
    int p = 0;
    for (int st = 0, rest = k; st < ax.stages; ++st) {
      p += (rest % ax.radix[st]) * ax.sub[st];
      rest /= ax.radix[st];
    }
    pos[i] = p;
  }
  __syncthreads();
}

// The block's plane and channel group, and the image and tile of the plane.
struct BlockPlane {
  int al, b0, n, t[2];
};

template <int kPairs>
__device__ __forceinline__ BlockPlane block_plane(const Planes& ps) {
  BlockPlane bp;
  const int g = blockIdx.x % ps.groups;
  bp.al = blockIdx.x / ps.groups;
  bp.b0 = g * 2 * kPairs;
  const int a = ps.a0 + bp.al;
  bp.t[1] = a % ps.tiles[1];
  bp.t[0] = a / ps.tiles[1] % ps.tiles[0];
  bp.n = a / (ps.tiles[0] * ps.tiles[1]);
  return bp;
}

// Shared memory carve-up of a transform block.
struct Smem {
  float2* tw;      // (Lh + Lw)
  float2* planes;  // (kPairs, PS)
  int* pos;        // (Lh + Lw)
};

template <int kPairs>
__device__ __forceinline__ Smem carve(const Fft2d& f, void* raw) {
  const int Lh = f.ax[0].L, Lw = f.ax[1].L;
  Smem s;
  s.tw = static_cast<float2*>(raw);
  s.planes = s.tw + Lh + Lw;
  s.pos = reinterpret_cast<int*>(s.planes + kPairs * plane_stride<kPairs>(Lh, f.row_stride));
  return s;
}

// ---- forward transform: NHWC tensor -> half spectra ---------------------------------------

template <typename In, int kPairs>
__global__ void __launch_bounds__(kThreads)
forward_kernel(const __grid_constant__ ForwardArgs<In> p) {
  extern __shared__ float4 smem_raw[];
  const Fft2d& f = p.fft;
  const int Lh = f.ax[0].L, Lw = f.ax[1].L, RS = f.row_stride, HW = Lw / 2 + 1, B = p.planes.B;
  const int PS = plane_stride<kPairs>(Lh, RS);
  const Smem sm = carve<kPairs>(f, smem_raw);
  const BlockPlane bp = block_plane<kPairs>(p.planes);
  init_tables(f, sm.tw, sm.pos);

  // Load: slot (i, j) of pair plane pr = channels (b, b + 1) as (re, im), zero outside the
  // window. Consecutive threads take consecutive pairs of one pixel.
  const Window &wh = p.win[0], &ww = p.win[1];
  const int h0 = bp.t[0] * wh.step + wh.off, w0 = bp.t[1] * ww.step + ww.off;
  const In* src = p.src + int64_t(bp.n) * wh.size * ww.size * B;
  for (int e = threadIdx.x; e < Lh * Lw * kPairs; e += kThreads) {
    const int pr = e % kPairs, pix = e / kPairs;
    const int i = f.ax[1].len.div(pix), j = pix - i * Lw;
    const int sh = h0 + i, sw = w0 + j, b = bp.b0 + 2 * pr;
    float2 v = make_float2(0.f, 0.f);
    if (i < wh.slots && j < ww.slots && sh >= 0 && sh < wh.size && sw >= 0 && sw < ww.size &&
        b < B) {
      const In* s = src + (int64_t(sh) * ww.size + sw) * B + b;
      v.x = cuda::to_acc(s[0]);
      if (b + 1 < B) v.y = cuda::to_acc(s[1]);
    }
    sm.planes[pr * PS + i * RS + j] = v;
  }
  __syncthreads();

  // Rows that hold data (the others are zero and stay zero), then every column.
  const int r_lo = max(0, -h0), r_hi = min(min(wh.slots, wh.size - h0), Lh);
  if (r_hi > r_lo)
    fft_pass<false>(sm.planes, f.ax[1], sm.tw + Lh, kPairs * (r_hi - r_lo), 1, [&](int line) {
      return (line % kPairs) * PS + (r_lo + line / kPairs) * RS;
    });
  fft_pass<false>(sm.planes, f.ax[0], sm.tw, kPairs * Lw, RS,
                  [&](int line) { return (line % kPairs) * PS + line / kPairs; });

  // Store: split each pair plane into the half spectra of its two channels.
  for (int e = threadIdx.x; e < Lh * HW * kPairs; e += kThreads) {
    const int pr = e % kPairs, fr = e / kPairs, b = bp.b0 + 2 * pr;
    if (b >= B) continue;
    const int u = f.half_w.div(fr), v = fr - u * HW;
    const float2* pl = sm.planes + pr * PS;
    const float2 z1 = pl[sm.pos[u] * RS + sm.pos[Lh + v]];
    const float2 z2 = pl[sm.pos[u ? Lh - u : 0] * RS + sm.pos[Lh + (v ? Lw - v : 0)]];
    float2* d = p.spec + (int64_t(fr) * p.planes.count + bp.al) * B + b;
    d[0] = make_float2(0.5f * (z1.x + z2.x), 0.5f * (z1.y - z2.y));
    if (b + 1 < B) d[1] = make_float2(0.5f * (z1.y + z2.y), 0.5f * (z2.x - z1.x));
  }
}

// ---- inverse transform: half spectra -> NHWC tensor ---------------------------------------

template <typename Out, int kPairs>
__global__ void __launch_bounds__(kThreads)
inverse_kernel(const __grid_constant__ InverseArgs<Out> p) {
  extern __shared__ float4 smem_raw[];
  const Fft2d& f = p.fft;
  const int Lh = f.ax[0].L, Lw = f.ax[1].L, RS = f.row_stride, HW = Lw / 2 + 1, B = p.planes.B;
  const int PS = plane_stride<kPairs>(Lh, RS);
  const Smem sm = carve<kPairs>(f, smem_raw);
  const BlockPlane bp = block_plane<kPairs>(p.planes);
  init_tables(f, sm.tw, sm.pos);

  // Load: Z = X_2p + i X_2p+1 at (u, v) and, for the columns the half spectrum lacks,
  // its Hermitian mirror conj(X_2p) + i conj(X_2p+1) at (-u, -v). Natural order.
  for (int e = threadIdx.x; e < Lh * HW * kPairs; e += kThreads) {
    const int pr = e % kPairs, fr = e / kPairs, b = bp.b0 + 2 * pr;
    const int u = f.half_w.div(fr), v = fr - u * HW;
    const float2* s = p.spec + (int64_t(fr) * p.planes.count + bp.al) * B + b;
    const float2 y0 = b < B ? s[0] : make_float2(0.f, 0.f);
    const float2 y1 = b + 1 < B ? s[1] : make_float2(0.f, 0.f);
    float2* pl = sm.planes + pr * PS;
    pl[u * RS + v] = make_float2(y0.x - y1.y, y0.y + y1.x);
    if (v > 0 && Lw - v >= HW)
      pl[(u ? Lh - u : 0) * RS + Lw - v] = make_float2(y0.x + y1.y, y1.x - y0.y);
  }
  __syncthreads();

  // Every column; then only the rows (physical row pos(slot)) that the crop keeps.
  fft_pass<true>(sm.planes, f.ax[0], sm.tw, kPairs * Lw, RS,
                 [&](int line) { return (line % kPairs) * PS + line / kPairs; });
  const Crop &crh = p.crop[0], &crw = p.crop[1];
  const int row0 = bp.t[0] * crh.step, col0 = bp.t[1] * crw.step;
  const int d_lo = max(row0, crh.valid_lo);
  const int d_hi = min(min(row0 + crh.step, crh.size), crh.valid_hi);
  const int s_lo = d_lo - row0 + crh.off;
  if (d_hi > d_lo)
    fft_pass<true>(sm.planes, f.ax[1], sm.tw + Lh, kPairs * (d_hi - d_lo), 1, [&](int line) {
      return (line % kPairs) * PS + sm.pos[s_lo + line / kPairs] * RS;
    });

  // Store the tile's rows and columns (zero where invalid): re -> channel b, im -> b + 1.
  const int rows = min(crh.step, crh.size - row0), cols = min(crw.step, crw.size - col0);
  const FastDiv cols_div{uint32_t(cols)};
  Out* dst = p.dst + int64_t(bp.n) * crh.size * crw.size * B;
  for (int e = threadIdx.x; e < rows * cols * kPairs; e += kThreads) {
    const int pr = e % kPairs, pix = e / kPairs, b = bp.b0 + 2 * pr;
    if (b >= B) continue;
    const int dr = cols_div.div(pix), dc = pix - dr * cols;
    const int dh = row0 + dr, dw = col0 + dc;
    float2 z = make_float2(0.f, 0.f);
    if (dh >= crh.valid_lo && dh < crh.valid_hi && dw >= crw.valid_lo && dw < crw.valid_hi) {
      z = sm.planes[pr * PS + sm.pos[dr + crh.off] * RS + sm.pos[Lh + dc + crw.off]];
      z = make_float2(z.x * p.scale, z.y * p.scale);
    }
    Out* d = dst + (int64_t(dh) * crw.size + dw) * B + b;
    d[0] = cuda::from_acc<Out>(z.x);
    if (b + 1 < B) d[1] = cuda::from_acc<Out>(z.y);
  }
}

// ---- per-frequency complex GEMM ----------------------------------------------------------------

// C[f] (M, N) = op(A[f]) (M, Kd) x op(B[f]) (Kd, N) for every frequency f, complex64, packed
// batches. A is (M, Kd) row-major, or (Kd, M) when kATrans; B is (Kd, N), or (N, Kd) when
// kBTrans; kConjB conjugates B. accumulate adds to C (batched bwd_filter).
// Block tile (BM, BN) = (64, 64), BK = 16, two shared stages filled by 8-byte cp.async (zero
// fill off the matrix), transposing to (BK, BM) / (BK, BN) on the way. 128 threads as
// (16, 8), each a 4 x 8 complex tile: rows 2ty + {0, 1} + 32 i, columns 2tx + {0, 1} + 16 j,
// so every 16-byte shared load of a warp is contiguous: 128 FMAs per 6 LDS.128.
constexpr int kGemmBM = 64, kGemmBN = 64, kGemmBK = 16, kGemmThreads = 128;

// Issues the copies of a (BK, kW) tile of an operand into tile[kk][w]: rows w0.. of a (W, Kd)
// row-major matrix (kKInner) or columns w0.. of a (Kd, W) one. Consecutive threads take
// consecutive global elements.
template <bool kKInner, int kW>
__device__ __forceinline__ void load_tile(float2 (*tile)[kW + 2], const float2* X, int w0, int W,
                                          int k0, int Kd) {
  constexpr int kInner = kKInner ? kGemmBK : kW, kStep = kGemmThreads / kInner;
  const int in = threadIdx.x % kInner, out0 = threadIdx.x / kInner;
#pragma unroll
  for (int i = 0; i < kGemmBK * kW / kGemmThreads; ++i) {
    const int out = out0 + i * kStep;
    const int k = k0 + (kKInner ? in : out), w = w0 + (kKInner ? out : in);
    const bool valid = w < W && k < Kd;
    const float2* src = X + (kKInner ? int64_t(w) * Kd + k : int64_t(k) * W + w);
    cuda::cp_async8(&tile[kKInner ? in : out][kKInner ? out : in], valid ? src : X, valid);
  }
}

template <bool kATrans, bool kBTrans, bool kConjB>
__global__ void __launch_bounds__(kGemmThreads, 4)
cgemm_kernel(const float2* __restrict__ A, const float2* __restrict__ B, float2* __restrict__ C,
             int M, int N, int Kd, int tiles_m, int tiles_n, bool accumulate) {
  __shared__ __align__(16) float2 As[2][kGemmBK][kGemmBM + 2];  // (stage, BK, BM), padded
  __shared__ __align__(16) float2 Bs[2][kGemmBK][kGemmBN + 2];  // (stage, BK, BN), padded
  const int tn = blockIdx.x % tiles_n, tm = blockIdx.x / tiles_n % tiles_m;
  const int64_t f = blockIdx.x / (int64_t(tiles_n) * tiles_m);
  A += f * M * Kd;
  B += f * Kd * N;
  C += f * M * N;
  const int m0 = tm * kGemmBM, n0 = tn * kGemmBN;
  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
  float2 acc[4][8];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = make_float2(0.f, 0.f);

  const int k_tiles = (Kd + kGemmBK - 1) / kGemmBK;
  auto load = [&](int t) {
    load_tile<!kATrans, kGemmBM>(As[t & 1], A, m0, M, t * kGemmBK, Kd);
    load_tile<kBTrans, kGemmBN>(Bs[t & 1], B, n0, N, t * kGemmBK, Kd);
    cuda::cp_async_commit();
  };
  load(0);
  for (int t = 0; t < k_tiles; ++t) {
    if (t + 1 < k_tiles) {
      load(t + 1);
      cuda::cp_async_wait<1>();
    } else {
      cuda::cp_async_wait<0>();
    }
    __syncthreads();
    const auto& as = As[t & 1];
    const auto& bs = Bs[t & 1];
#pragma unroll
    for (int kk = 0; kk < kGemmBK; ++kk) {
      float2 a[4], b[8];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float4 v = *reinterpret_cast<const float4*>(&as[kk][2 * ty + 32 * i]);
        a[2 * i] = make_float2(v.x, v.y);
        a[2 * i + 1] = make_float2(v.z, v.w);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(&bs[kk][2 * tx + 16 * j]);
        b[2 * j] = make_float2(v.x, kConjB ? -v.y : v.y);
        b[2 * j + 1] = make_float2(v.z, kConjB ? -v.w : v.w);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[i][j].x = fmaf(a[i].x, b[j].x, fmaf(-a[i].y, b[j].y, acc[i][j].x));
          acc[i][j].y = fmaf(a[i].x, b[j].y, fmaf(a[i].y, b[j].x, acc[i][j].y));
        }
    }
    __syncthreads();  // the stage is refilled by the load of tile t + 2
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + 2 * ty + (i & 1) + 32 * (i >> 1);
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int n = n0 + 2 * tx + (j & 1) + 16 * (j >> 1);
      if (n >= N) continue;
      float2* c = C + int64_t(m) * N + n;
      *c = accumulate ? cadd(*c, acc[i][j]) : acc[i][j];
    }
  }
}

// ---- host: plan ----------------------------------------------------------------------------

// Chooses the FFT length L and tile T of one axis for an output extent and filter taps
// (L >= T + taps - 1), or says why the algorithm has none.
using LengthFn = Support (*)(int64_t extent, int64_t taps, int64_t* L, int64_t* T);

struct Plan {
  bool empty = false;  // a zero-size operand: the result is zero
  Fft2d fft;
  int64_t T[2] = {1, 1}, tiles[2] = {1, 1};
  int64_t A = 0;       // planes (n, tile_h, tile_w)
  int64_t batch = 0;   // planes per workspace batch
  int64_t F = 0;       // frequencies Lh * (Lw/2 + 1)
  int64_t workspace = 0;
};

// Transform block: kPairs channel pairs, as many as fit kPairSmemBudget (and as the channels).
inline int pick_pairs(const Fft2d& f, int64_t B) {
  if (B > 6 && transform_smem<4>(f) <= kPairSmemBudget) return 4;
  if (B > 2 && transform_smem<2>(f) <= kPairSmemBudget) return 2;
  return 1;
}

inline Support make_plan(const Args& a, LengthFn choose, Plan* plan) {
  const Problem& p = a.p;
  if (Support s = float_inputs(a); !s.ok) return s;
  if (a.in == DType::kF64 || a.out == DType::kF64)
    return Support::No("float64 is not supported (the FFTs run in float32)");
  if (p.in[0] != 1 || p.filt[0] != 1 || p.out[0] != 1)
    return Support::No("FFT convolution is 2-D only (needs D = T = Z = 1)");
  for (int d = 1; d < 3; ++d)
    if (p.stride[d] != 1 || p.lhs_dil[d] != 1 || p.rhs_dil[d] != 1)
      return Support::No("FFT convolution needs stride 1 and no dilation");
  if (p.G != 1) return Support::No("FFT convolution needs groups == 1");
  *plan = Plan{};
  if (p.x_elems() == 0 || p.w_elems() == 0 || p.y_elems() == 0) {
    plan->empty = true;
    return Support::Yes();
  }
  int64_t L[2];
  for (int d = 0; d < 2; ++d) {
    const int64_t extent = a.dir == Direction::kBwdData ? p.in[1 + d] : p.out[1 + d];
    if (Support s = choose(extent, p.filt[1 + d], &L[d], &plan->T[d]); !s.ok) return s;
    plan->tiles[d] = (extent + plan->T[d] - 1) / plan->T[d];
  }
  const int64_t plane_bytes = int64_t(sizeof(float2)) * L[0] * (L[1] | 1);
  // sm_90's opt-in limit per block (227 KB): a constant, not a device query, so that support
  // and workspace answers are the same on every machine (and without a GPU).
  constexpr int64_t smem_max = 227 * 1024;
  if (plane_bytes + 12 * (L[0] + L[1]) > smem_max)
    return Support::No("FFT plane " + std::to_string(L[0]) + "x" + std::to_string(L[1]) +
                       " does not fit one block's shared memory (" +
                       std::to_string(smem_max / 1024) + " KB); use fft_tiling");
  plan->fft = make_fft(int(L[0]), int(L[1]));
  plan->A = p.N * plan->tiles[0] * plan->tiles[1];
  plan->F = L[0] * (L[1] / 2 + 1);
  const int64_t per_plane = plan->F * (p.C + p.K) * int64_t(sizeof(float2));
  plan->batch = std::max<int64_t>(1, std::min(plan->A, kBatchBytes / per_plane));
  plan->workspace = align256(plan->F * p.C * p.K * int64_t(sizeof(float2))) +
                    align256(plan->F * plan->batch * p.C * int64_t(sizeof(float2))) +
                    align256(plan->F * plan->batch * p.K * int64_t(sizeof(float2)));
  if (plan->workspace > kMaxWorkspace)
    return Support::No("FFT workspace " + std::to_string(plan->workspace >> 20) +
                       " MB exceeds " + std::to_string(kMaxWorkspace >> 20) +
                       " MB (the C x K filter spectrum)");
  // Kernels index planes, channels, rows and blocks in 32 bits (element offsets in 64).
  const int64_t gemm_blocks = plan->F * ((std::max(plan->batch, p.C) + kGemmBM - 1) / kGemmBM) *
                              ((std::max(p.C, p.K) + kGemmBN - 1) / kGemmBN);
  int64_t biggest = std::max({plan->A, p.C * p.K, gemm_blocks, plan->T[0] * plan->tiles[0],
                              plan->T[1] * plan->tiles[1]});
  for (int d = 1; d < 3; ++d)
    biggest = std::max({biggest, p.in[d], p.out[d], std::abs(p.pad_lo[d]),
                        std::abs(p.pad_hi[d])});
  if (biggest >= (int64_t(1) << 30)) return Support::No("problem too large for 32-bit indices");
  return Support::Yes();
}

// ---- host: launches ---------------------------------------------------------------------------

template <int kPairs, typename In>
Status launch_forward(const ForwardArgs<In>& args, cudaStream_t stream) {
  auto kernel = forward_kernel<In, kPairs>;
  const int64_t smem = transform_smem<kPairs>(args.fft);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) !=
      cudaSuccess)
    return cuda::check_launch("conv fft forward_kernel (shared memory)");
  kernel<<<unsigned(int64_t(args.planes.groups) * args.planes.count), kThreads, smem, stream>>>(
      args);
  return cuda::check_launch("conv fft forward_kernel");
}

template <int kPairs, typename Out>
Status launch_inverse(const InverseArgs<Out>& args, cudaStream_t stream) {
  auto kernel = inverse_kernel<Out, kPairs>;
  const int64_t smem = transform_smem<kPairs>(args.fft);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) !=
      cudaSuccess)
    return cuda::check_launch("conv fft inverse_kernel (shared memory)");
  kernel<<<unsigned(int64_t(args.planes.groups) * args.planes.count), kThreads, smem, stream>>>(
      args);
  return cuda::check_launch("conv fft inverse_kernel");
}

// Planes a0 .. a0 + count - 1 of an image tensor (x, dy, y, dx: planes are (n, tile)), or the
// single plane of the filter (w, dw: B = C * K channels).
inline Planes make_planes(const Plan& pl, int pairs, int64_t a0, int64_t count, int64_t B,
                          bool image) {
  return Planes{{image ? int(pl.tiles[0]) : 1, image ? int(pl.tiles[1]) : 1},
                int(a0), int(count), int(B), int((B + 2 * pairs - 1) / (2 * pairs))};
}

template <typename In>
Status forward(const Plan& pl, const In* src, float2* spec, const Window (&win)[2], int64_t a0,
               int64_t count, int64_t B, bool image, cudaStream_t stream) {
  const int pairs = pick_pairs(pl.fft, B);
  const ForwardArgs<In> args{src, spec, pl.fft, {win[0], win[1]},
                             make_planes(pl, pairs, a0, count, B, image)};
  switch (pairs) {
    case 4: return launch_forward<4>(args, stream);
    case 2: return launch_forward<2>(args, stream);
    default: return launch_forward<1>(args, stream);
  }
}

template <typename Out>
Status inverse(const Plan& pl, const float2* spec, Out* dst, const Crop (&crop)[2], int64_t a0,
               int64_t count, int64_t B, bool image, cudaStream_t stream) {
  const int pairs = pick_pairs(pl.fft, B);
  const float scale = float(1.0 / (double(pl.fft.ax[0].L) * pl.fft.ax[1].L));
  const InverseArgs<Out> args{spec, dst, pl.fft, {crop[0], crop[1]},
                              make_planes(pl, pairs, a0, count, B, image), scale};
  switch (pairs) {
    case 4: return launch_inverse<4>(args, stream);
    case 2: return launch_inverse<2>(args, stream);
    default: return launch_inverse<1>(args, stream);
  }
}

template <bool kATrans, bool kBTrans, bool kConjB>
Status gemm(const Plan& pl, const float2* A, const float2* B, float2* C, int64_t M, int64_t N,
            int64_t Kd, bool accumulate, cudaStream_t stream) {
  const int64_t tiles_m = (M + kGemmBM - 1) / kGemmBM, tiles_n = (N + kGemmBN - 1) / kGemmBN;
  cgemm_kernel<kATrans, kBTrans, kConjB>
      <<<unsigned(tiles_m * tiles_n * pl.F), kGemmThreads, 0, stream>>>(
          A, B, C, int(M), int(N), int(Kd), int(tiles_m), int(tiles_n), accumulate);
  return cuda::check_launch("conv fft cgemm_kernel");
}

// ---- host: the three directions -------------------------------------------------------------

template <typename In, typename Out>
Status run_typed(const Plan& pl, const Args& a, const Buffers& buf, void* workspace,
                 cudaStream_t stream) {
  const Problem& p = a.p;
  const int64_t C = p.C, K = p.K, F = pl.F;
  const int H = int(p.in[1]), W = int(p.in[2]), R = int(p.filt[1]), S = int(p.filt[2]);
  const int P = int(p.out[1]), Q = int(p.out[2]);
  const int Lh = pl.fft.ax[0].L, Lw = pl.fft.ax[1].L, Th = int(pl.T[0]), Tw = int(pl.T[1]);
  const int plo_h = int(p.pad_lo[1]), plo_w = int(p.pad_lo[2]);
  const In* x = static_cast<const In*>(buf.x);
  const In* w = static_cast<const In*>(buf.w);
  const In* y = static_cast<const In*>(buf.y);
  char* ws = static_cast<char*>(workspace);
  float2* wspec = reinterpret_cast<float2*>(ws);  // (F, C, K): W, or DW
  float2* spec_c = reinterpret_cast<float2*>(ws + align256(F * C * K * int64_t(sizeof(float2))));
  float2* spec_k = reinterpret_cast<float2*>(
      reinterpret_cast<char*>(spec_c) + align256(F * pl.batch * C * int64_t(sizeof(float2))));
  // x windows (fwd, bwd_filter) and the filter window (whole filter at the origin).
  const Window x_win[2] = {{H, Th, -plo_h, Lh}, {W, Tw, -plo_w, Lw}};
  const Window w_win[2] = {{R, 0, 0, Lh}, {S, 0, 0, Lw}};
  Status st;
  auto ok = [&](Status s) { st = std::move(s); return st.ok(); };

  if (a.dir != Direction::kBwdFilter &&
      !ok(forward(pl, w, wspec, w_win, 0, 1, C * K, false, stream)))
    return st;
  for (int64_t a0 = 0; a0 < pl.A; a0 += pl.batch) {
    const int64_t n = std::min(pl.batch, pl.A - a0);
    switch (a.dir) {
      case Direction::kFwd: {
        const Crop y_crop[2] = {{P, Th, 0, 0, P}, {Q, Tw, 0, 0, Q}};
        if (!ok(forward(pl, x, spec_c, x_win, a0, n, C, true, stream)) ||
            !ok(gemm<false, false, true>(pl, spec_c, wspec, spec_k, n, K, C, false, stream)) ||
            !ok(inverse(pl, spec_k, static_cast<Out*>(buf.result), y_crop, a0, n, K, true, stream)))
          return st;
        break;
      }
      case Direction::kBwdData: {
        const Window dy_win[2] = {{P, Th, plo_h - (R - 1), Lh}, {Q, Tw, plo_w - (S - 1), Lw}};
        const Crop dx_crop[2] = {
            {H, Th, R - 1, std::max(0, -plo_h), std::min(H, H + int(p.pad_hi[1]))},
            {W, Tw, S - 1, std::max(0, -plo_w), std::min(W, W + int(p.pad_hi[2]))}};
        if (!ok(forward(pl, y, spec_k, dy_win, a0, n, K, true, stream)) ||
            !ok(gemm<false, true, false>(pl, spec_k, wspec, spec_c, n, C, K, false, stream)) ||
            !ok(inverse(pl, spec_c, static_cast<Out*>(buf.result), dx_crop, a0, n, C, true,
                        stream)))
          return st;
        break;
      }
      case Direction::kBwdFilter: {
        const Window dy_win[2] = {{P, Th, 0, Th}, {Q, Tw, 0, Tw}};
        if (!ok(forward(pl, x, spec_c, x_win, a0, n, C, true, stream)) ||
            !ok(forward(pl, y, spec_k, dy_win, a0, n, K, true, stream)) ||
            !ok(gemm<true, false, true>(pl, spec_c, spec_k, wspec, C, K, n, a0 > 0, stream)))
          return st;
        break;
      }
    }
  }
  if (a.dir == Direction::kBwdFilter) {
    const Crop dw_crop[2] = {{R, R, 0, 0, R}, {S, S, 0, 0, S}};
    return inverse(pl, wspec, static_cast<Out*>(buf.result), dw_crop, 0, 1, C * K, false, stream);
  }
  return st;
}

inline Status run(const Plan& pl, const Args& a, const Buffers& buf, void* workspace,
                  cudaStream_t stream) {
  if (pl.empty) {
    const Problem& p = a.p;
    const int64_t elems = a.dir == Direction::kFwd       ? p.y_elems()
                          : a.dir == Direction::kBwdData ? p.x_elems()
                                                         : p.w_elems();
    if (elems > 0 &&
        cudaMemsetAsync(buf.result, 0, elems * dtype_bytes(a.out), stream) != cudaSuccess)
      return cuda::check_launch("conv fft zero result");
    return Status::Ok();
  }
  Status st = Status::Error(std::string("conv fft: unsupported dtypes ") + dtype_name(a.in) +
                            " -> " + dtype_name(a.out));
  dispatch_io(a.in, a.out, [&](auto in_tag, auto out_tag) {
    using In = cuda::device_t<decltype(in_tag)>;
    using Out = cuda::device_t<decltype(out_tag)>;
    if constexpr (!std::is_same_v<In, double>)
      st = run_typed<In, Out>(pl, a, buf, workspace, stream);
  });
  return st;
}

// The CudaAlgorithm entry points of an FFT algorithm whose per-axis plan is kChoose.
template <LengthFn kChoose>
struct Algorithm {
  static Support supports(const Args& a) {
    Plan pl;
    return make_plan(a, kChoose, &pl);
  }
  static int64_t workspace_bytes(const Args& a) {
    Plan pl;
    return make_plan(a, kChoose, &pl).ok ? pl.workspace : 0;
  }
  static Status run(const Args& a, const Buffers& b, void* workspace, cudaStream_t stream) {
    Plan pl;
    const Support s = make_plan(a, kChoose, &pl);
    if (!s.ok) return Status::Error("conv fft: " + s.reason);
    return fft::run(pl, a, b, workspace, stream);
  }
};

}  // namespace jaxdnn::conv::fft
