// CUDA depthwise convolution: groups == C with one input channel per group (Cg == 1) and any
// channel multiplier Kg = K / C (output channel k = c*Kg + j reads input channel c), in all three
// directions, for 1-D and 2-D problems (3-D when the depth axis has no window), any stride,
// padding (negative too) and filter dilation. Input (lhs) dilation is not handled.
//
// One core computes a depthwise correlation of a source tensor into a destination tensor, both
// channels-last images, (n, i_h, i_w) being read by destination (n, o_h, o_w) through tap (r, s):
//   fwd        src = x, dst = y. Destination channel k reads x channel k / Kg, filter column k.
//   bwd_data   src = dy, dst = dx. Stride 1: the forward correlation with the filter flipped and
//              pad' = (R-1)*dil - pad (same kernels, fast path included). Stride > 1: the
//              gather form, dy position (o + pad - f*dil) / stride where it divides (generic
//              path). Kg > 1 runs Kg passes over the tile (generic path); pass j adds dy
//              channel c*Kg + j.
//   bwd_filter dw(tap, k) = sum over (n, p, q) of x(window) * dy(n, p, q, k): each block
//              accumulates a contiguous slab of (image, tile) work items in registers, reduces
//              its thread groups in a fixed order through shared memory and writes one partial
//              per (tap, channel) to the workspace; a second kernel adds the partials in block
//              order. No atomics anywhere: results are bitwise reproducible.
// The depth axis folds into the batch (it must have T == 1, stride 1, no padding), and when the
// filter has one row the image rows fold into one tall image (a 1-D problem is one long row).
//
// Block tile: kSlice = 16 channels x (TH, TW) destination positions. The source window of the
// tile is staged in shared memory in the source type, channels innermost (16-bit values become
// float as they are read: a shift or a mask per value, against up to 7 FMAs per value):
//   tile    (span_h, pitch, kSlice)   span = (tile-1)*stride + (taps-1)*dil + 1, pitch = span_w
//                                     rounded up to odd, so that rows one apart fall in opposite
//                                     halves of the banks (conflict-free 16-byte loads)
//   filter  (R*S, kSlice)             taps of the slice (flipped for stride-1 bwd_data)
// Staging is a copy of 16-byte vectors (8 bf16/f16, 4 f32, 2 f64) by cp.async with zero fill
// when the channel map is the identity (every load of a thread in flight, no registers, no
// index division per vector); scalar loads when Kg > 1. Threads: lane fastest (V = 16 bytes
// of accumulators, 4 floats or 2 doubles: 4 or 8 lanes cover the slice).
//   fwd / bwd_data  thread = (lane, row tr of TR, column group of WG): outputs at rows tr and
//       tr + TR (kHt = 2; quarter-warp neighbours read adjacent rows) by WT columns, WT = 7 or 8
//       (7 tiles the 112/56/28/14/7-wide maps of ImageNet networks exactly and keeps WG = 8
//       warps full; 8 the power-of-two widths): (kHt, WT, V) accumulators, 56 or 64. Fast path
//       (S = 3, 5, 7 with W stride 1; S = 3, 5 with W stride 2; W dilation 1): per filter row
//       the S weight vectors sit in registers and each of the (WT-1)*stride + S source columns
//       is loaded once and feeds every output it touches. Generic path: one shared load per
//       (output, tap), runtime taps, strides and dilations.
//   bwd_filter  thread = (lane, task = filter row [x tap group of 8 in the generic path],
//       group of items): per item (one dy row by WT columns of the tile) the WT dy vectors sit
//       in registers and each x column of the row is loaded once: (S, V) accumulators. 16-bit
//       tiles are double-buffered: the copies of item k + 1 fly while item k computes.
// The host picks the variant (WT) and the tile (WG <= 8, TR or TH) per problem by a cost model:
// computed positions (idle lanes of a partial warp included) plus a quarter per staged
// position, within a 72 KB shared-memory budget (3 blocks per SM on the H200); with 16-bit
// tiles the fwd / bwd_data blocks stop at 128 threads, so that four fit the registers.
//
// Plans and cost of the benchmark shapes (N=64, 56x56; bf16 moves 2 bytes an element, f32 4):
//   (a) C=144 3x3 pad 1: 0.52 GFLOP against 116 MB (bf16) / 231 MB (f32) of the two big
//       tensors: memory bound. fwd/bwd_data: WT 7, 28x28 tiles, 224 threads, 60 KB in f32 (bf16:
//       8x56, 128 threads, 19 KB); the staged halo (1.15x) mostly hits L2. bwd_filter: 8x56
//       tiles, 192 threads, 117 slabs per slice, 0.6 MB of partials. At 3-4 TB/s: bf16 30-40
//       us = 13-17 TFLOP/s, f32 60-75 us = 7-9 TFLOP/s, every direction.
//   (b) C=96 7x7 pad 3: 1.89 GFLOP against 77 MB (bf16): bound by shared-memory bandwidth.
//       fwd/bwd_data: WT 7, 8x56 tiles, 128 threads, 31 KB in bf16 (4 blocks, 16 warps per
//       SM; 60 KB in f32, 3 blocks); per thread and filter row 7 weight
//       + 2*13 source 16-byte loads feed 392 FMAs: 4 wavefronts per 11.9 FMA issues, a 74%
//       ceiling on FMA issue (50 TFLOP/s); predicted 30-40 TFLOP/s, bf16 and f32 alike.
//       bwd_filter: 14x28 tiles, 224 threads, 176 slabs, 3.3 MB of partials, bf16 tiles
//       double-buffered in 69 KB (95 registers: 2 blocks per SM); 7 dy + 13 x loads
//       per 196 FMAs, a 61% ceiling; predicted 20-25 TFLOP/s.
//   XLA/cuDNN on H200 (TFLOP/s, bf16 / f32): (a) fwd 5.3/4.4, bwd_data 7.0/5.3, bwd_filter
//   4.5/4.2; (b) fwd 9.0/4.2, bwd_data 26.2/16.8, bwd_filter 10.5/0.3.
//   Measured (H200, N=64, TFLOP/s ours vs XLA the same run; the 3x3 layer runs on
//   depthwise_3x3 by default): (b) with 16-bit tiles (session 11, two A/B runs of layers 11-12)
//   bf16 fwd 16.6-17.5 vs 10.2-10.7, bwd_data 16.2-16.7 vs 10.3-10.6 (float tiles: 11.8-14.3),
//   bwd_filter 12.1-13.7 vs 11-13 (ncu 144 -> 103 us; 64% of issue slots busy: near
//   issue-bound); f32 fwd/bwd_data 12-14.5 vs 4.5, bwd_filter ~10 vs 0.3. Earlier, (a) on this
//   kernel: bf16 3.0 vs 3.7 fwd: the float staging, not HBM, was its limit.

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "cc/common/cuda_async.h"
#include "cc/common/cuda_util.h"
#include "cc/common/cuda_vec.h"
#include "cc/conv/cuda_algorithms.h"
#include "cc/conv/cuda_partial_sum.cuh"

namespace jaxdnn::conv {
namespace {

using cuda::dev_acc_t;
using cuda::device_t;
using cuda::from_acc;
using cuda::to_acc;
using cuda::Vec;

constexpr int kSlice = 16;        // channels per block
constexpr int kHt = 2;            // destination rows per thread (fwd, bwd_data)
constexpr int kTapGroup = 8;      // filter taps per thread in the generic bwd_filter path
constexpr int kMaxThreads = 256;  // threads per block, at most
constexpr int kHalfTileThreads = 128;  // fwd / bwd_data threads per block with 16-bit tiles
constexpr int64_t kSmemBudget = 72 * 1024;  // tiles shrink to fit: 3 blocks per H200 SM
constexpr int64_t kSmemLimit = 96 * 1024;   // a problem whose smallest tile needs more: No
constexpr int64_t kFilterBlocks = 1056;     // bwd_filter blocks to aim for (8 per H200 SM)

__host__ __device__ constexpr int floor_div(int a, int b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// One spatial axis of the core's correlation. Forward form: destination o reads source
// o*stride - pad + f*dil through tap f. Transposed form (bwd_data, stride > 1): destination o
// reads source (o + pad - f*dil) / stride where that divides.
struct Axis {
  int src, dst;  // extents of the source and destination tensors
  int stride, dil, pad, taps;
  int tile;  // destination positions per block tile
  int span;  // source positions staged per tile

  // The first source position staged for the tile whose first destination position is o0.
  template <bool kTransposed>
  __host__ __device__ int base(int o0) const {
    if constexpr (kTransposed) return floor_div(o0 + pad - (taps - 1) * dil, stride);
    else return o0 * stride - pad;
  }
  // Transposed form: destination o0 + o through tap f reads staged source (o + offset - f*dil)
  // / stride, where offset (>= (taps-1)*dil, so the numerator is never negative) is this.
  __device__ int offset(int o0, int src0) const { return o0 + pad - src0 * stride; }
};

// Destination tiles of a launch.
struct Tiling {
  Axis h, w;
  int tiles_h, tiles_w, slices;
  int pitch;  // shared-memory positions per staged source row (odd)
};

// A staged tensor (n, h.src, w.src, c). Destination channel d of pass j reads source channel
// (d*chan_mul + j) / chan_div; vec: the map is the identity and 16-byte loads are legal.
struct Source {
  int c, chan_mul, chan_div;
  bool vec;
};

struct ConvGeom {  // fwd and bwd_data: dst (n, h.dst, w.dst, dst_c) from src
  Tiling t;
  Source src;
  int dst_c, K, passes;  // K: filter row length; filter column of (d, pass j) is d*chan_mul + j
  bool flip;             // taps in reverse order (stride-1 bwd_data)
  bool vec_dst;          // V-channel stores are aligned
};

struct FilterGeom {  // bwd_filter: dw (R*S, K) from x (the source) and dy (the tiles)
  Tiling t;
  Source x, dy;
  int K, items, chunks;   // work items: (image, tile) pairs, split into `chunks` slabs
  int sgroups, tasks;     // tap groups per filter row; tasks = R * sgroups
  int groups;             // thread groups sharing a tile's items
  int pitch_dy;           // shared-memory positions per dy row (odd)
};

// bwd_filter's tile buffers for inputs of `bytes` per value: two for the 16-bit types (item
// k + 1 copies in while item k computes). Float32 tiles, twice the bytes, would shrink within
// the budget until the halo cost more than the overlap saves (7x7: 8x14 tiles, -20%).
__host__ __device__ constexpr int tile_buffers(int64_t bytes) { return bytes == 2 ? 2 : 1; }

// ---- device pieces shared by the kernels ----------------------------------------------------

template <typename Acc>
__device__ __forceinline__ void fma_vec(Acc* acc, const Vec<Acc>& x, const Vec<Acc>& w) {
#pragma unroll
  for (int e = 0; e < Vec<Acc>::kN; ++e) acc[e] += x.v[e] * w.v[e];
}

// The V accumulator-type values of a staged tile at p: one 16-byte shared load in the
// accumulator's own type, 8 bytes of a 16-bit type converted here (a shift or a mask per value
// for bfloat16, which the 7 FMAs per value of a 7-tap filter row hide).
template <typename In>
__device__ __forceinline__ Vec<dev_acc_t<In>> load_acc(const In* p) {
  using Acc = dev_acc_t<In>;
  if constexpr (std::is_same_v<In, Acc>) {
    return Vec<Acc>::load(p);
  } else {
    const uint2 r = *reinterpret_cast<const uint2*>(p);
    const float2 lo = cuda::unpack_acc<In>(r.x), hi = cuda::unpack_acc<In>(r.y);
    return Vec<Acc>{{lo.x, lo.y, hi.x, hi.y}};
  }
}

// Stages the (rows, cols) window at source position (r0, c0) of one image, destination
// channels [d0, d0 + kSlice) of pass j, into tile (rows, pitch, kSlice) of the source type;
// zeros outside the image and for channels >= dst_c. Vector path: 16-byte cp.async copies,
// left in flight for the caller to wait for. A thread's vectors are nt apart, so its channel
// part is fixed and its (row, col) walks by a constant step with one carry: no per-vector
// division.
template <typename In>
__device__ void stage_tile(In* tile, const In* img, const Source& s, int src_h, int src_w, int r0,
                           int c0, int rows, int cols, int pitch, int d0, int dst_c, int j) {
  const int tid = threadIdx.x, nt = blockDim.x;
  if (s.vec) {
    constexpr int kVL = Vec<In>::kN, kParts = kSlice / kVL;  // kParts divides nt (lanes)
    const int part = tid % kParts, step = nt / kParts, dr = step / cols, dc = step % cols;
    const int d = d0 + part * kVL;
    const bool chan_ok = d < dst_c;
    In* at = tile + part * kVL;
    for (int row = tid / kParts / cols, col = tid / kParts % cols; row < rows;) {
      const int gr = r0 + row, gc = c0 + col;
      const bool ok = chan_ok && gr >= 0 && gr < src_h && gc >= 0 && gc < src_w;
      cuda::cp_async16(at + (row * pitch + col) * kSlice,
                       ok ? img + (int64_t(gr) * src_w + gc) * s.c + d : img, ok);
      col += dc, row += dr;
      if (col >= cols) col -= cols, ++row;
    }
  } else {
    const int total = rows * cols * kSlice;
    for (int i = tid; i < total; i += nt) {
      const int kk = i % kSlice, pos = i / kSlice, row = pos / cols, col = pos - row * cols;
      const int gr = r0 + row, gc = c0 + col, d = d0 + kk;
      In v = from_acc<In>(0.f);
      if (gr >= 0 && gr < src_h && gc >= 0 && gc < src_w && d < dst_c)
        v = img[(int64_t(gr) * src_w + gc) * s.c + (d * s.chan_mul + j) / s.chan_div];
      tile[(row * pitch + col) * kSlice + kk] = v;
    }
  }
}

// V consecutive destination channels, `valid` of them inside the tensor.
template <typename Out, int V>
struct alignas(sizeof(Out) * V) OutPack {
  Out v[V];
};

template <typename Out, int V, typename Acc>
__device__ __forceinline__ void store_out(Out* p, const Acc* v, int valid, bool vec) {
  if (vec && valid >= V) {
    OutPack<Out, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = from_acc<Out>(v[e]);
    *reinterpret_cast<OutPack<Out, V>*>(p) = o;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e)
      if (e < valid) p[e] = from_acc<Out>(v[e]);
  }
}

// ---- fwd / bwd_data ---------------------------------------------------------------------------

// Adds the tile's contribution to this thread's outputs: rows tr and tr + TR, columns
// tw0 .. tw0 + kWt - 1 of the tile, lane's V channels. tile and wts point at the lane's channels.
template <int kS, int kSW, int kWt, bool kTransposed, typename In, typename Acc>
__device__ __forceinline__ void conv_accumulate(const In* tile, const Acc* wts, const Tiling& t,
                                                int e_h, int e_w, int tr, int tw0,
                                                Acc (&acc)[kHt][kWt][Vec<Acc>::kN]) {
  using VA = Vec<Acc>;
  const Axis &ah = t.h, &aw = t.w;
  const int TR = ah.tile / kHt, S = aw.taps, ld = t.pitch * kSlice;
  for (int r = 0; r < ah.taps; ++r) {
    if constexpr (kTransposed) {
#pragma unroll
      for (int h = 0; h < kHt; ++h) {
        const int u = tr + h * TR + e_h - r * ah.dil;
        if (u % ah.stride != 0) continue;
        const In* row = tile + (u / ah.stride) * ld;
        for (int s = 0; s < S; ++s) {
          const VA wv = VA::load(wts + (r * S + s) * kSlice);
#pragma unroll
          for (int i = 0; i < kWt; ++i) {
            const int v = tw0 + i + e_w - s * aw.dil;
            if (v % aw.stride == 0) fma_vec(acc[h][i], load_acc(row + v / aw.stride * kSlice), wv);
          }
        }
      }
    } else if constexpr (kS > 0) {
      VA wv[kS];
#pragma unroll
      for (int s = 0; s < kS; ++s) wv[s] = VA::load(wts + (r * kS + s) * kSlice);
#pragma unroll
      for (int h = 0; h < kHt; ++h) {
        const In* row = tile + ((tr + h * TR) * ah.stride + r * ah.dil) * ld + tw0 * kSW * kSlice;
#pragma unroll
        for (int c = 0; c < (kWt - 1) * kSW + kS; ++c) {  // each source column once
          const VA x = load_acc(row + c * kSlice);
#pragma unroll
          for (int s = 0; s < kS; ++s) {
            const int d = c - s;  // output i reads column i*kSW + s
            if (d >= 0 && d % kSW == 0 && d / kSW < kWt) fma_vec(acc[h][d / kSW], x, wv[s]);
          }
        }
      }
    } else {
      for (int s = 0; s < S; ++s) {
        const VA wv = VA::load(wts + (r * S + s) * kSlice);
#pragma unroll
        for (int h = 0; h < kHt; ++h) {
          const In* row =
              tile + ((tr + h * TR) * ah.stride + r * ah.dil) * ld + s * aw.dil * kSlice;
#pragma unroll
          for (int i = 0; i < kWt; ++i)
            fma_vec(acc[h][i], load_acc(row + (tw0 + i) * aw.stride * kSlice), wv);
        }
      }
    }
  }
}

// One block: one image, one (TH, TW) tile of destination positions, one channel slice.
template <typename In, typename Out, int kS, int kSW, int kWt, bool kTransposed>
__global__ void __launch_bounds__(kMaxThreads, 2)
depthwise_conv_kernel(ConvGeom g, const In* __restrict__ src, const In* __restrict__ w,
                      Out* __restrict__ dst) {
  using Acc = dev_acc_t<In>;
  constexpr int V = Vec<Acc>::kN, kLanes = kSlice / V;
  extern __shared__ __align__(16) unsigned char smem[];
  const Tiling& t = g.t;
  In* tile = reinterpret_cast<In*>(smem);                                 // (span, pitch, kSlice)
  Acc* wts = reinterpret_cast<Acc*>(tile + t.h.span * t.pitch * kSlice);  // (R*S, kSlice)

  int b = blockIdx.x;  // (n, tile row, tile column, slice), slice fastest
  const int slice = b % t.slices;
  b /= t.slices;
  const int bw = b % t.tiles_w;
  b /= t.tiles_w;
  const int bh = b % t.tiles_h, n = b / t.tiles_h;
  const int lane = threadIdx.x % kLanes, rest = threadIdx.x / kLanes;
  const int TR = t.h.tile / kHt, tr = rest % TR, tw0 = rest / TR * kWt;
  const int o0h = bh * t.h.tile, o0w = bw * t.w.tile, d0 = slice * kSlice;
  const int r0 = t.h.base<kTransposed>(o0h), c0 = t.w.base<kTransposed>(o0w);
  const int e_h = t.h.offset(o0h, r0), e_w = t.w.offset(o0w, c0);
  const In* img = src + int64_t(n) * t.h.src * t.w.src * g.src.c;
  const int taps = t.h.taps * t.w.taps;

  Acc acc[kHt][kWt][V] = {};
  const int passes = kS > 0 ? 1 : g.passes;  // the host sends Kg > 1 bwd_data to kS == 0
  for (int j = 0; j < passes; ++j) {
    if (j > 0) __syncthreads();  // the previous pass is done with the tile
    stage_tile(tile, img, g.src, t.h.src, t.w.src, r0, c0, t.h.span, t.w.span, t.pitch, d0,
               g.dst_c, j);
    cuda::cp_async_wait_all();
    for (int i = threadIdx.x; i < taps * kSlice; i += blockDim.x) {
      const int tap = g.flip ? taps - 1 - i / kSlice : i / kSlice, d = d0 + i % kSlice;
      wts[i] = d < g.dst_c ? Acc(to_acc(w[int64_t(tap) * g.K + d * g.src.chan_mul + j])) : Acc(0);
    }
    __syncthreads();
    conv_accumulate<kS, kSW, kWt, kTransposed>(tile + lane * V, wts + lane * V, t, e_h, e_w, tr,
                                               tw0, acc);
  }

  const int dc = d0 + lane * V;
#pragma unroll
  for (int h = 0; h < kHt; ++h) {
    const int oh = o0h + tr + h * TR;
#pragma unroll
    for (int i = 0; i < kWt; ++i) {
      const int ow = o0w + tw0 + i;
      if (oh < t.h.dst && ow < t.w.dst)
        store_out<Out, V>(dst + ((int64_t(n) * t.h.dst + oh) * t.w.dst + ow) * g.dst_c + dc,
                          acc[h][i], g.dst_c - dc, g.vec_dst);
    }
  }
}

// ---- bwd_filter -------------------------------------------------------------------------------

// One block: a slab of work items (image, tile) of one channel slice; writes the slab's partial
// dw (R*S, kSlice) to partial[blockIdx.x].
template <typename In, int kS, int kSW, int kWt>
__global__ void __launch_bounds__(kMaxThreads, 2)
depthwise_filter_kernel(FilterGeom g, const In* __restrict__ x, const In* __restrict__ dy,
                        dev_acc_t<In>* __restrict__ partial) {
  using Acc = dev_acc_t<In>;
  using VA = Vec<Acc>;
  constexpr int V = VA::kN, kLanes = kSlice / V;
  constexpr int kA = kS > 0 ? kS : kTapGroup;  // taps per thread: one filter row's (or a group)
  extern __shared__ __align__(16) unsigned char smem[];
  const Tiling& t = g.t;
  const Axis &ah = t.h, &aw = t.w;
  constexpr int kBuffers = tile_buffers(sizeof(In));  // of (x tile, dy tile)
  const int x_elems = ah.span * t.pitch * kSlice;
  const int buf_elems = x_elems + ah.tile * g.pitch_dy * kSlice;
  // [buffers][(h.span, pitch) + (h.tile, pitch_dy)][kSlice]
  In* const bufs = reinterpret_cast<In*>(smem);

  const int slice = blockIdx.x % t.slices, chunk = blockIdx.x / t.slices, d0 = slice * kSlice;
  const int lane = threadIdx.x % kLanes, rest = threadIdx.x / kLanes;
  const int task = rest % g.tasks, grp = rest / g.tasks;
  const int r = task / g.sgroups, s0 = task % g.sgroups * kA;
  const int first = int(int64_t(chunk) * g.items / g.chunks);
  const int last = int(int64_t(chunk + 1) * g.items / g.chunks);
  const int WG = aw.tile / kWt, tile_items = ah.tile * WG, S = aw.taps;
  // Starts the copies of an item's x and dy tiles into buffer b.
  auto stage_item = [&](int item, int b) {
    const int bw = item % t.tiles_w, bh = item / t.tiles_w % t.tiles_h;
    const int n = item / (t.tiles_w * t.tiles_h);
    const int o0h = bh * ah.tile, o0w = bw * aw.tile;
    In* xt = bufs + b * buf_elems;
    stage_tile(xt, x + int64_t(n) * ah.src * aw.src * g.x.c, g.x, ah.src, aw.src,
               ah.base<false>(o0h), aw.base<false>(o0w), ah.span, aw.span, t.pitch, d0, g.K, 0);
    stage_tile(xt + x_elems, dy + int64_t(n) * ah.dst * aw.dst * g.K, g.dy, ah.dst, aw.dst, o0h,
               o0w, ah.tile, aw.tile, g.pitch_dy, d0, g.K, 0);
    cuda::cp_async_commit();
  };

  Acc acc[kA][V] = {};
  if (first < last) stage_item(first, 0);
  for (int item = first, b = 0; item < last; ++item, b ^= kBuffers - 1) {
    if (kBuffers == 2 && item + 1 < last) {
      stage_item(item + 1, b ^ 1);  // its buffer's readers finished at the last barrier
      cuda::cp_async_wait<1>();
    } else {
      cuda::cp_async_wait<0>();
    }
    __syncthreads();  // this item's tiles are visible to every thread
    const In* xt = bufs + b * buf_elems;
    const In* dyt = xt + x_elems;
    for (int it = grp; it < tile_items; it += g.groups) {
      const int th = it % ah.tile, tw0 = it / ah.tile * kWt;
      VA d[kWt];
#pragma unroll
      for (int i = 0; i < kWt; ++i)
        d[i] = load_acc(dyt + ((th * g.pitch_dy + tw0 + i) * kSlice + lane * V));
      const In* row = xt + (th * ah.stride + r * ah.dil) * t.pitch * kSlice + lane * V;
      if constexpr (kS > 0) {
        row += tw0 * kSW * kSlice;
#pragma unroll
        for (int c = 0; c < (kWt - 1) * kSW + kS; ++c) {  // each x column once
          const VA xv = load_acc(row + c * kSlice);
#pragma unroll
          for (int s = 0; s < kS; ++s) {
            const int e = c - s;  // dy column i meets x column i*kSW + s
            if (e >= 0 && e % kSW == 0 && e / kSW < kWt) fma_vec(acc[s], xv, d[e / kSW]);
          }
        }
      } else {
#pragma unroll
        for (int a = 0; a < kA; ++a) {
          if (s0 + a >= S) break;
#pragma unroll
          for (int i = 0; i < kWt; ++i)
            fma_vec(acc[a], load_acc(row + ((tw0 + i) * aw.stride + (s0 + a) * aw.dil) * kSlice),
                    d[i]);
        }
      }
    }
    __syncthreads();  // every thread is done with buffer b before the next item refills it
    if (kBuffers == 1 && item + 1 < last) stage_item(item + 1, 0);
  }

  // Thread groups add up in group order through shared memory: red (groups, R*S, kSlice).
  const int taps = ah.taps * S;
  Acc* red = reinterpret_cast<Acc*>(smem);
  if (first >= last) __syncthreads();  // (otherwise the loop's last barrier did)
#pragma unroll
  for (int a = 0; a < kA; ++a)
    if (s0 + a < S)
#pragma unroll
      for (int e = 0; e < V; ++e)
        red[((grp * taps) + r * S + s0 + a) * kSlice + lane * V + e] = acc[a][e];
  __syncthreads();
  Acc* out = partial + int64_t(blockIdx.x) * taps * kSlice;
  for (int i = threadIdx.x; i < taps * kSlice; i += blockDim.x) {
    Acc sum = 0;
    for (int p = 0; p < g.groups; ++p) sum += red[p * taps * kSlice + i];
    out[i] = sum;
  }
}

// Where output o = (slice, tap, channel of the slice) of a chunk's partials goes in dw (tap, K).
struct SliceIndex {
  int taps, K;
  __device__ int64_t operator()(int o) const {
    const int st = o / kSlice, k = st / taps * kSlice + o % kSlice;
    return k < K ? int64_t(st % taps) * K + k : -1;
  }
};

// ---- host side: problem view, tile plans, launches --------------------------------------------

// The problem as 2-D images (n, H, W) -> (n, P, Q), depth folded into the batch and, for
// one-row filters, the rows of all images into one tall image.
struct View {
  int64_t n, H, W, P, Q;
};

View view_of(const Problem& p) {
  View v{p.N * p.in[0], p.in[1], p.in[2], p.out[1], p.out[2]};
  if (p.filt[1] == 1 && p.stride[1] == 1 && p.pad_lo[1] == 0 && p.pad_hi[1] == 0) {
    v.H *= v.n;
    v.P *= v.n;
    v.n = 1;
  }
  return v;
}

Support check_problem(const Args& a) {
  const Problem& p = a.p;
  if (Support s = float_inputs(a); !s.ok) return s;
  if (!dispatch_io(a.in, a.out, [](auto, auto) {}))
    return Support::No(std::string("unsupported dtypes ") + dtype_name(a.in) + " -> " +
                       dtype_name(a.out));
  if (p.G != p.C || p.C == 0)
    return Support::No("needs groups == C (depthwise: one input channel per group)");
  for (int i = 0; i < 3; ++i)
    if (p.lhs_dil[i] != 1) return Support::No("input (lhs) dilation > 1 is not handled");
  if (p.filt[0] != 1 || p.stride[0] != 1 || p.pad_lo[0] != 0 || p.pad_hi[0] != 0)
    return Support::No("3-D windows are not handled (the depth axis needs T == 1, stride 1, no "
                       "padding)");
  if (p.filt[1] == 0 || p.filt[2] == 0) return Support::No("empty filter");
  const View v = view_of(p);
  const int64_t lim = int64_t(1) << 30;
  for (int64_t d : {v.n, v.H, v.W, v.P, v.Q, p.C, p.K, p.filt[1] * p.filt[2]})
    if (d >= lim) return Support::No("a dimension is too large for 32-bit tile indexing");
  for (int i = 1; i < 3; ++i)
    for (int64_t d : {p.stride[i], p.rhs_dil[i] * p.filt[i], p.pad_lo[i], -p.pad_lo[i]})
      if (d >= lim) return Support::No("stride, dilation or padding too large");
  return Support::Yes();
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// The smallest block count covering n that keeps every block at most cap: n split evenly.
int64_t balance(int64_t n, int64_t cap) { return n <= 0 ? 1 : ceil_div(n, ceil_div(n, cap)); }

Axis make_axis(int64_t src, int64_t dst, int64_t stride, int64_t dil, int64_t pad, int64_t taps) {
  return Axis{int(src), int(dst), int(stride), int(dil), int(pad), int(taps), 0, 0};
}

// Sets the tile size along an axis and the source positions it stages.
void set_tile(Axis* a, int64_t tile, bool transposed) {
  const int64_t reach = int64_t(a->taps - 1) * a->dil;
  a->tile = int(tile);
  a->span = int(transposed ? ceil_div(tile - 1 + reach, a->stride) + 1
                           : (tile - 1) * a->stride + reach + 1);
}

int64_t acc_bytes(DType in) { return in == DType::kF64 ? 8 : 4; }
int lanes_for(DType in) { return kSlice / int(16 / acc_bytes(in)); }

// A kernel variant: the fast path's filter width and W stride (0, 0: generic) and the
// destination columns per thread (7 or 8: 7 covers the 112/56/28/14/7-wide images of ImageNet
// networks without waste, 8 the power-of-two ones; 7 is compiled for the stride-1 fast path).
struct Variant {
  int S, SW, WT;
};

// The variants an axis allows (forward form; `fast` false: the generic kernel only).
std::vector<Variant> variants(const Axis& w, bool fast) {
  const bool s35 = w.taps == 3 || w.taps == 5;
  if (fast && w.dil == 1 && w.stride == 1 && (s35 || w.taps == 7))
    return {{w.taps, 1, 8}, {w.taps, 1, 7}};
  if (fast && w.dil == 1 && w.stride == 2 && s35) return {{w.taps, 2, 8}};
  return {{0, 0, 8}};
}

template <int N>
using I = std::integral_constant<int, N>;

// Calls f(kS, kSW, kWt) with integral constants for a variant.
template <typename F>
Status with_variant(const Variant& v, F&& f) {
  switch ((v.S * 10 + v.SW) * 10 + v.WT) {  // 718: S 7, W stride 1, 8 columns
    case 318: return f(I<3>{}, I<1>{}, I<8>{});
    case 518: return f(I<5>{}, I<1>{}, I<8>{});
    case 718: return f(I<7>{}, I<1>{}, I<8>{});
    case 317: return f(I<3>{}, I<1>{}, I<7>{});
    case 517: return f(I<5>{}, I<1>{}, I<7>{});
    case 717: return f(I<7>{}, I<1>{}, I<7>{});
    case 328: return f(I<3>{}, I<2>{}, I<8>{});
    case 528: return f(I<5>{}, I<2>{}, I<8>{});
    default: return f(I<0>{}, I<0>{}, I<8>{});
  }
}

// Relative time of a tile: `threads` threads (a partial warp costs a whole one), every `unit`
// of them computing `per_unit` destination positions, and `staged` source positions staged, a
// staged position taken to cost a quarter of a computed one (a tunable guess).
double tile_cost(int64_t threads, int64_t unit, double per_unit, int64_t staged) {
  return double(ceil_div(threads, 32) * 32) / double(unit) * per_unit + 0.25 * double(staged);
}

struct ConvPlan {
  Support support = Support::Yes();
  ConvGeom g{};
  Variant var{0, 0, 8};
  bool transposed = false;
  int threads = 0;
  int64_t smem = 0, blocks = 0;
};

// Picks the variant and tile at the least cost within the shared-memory budget: WG column
// groups of WT covering the width evenly (at most 8), TR row pairs (at most kMaxThreads
// threads).
ConvPlan plan_conv(const Args& a) {
  ConvPlan pl;
  pl.support = check_problem(a);
  if (!pl.support.ok) return pl;
  const Problem& p = a.p;
  const View v = view_of(p);
  const int64_t Kg = p.Kg(), R = p.filt[1], S = p.filt[2];
  ConvGeom& g = pl.g;
  Tiling& t = g.t;
  g.K = int(p.K);
  if (a.dir == Direction::kFwd) {
    t.h = make_axis(v.H, v.P, p.stride[1], p.rhs_dil[1], p.pad_lo[1], R);
    t.w = make_axis(v.W, v.Q, p.stride[2], p.rhs_dil[2], p.pad_lo[2], S);
    g.src = Source{int(p.C), 1, int(Kg), false};
    g.dst_c = int(p.K);
    g.passes = 1;
  } else if (p.stride[1] == 1 && p.stride[2] == 1) {  // bwd_data as a flipped forward conv
    t.h = make_axis(v.P, v.H, 1, p.rhs_dil[1], (R - 1) * p.rhs_dil[1] - p.pad_lo[1], R);
    t.w = make_axis(v.Q, v.W, 1, p.rhs_dil[2], (S - 1) * p.rhs_dil[2] - p.pad_lo[2], S);
    g.flip = true;
  } else {  // bwd_data in the gather form
    t.h = make_axis(v.P, v.H, p.stride[1], p.rhs_dil[1], p.pad_lo[1], R);
    t.w = make_axis(v.Q, v.W, p.stride[2], p.rhs_dil[2], p.pad_lo[2], S);
    pl.transposed = true;
  }
  if (a.dir == Direction::kBwdData) {
    g.src = Source{int(p.K), int(Kg), 1, false};
    g.dst_c = int(p.C);
    g.passes = int(Kg);
  }
  // 16-bit tiles take half the shared memory, so four blocks fit an SM; the kernel's ~125
  // registers fit four only of 128 threads (16 warps), where the cost model alone would take
  // 224-thread tiles at two blocks (14 warps).
  const int64_t max_threads = dtype_bytes(a.in) == 2 ? kHalfTileThreads : kMaxThreads;
  const int64_t lanes = lanes_for(a.in), spatial = max_threads / lanes;
  const int64_t row_sets = ceil_div(t.h.dst, kHt);
  auto smem_for = [&](int64_t WT, int64_t WG, int64_t TR) {
    set_tile(&t.h, TR * kHt, pl.transposed);
    set_tile(&t.w, WG * WT, pl.transposed);
    t.pitch = t.w.span | 1;
    return (int64_t(t.h.span) * t.pitch * dtype_bytes(a.in) + R * S * acc_bytes(a.in)) * kSlice;
  };
  // Kg > 1 bwd_data and the gather form take the generic kernel: only it loops over passes.
  const std::vector<Variant> vars = variants(t.w, g.passes == 1 && !pl.transposed);
  int64_t WG = 1, TR = 1;  // (and vars[0]) when no tile fits the budget
  double best = -1;
  pl.var = vars[0];
  for (const Variant& var : vars)
    for (int64_t wg_cap = 1; wg_cap <= std::min<int64_t>(8, spatial); ++wg_cap) {
      const int64_t col_groups = ceil_div(t.w.dst, var.WT), wg = balance(col_groups, wg_cap);
      for (int64_t tr = 1; tr <= std::max<int64_t>(1, std::min(spatial / wg, row_sets)); ++tr) {
        if (smem_for(var.WT, wg, tr) > kSmemBudget) break;  // grows with tr
        const double cost = double(ceil_div(row_sets, tr) * ceil_div(col_groups, wg)) *
                            tile_cost(lanes * wg * tr, lanes, kHt * var.WT,
                                      int64_t(t.h.span) * t.pitch);
        if (best < 0 || cost <= best) best = cost, pl.var = var, WG = wg, TR = tr;
      }
    }
  pl.smem = smem_for(pl.var.WT, WG, TR);
  if (pl.smem > kSmemLimit)
    return {Support::No("filter window too large for the shared-memory tile"), {}, {0, 0, 8},
            false, 0, 0, 0};
  t.tiles_h = int(ceil_div(t.h.dst, t.h.tile));
  t.tiles_w = int(ceil_div(t.w.dst, t.w.tile));
  t.slices = int(ceil_div(g.dst_c, kSlice));
  pl.threads = int(lanes * WG * TR);
  pl.blocks = v.n * t.tiles_h * t.tiles_w * t.slices;
  if (pl.blocks >= (int64_t(1) << 31))
    return {Support::No("too many tiles for one launch"), {}, {0, 0, 8}, false, 0, 0, 0};
  return pl;
}

struct FilterPlan {
  Support support = Support::Yes();
  FilterGeom g{};
  Variant var{0, 0, 8};
  int threads = 0;
  int64_t smem = 0, workspace = 0;
};

// Picks the variant and tile at the least cost within the budget: WG column groups as for the
// convolution, TH dy rows (at most 16); threads: lanes x tasks x groups, the groups sharing the
// tile's items evenly (idle item slots count in the cost). Slabs: about kFilterBlocks blocks,
// of two items or more.
FilterPlan plan_filter(const Args& a) {
  FilterPlan pl;
  pl.support = check_problem(a);
  if (!pl.support.ok) return pl;
  const Problem& p = a.p;
  const View v = view_of(p);
  const int64_t R = p.filt[1], S = p.filt[2];
  FilterGeom& g = pl.g;
  Tiling& t = g.t;
  t.h = make_axis(v.H, v.P, p.stride[1], p.rhs_dil[1], p.pad_lo[1], R);
  t.w = make_axis(v.W, v.Q, p.stride[2], p.rhs_dil[2], p.pad_lo[2], S);
  g.x = Source{int(p.C), 1, int(p.Kg()), false};
  g.dy = Source{int(p.K), 1, 1, false};
  g.K = int(p.K);
  const std::vector<Variant> vars = variants(t.w, true);
  g.sgroups = vars[0].S > 0 ? 1 : int(ceil_div(S, kTapGroup));
  g.tasks = int(R) * g.sgroups;
  const int64_t lanes = lanes_for(a.in);
  if (g.tasks * lanes > kMaxThreads)
    return {Support::No("bwd_filter: filter too large (rows x tap groups of 8 > " +
                        std::to_string(kMaxThreads / lanes) + ")"), {}, {0, 0, 8}, 0, 0, 0};
  const int64_t taps = R * S;
  const int64_t group_cap = std::max<int64_t>(1, kMaxThreads / (lanes * g.tasks));
  auto smem_for = [&](int64_t WT, int64_t WG, int64_t TH) {
    set_tile(&t.h, TH, false);
    set_tile(&t.w, WG * WT, false);
    t.pitch = t.w.span | 1;
    g.pitch_dy = t.w.tile | 1;
    g.groups = int(balance(TH * WG, group_cap));
    const int64_t tiles = int64_t(t.h.span) * t.pitch + TH * g.pitch_dy;
    return std::max(tile_buffers(dtype_bytes(a.in)) * tiles * dtype_bytes(a.in),
                    g.groups * taps * acc_bytes(a.in)) * kSlice;
  };
  int64_t WG = 1, TH = 1;  // (and vars[0]) when no tile fits the budget
  double best = -1;
  pl.var = vars[0];
  for (const Variant& var : vars)
    for (int64_t wg_cap = 1; wg_cap <= 8; ++wg_cap) {
      const int64_t col_groups = ceil_div(v.Q, var.WT), wg = balance(col_groups, wg_cap);
      for (int64_t th = 1; th <= std::min<int64_t>(16, std::max<int64_t>(1, v.P)); ++th) {
        if (smem_for(var.WT, wg, th) > kSmemBudget) break;  // grows with th
        const int64_t per_group = ceil_div(th * wg, g.groups);  // items, idle slots included
        const double cost = double(ceil_div(v.P, th) * ceil_div(col_groups, wg)) *
                            tile_cost(lanes * g.tasks * g.groups, lanes * g.tasks,
                                      double(per_group * var.WT),
                                      int64_t(t.h.span) * t.pitch + th * g.pitch_dy);
        if (best < 0 || cost <= best) best = cost, pl.var = var, WG = wg, TH = th;
      }
    }
  pl.smem = smem_for(pl.var.WT, WG, TH);
  if (pl.smem > kSmemLimit)
    return {Support::No("filter window too large for the shared-memory tile"), {}, {0, 0, 8},
            0, 0, 0};
  t.tiles_h = int(ceil_div(v.P, TH));
  t.tiles_w = int(ceil_div(v.Q, t.w.tile));
  t.slices = int(ceil_div(p.K, kSlice));
  const int64_t items = v.P == 0 || v.Q == 0 ? 0 : v.n * t.tiles_h * t.tiles_w;
  if (items >= (int64_t(1) << 31))
    return {Support::No("too many tiles for one launch"), {}, {0, 0, 8}, 0, 0, 0};
  g.items = int(items);
  // Slabs of two items or more, so that one item's copies overlap another's arithmetic.
  g.chunks = int(std::max<int64_t>(std::min(items / 2, kFilterBlocks / t.slices), items > 0));
  pl.threads = int(lanes * g.tasks * g.groups);
  pl.workspace = int64_t(g.chunks) * t.slices * taps * kSlice * acc_bytes(a.in);
  return pl;
}

template <typename Kernel, typename... KArgs>
Status launch(Kernel kernel, const char* name, int64_t blocks, int threads, int64_t smem,
              cudaStream_t stream, KArgs... args) {
  // Shared memory decides how many blocks an SM holds: take all of it from L1 (the kernels
  // stage their reuse in shared memory themselves).
  if (smem > 0 && (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(smem)) != cudaSuccess ||
                   cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared) != cudaSuccess))
    return cuda::check_launch(name);
  kernel<<<unsigned(blocks), threads, size_t(smem), stream>>>(args...);
  return cuda::check_launch(name);
}

template <typename In, typename Out>
Status run_conv(const Args& a, const Buffers& b, cudaStream_t stream) {
  ConvPlan pl = plan_conv(a);
  if (pl.blocks == 0) return Status::Ok();
  ConvGeom& g = pl.g;
  const In* src = static_cast<const In*>(a.dir == Direction::kFwd ? b.x : b.y);
  const auto* w = static_cast<const In*>(b.w);
  auto* dst = static_cast<Out*>(b.result);
  g.src.vec = g.src.chan_mul == 1 && g.src.chan_div == 1 && g.src.c % Vec<In>::kN == 0 &&
              cuda::vec_aligned(src);
  constexpr int V = Vec<dev_acc_t<In>>::kN;
  g.vec_dst = g.dst_c % V == 0 && reinterpret_cast<uintptr_t>(dst) % (V * sizeof(Out)) == 0;
  const char* name = "conv depthwise_conv_kernel";
  if (pl.transposed)
    return launch(depthwise_conv_kernel<In, Out, 0, 0, 8, true>, name, pl.blocks, pl.threads,
                  pl.smem, stream, g, src, w, dst);
  return with_variant(pl.var, [&](auto kS, auto kSW, auto kWt) {
    return launch(depthwise_conv_kernel<In, Out, decltype(kS)::value, decltype(kSW)::value,
                                        decltype(kWt)::value, false>,
                  name, pl.blocks, pl.threads, pl.smem, stream, g, src, w, dst);
  });
}

template <typename In, typename Out>
Status run_filter(const Args& a, const Buffers& b, void* workspace, cudaStream_t stream) {
  using Acc = dev_acc_t<In>;
  FilterPlan pl = plan_filter(a);
  FilterGeom& g = pl.g;
  const int taps = g.t.h.taps * g.t.w.taps;
  if (int64_t(taps) * g.K == 0) return Status::Ok();
  const auto* x = static_cast<const In*>(b.x);
  const auto* dy = static_cast<const In*>(b.y);
  auto* partial = static_cast<Acc*>(workspace);
  g.x.vec = g.x.chan_div == 1 && g.x.c % Vec<In>::kN == 0 && cuda::vec_aligned(x);
  g.dy.vec = g.dy.c % Vec<In>::kN == 0 && cuda::vec_aligned(dy);
  if (g.chunks > 0) {
    Status s = with_variant(pl.var, [&](auto kS, auto kSW, auto kWt) {
      return launch(depthwise_filter_kernel<In, decltype(kS)::value, decltype(kSW)::value,
                                            decltype(kWt)::value>,
                    "conv depthwise_filter_kernel", int64_t(g.chunks) * g.t.slices, pl.threads,
                    pl.smem, stream, g, x, dy, partial);
    });
    if (!s.ok()) return s;
  }
  // The chunks' partials in chunk order; each is (slices, taps, kSlice).
  return sum_partials(static_cast<const Acc*>(partial), static_cast<Out*>(b.result), g.chunks,
                      g.t.slices * taps * kSlice, stream, "conv depthwise partial_sum_kernel",
                      SliceIndex{taps, g.K});
}

Support supports(const Args& a) {
  return a.dir == Direction::kBwdFilter ? plan_filter(a).support : plan_conv(a).support;
}

int64_t workspace_bytes(const Args& a) {
  return a.dir == Direction::kBwdFilter ? plan_filter(a).workspace : 0;
}

Status run(const Args& a, const Buffers& b, void* workspace, cudaStream_t stream) {
  Status status;
  bool ok = dispatch_io(a.in, a.out, [&](auto in_tag, auto out_tag) {
    using In = device_t<decltype(in_tag)>;
    using Out = device_t<decltype(out_tag)>;
    status = a.dir == Direction::kBwdFilter ? run_filter<In, Out>(a, b, workspace, stream)
                                            : run_conv<In, Out>(a, b, stream);
  });
  if (!ok)
    return Status::Error(std::string("conv depthwise: unsupported dtypes ") + dtype_name(a.in) +
                         " -> " + dtype_name(a.out));
  return status;
}

}  // namespace

const CudaAlgorithm kCudaDepthwise = {"depthwise", /*deterministic=*/true,
                                      /*tensor_cores=*/false, supports, workspace_bytes, run};

}  // namespace jaxdnn::conv
