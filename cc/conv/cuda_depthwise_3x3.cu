// depthwise_3x3: a register-tiled kernel for the commonest depthwise layer (MobileNet's and
// EfficientNet's 3x3, stride 1, one output channel per input channel, channels-last), in all
// three directions. The general `depthwise` kernel stages a halo tile in shared memory and
// converts it to float; on this layer that staging, not memory, is its limit (cuda_depthwise.cu).
// Here nothing is staged: a thread walks a tall strip of rows with a rolling window in
// registers, and the column neighbours share the source rows through L1.
//
// Threads. A thread owns kCh = 2 channels (one 4-byte load in the 16-bit types, 8 bytes in
// float32) of kW = 2 adjacent columns; channel groups are fastest across a warp, so every load
// or store instruction of a warp covers contiguous bytes. Two channels by two columns rather
// than 4 channels by one: the same 36 FMAs per row from 4 loads instead of 3, but half the
// filter registers (18 floats, not 36), which is what fits 64 registers.
//   fwd / bwd_data  thread = (image, column pair q0, channel pair, strip of output rows); the
//       9 filter taps sit in registers as float. Step i loads source row h = p0 - ph + i once
//       (kSpan = 4 columns q0 - pw .. q0 - pw + 3, zeros outside the image) while the next two
//       rows are already loading, and adds it to the 3 output rows that read it: `fresh`
//       (filter row 0, output p0 + i, started here), `mid` (row 1) and `done` (row 2, output
//       p0 + i - 2, then stored). The three accumulator rows rotate by name (the loop is
//       unrolled by 3), so nothing moves. A strip of R output rows costs R + 2 steps. bwd_data at stride 1 is the
//       same correlation of dy with the 180-degree-rotated filter, padding 2 - pad.
//   bwd_filter  dw(r, s, c) = sum over (n, p, q) of x(n, p - ph + r, q - pw + s, c) *
//       dy(n, p, q, c). thread = (channel pair, column pair) of a work item (image, strip of x
//       rows, column block); step i loads x row h (4 columns) and dy row h + ph (2 columns),
//       keeps the dy rows h + ph - 1 and h + ph - 2 of the two steps before (rotating by name)
//       while the next two steps' rows load,
//       and adds 36 products into the 9 taps x 2 channels of accumulators. A fixed grid (one
//       wave on 132 SMs, so that the workspace does not depend on the device) takes the items
//       round-robin; each block sums its threads' accumulators in a fixed order through shared
//       memory into one partial per (tap, channel), and a second kernel adds the partials in a
//       fixed order (phases, then a tree): bitwise reproducible, no atomics.
// Strips: fwd / bwd_data pick the strip count that minimises waves x (rows per strip + 2), with
// the wave from the SM count; bwd_filter the same with the fixed grid as the wave.
//
// Cost of the benchmark layer (N=64, 56x56, C=144, pad 1, bf16; H200: 132 SMs at 1.98 GHz,
// ~4.3 TB/s device-to-device copy):
//   Bytes: x and y (dy) 57.8 MB each, 116 MB per direction: 27 us of HBM, the floor. 260 M
//   FMAs: 4.5 FLOP per byte, memory bound.
//   fwd / bwd_data: 2016 threads per image (28 column pairs x 72 channel pairs; 8 blocks of
//       256, 1.6% idle), 512 blocks, one wave of the 528 slots (4 per SM), so one strip of 58
//       steps per thread. ptxas: 64 registers, 0 spills (every instantiation), 4 blocks = 32
//       warps per SM. Per step 4 loads, 36 FMAs, 2 stores in ~96 SASS instructions (36 FFMA,
//       8 unpacks, 4 LDG, 2 STG, 2 packs, ~44 of addresses, predicates and loop): 7.5 M thread
//       steps = 22.4 M warp instructions, 21 us of issue at 4 per SM per clock, under the 27 us
//       of HBM. In flight: a warp step brings 256 new bytes of x (512 through L1, the neighbour
//       columns hitting); with the next row loading, 32 warps x 2 x 256 B = 16 KB per SM, the
//       ~16 KB that Little's law asks of 2.2 TB/s of reads at ~1 us loaded latency. Predicted
//       32-40 us each, against 148 / 143 us before and XLA's 92 / 85 us.
//   bwd_filter: blocks of 72 x 3 = 216 threads, 10 column blocks (30 column pairs, 2 idle),
//       4 strips of 14 rows: 2560 items on 528 blocks (4 per SM, 72 registers, 0 spills; float32
//       80 registers, 3 per SM), 4-5 items each. Per step 6 loads, 36 FMAs in ~87 SASS
//       instructions: 7.2 M thread steps, 19 us of issue. In flight: 28 warps x 2 x 512 new
//       bytes (x and dy) = 28 KB per SM. Partials: 528 x 1296 floats = 2.7 MB; the sum pass
//       (162 blocks of 1024 threads) ~3 us. Predicted 35-42 us, against 198 us before and
//       XLA's 106 us.
//   Measured (H200, same run): fwd 69 us, bwd_data 86 us, bwd_filter 105 us (XLA 98 / 76 /
//       101): twice the prediction. 16 KB in flight per SM sustains ~2 TB/s of reads, not 4;
//       more, shorter strips are the next step (benchmarks/NOTES.md). Session 11: two rows in
//       flight instead of one (~22 KB per SM): bf16 +7-12% on average over two A/B runs,
//       within the harness's run-to-run noise; float32 unchanged.

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cc/common/cuda_util.h"
#include "cc/conv/cuda_algorithms.h"
#include "cc/conv/cuda_partial_sum.cuh"

namespace jaxdnn::conv {
namespace {

using cuda::device_t;

constexpr int kCh = 2;               // channels per thread
constexpr int kW = 2;                // output (bwd_filter: dy) columns per thread
constexpr int kSpan = kW + 2;        // source (x) columns a thread reads per row
constexpr int kThreads = 256;        // threads of a fwd / bwd_data block
constexpr int kConvPerSm = 4;        // fwd / bwd_data blocks resident per SM (launch bounds)
constexpr int kFilterThreads = 224;  // most threads of a bwd_filter block (7 warps)
constexpr int kWaveSms = 132;        // the H100/H200 SM count that sizes the bwd_filter grid
// bwd_filter blocks resident per SM (launch bounds): 4 in the 16-bit types (72 registers), 3 in
// float32, whose wider loads need 80.
template <typename In>
constexpr int kFilterPerSm = sizeof(In) == 2 ? 4 : 3;

// kCh channels of T as raw bits: one 4-byte load in the 16-bit types, 8 bytes in float32.
template <typename T>
using Raw = std::conditional_t<sizeof(T) == 2, unsigned, uint2>;

// The kCh channels at p, or zeros (no load) where !ok.
template <typename T>
__device__ __forceinline__ Raw<T> load_raw(const T* p, bool ok) {
  return ok ? *reinterpret_cast<const Raw<T>*>(p) : Raw<T>{};
}

template <typename T>
__device__ __forceinline__ void to_float(const Raw<T>& r, float (&v)[kCh]) {
  if constexpr (sizeof(T) == 2) {
    const float2 a = cuda::unpack_acc<T>(r);
    v[0] = a.x, v[1] = a.y;
  } else {
    v[0] = __uint_as_float(r.x), v[1] = __uint_as_float(r.y);
  }
}

// N consecutive columns' channels (a source span or a row of dy) to float.
template <typename T, int N>
__device__ __forceinline__ void to_floats(const Raw<T> (&r)[N], float (&v)[N][kCh]) {
#pragma unroll
  for (int i = 0; i < N; ++i) to_float<T>(r[i], v[i]);
}

template <typename T>
struct alignas(sizeof(T) * kCh) Chunk {
  T v[kCh];
};

template <typename T>
__device__ __forceinline__ void store_ch(T* p, const float (&v)[kCh]) {
  Chunk<T> a;
#pragma unroll
  for (int k = 0; k < kCh; ++k) a.v[k] = cuda::from_acc<T>(v[k]);
  *reinterpret_cast<Chunk<T>*>(p) = a;
}

// step(i, u, v, w) for i = 0 .. steps - 1 (steps >= 1), the three register rows rotating by
// name: (u, v, w) at step 0, (w, u, v) at step 1, (v, w, u) at step 2, and so on, so that no
// row is ever copied (the loop is unrolled by three).
template <typename Row, typename Step>
__device__ __forceinline__ void rotating_steps(int steps, Row& u, Row& v, Row& w, Step step) {
  for (int i = 0;; i += 3) {
    step(i, u, v, w);
    if (i + 1 == steps) break;
    step(i + 1, w, u, v);
    if (i + 2 == steps) break;
    step(i + 2, v, w, u);
    if (i + 3 == steps) break;
  }
}

// A correlation of src (n, hs, ws, C) with the 3x3 filter into dst (n, hd, wd, C), padding
// (ph, pw) before the first row / column. Block b = (image, strip, column block cb), cb
// fastest; its kThreads threads take the items j = cb * kThreads + threadIdx.x of the strip's
// (column group of kW, channel group of kCh) items, channel group fastest.
struct ConvGeo {
  int hs, ws, hd, wd, C, ph, pw;
  int groups;      // channel groups, C / kCh
  int rows;        // output rows per strip
  int strips;      // strips per image
  int col_blocks;  // blocks per strip, ceil(ceil(wd / kW) * groups / kThreads)
};

template <typename In, typename Out>
__global__ void __launch_bounds__(kThreads, kConvPerSm)
depthwise3_conv_kernel(const In* __restrict__ src, const In* __restrict__ w, Out* __restrict__ dst,
                       ConvGeo g, bool flip) {
  const int cb = blockIdx.x % g.col_blocks, ns = blockIdx.x / g.col_blocks;
  const int j = cb * kThreads + threadIdx.x, cols = (g.wd + kW - 1) / kW;
  if (j >= cols * g.groups) return;
  const int n = ns / g.strips, p0 = ns % g.strips * g.rows;
  const int q0 = j / g.groups * kW, c = j % g.groups * kCh;
  // Step i reads source row h0 + i: its output rows are p0 + i - r through filter row r.
  const int h0 = p0 - g.ph, steps = min(g.rows, g.hd - p0) + 2;
  float wt[9][kCh];
#pragma unroll
  for (int t = 0; t < 9; ++t)
    to_float<In>(load_raw(w + (flip ? 8 - t : t) * g.C + c, true), wt[t]);
  // Source columns x0 + s; unsigned offsets: the rows above the image and the columns left of
  // it wrap, and are never read or written.
  const int x0 = q0 - g.pw;
  const unsigned src_pitch = unsigned(g.ws) * g.C, dst_pitch = unsigned(g.wd) * g.C;
  const unsigned src0 = (unsigned(n * g.hs + h0) * g.ws + x0) * g.C + c;
  const unsigned dst0 = unsigned(n * g.hd + p0 - 2) * dst_pitch + unsigned(q0) * g.C + c;
  auto load_row = [&](int i, Raw<In> (&v)[kSpan]) {
    const bool ok = unsigned(h0 + i) < unsigned(g.hs) && i < steps;
#pragma unroll
    for (int s = 0; s < kSpan; ++s)
      v[s] = load_raw(src + (src0 + unsigned(i) * src_pitch + s * g.C),
                      ok && unsigned(x0 + s) < unsigned(g.ws));
  };
  Raw<In> cur[kSpan], nxt[kSpan];
  load_row(0, cur);
  load_row(1, nxt);
  // Step i: `fresh` starts output row p0 + i (filter row 0), `mid` adds row 1 to p0 + i - 1,
  // `done` adds row 2 to p0 + i - 2, which is then complete; the next two rows are already
  // loading.
  using Acc = float[kW][kCh];
  auto step = [&](int i, Acc& fresh, Acc& mid, Acc& done) {
    Raw<In> far[kSpan];
    load_row(i + 2, far);
    float x[kSpan][kCh];
    to_floats<In>(cur, x);
#pragma unroll
    for (int u = 0; u < kW; ++u)
#pragma unroll
      for (int k = 0; k < kCh; ++k) {
        fresh[u][k] = wt[0][k] * x[u][k];
#pragma unroll
        for (int s = 0; s < 3; ++s) {
          if (s > 0) fresh[u][k] = fmaf(wt[s][k], x[u + s][k], fresh[u][k]);
          mid[u][k] = fmaf(wt[3 + s][k], x[u + s][k], mid[u][k]);
          done[u][k] = fmaf(wt[6 + s][k], x[u + s][k], done[u][k]);
        }
      }
#pragma unroll
    for (int u = 0; u < kW; ++u)
      if (i >= 2 && q0 + u < g.wd)
        store_ch(dst + (dst0 + unsigned(i) * dst_pitch + u * g.C), done[u]);
#pragma unroll
    for (int s = 0; s < kSpan; ++s) cur[s] = nxt[s], nxt[s] = far[s];
  };
  Acc a0, a1 = {}, a2 = {};  // the rows of steps 0, 1, 2 (mod 3)
  rotating_steps(steps, a0, a2, a1, step);
}

// bwd_filter, pass 1: dw(r, s, c) = sum over (n, p, q) of x(n, p - ph + r, q - pw + s, c) *
// dy(n, p, q, c). Work item = (image, strip of x rows, column block cb), cb fastest; block
// (blockIdx.x = b, blockIdx.y = channel block) takes the items b, b + gridDim.x, ... in order,
// its cgb x qb threads (channel group fastest) the item's qb column groups. A thread walks its
// strip's x rows h: row h pairs with dy rows h + ph - r (filter row r). The strips cover every
// x row that meets a dy row, padding included (h from -ph to hd + 1 - ph: hd + 2 rows), so that
// a padded row's zeros multiply dy like real elements (an infinite dy makes NaN, as in lax).
struct FilterGeo {
  int hs, ws, hd, wd, C, ph, pw;  // x (hs, ws), dy (hd, wd)
  int groups;                     // channel groups, C / kCh
  int cgb, qb;                    // block shape: channel groups x column groups
  int rows, strips, col_blocks;   // x rows per strip, strips per image, column blocks
  int span;                       // x rows walked per image, padding included (hd + 2)
  int items;                      // images x strips x column blocks
  int grid;                       // blocks along x (the partials), at most items
};

template <typename In>
__global__ void __launch_bounds__(kFilterThreads, kFilterPerSm<In>)
depthwise3_filter_kernel(const In* __restrict__ x, const In* __restrict__ dy,
                         float* __restrict__ partial, FilterGeo f) {
  __shared__ float sums[kFilterThreads][9][kCh];  // [thread][tap][channel]
  const int cg = blockIdx.y * f.cgb + threadIdx.x, c = cg * kCh;
  const unsigned x_pitch = unsigned(f.ws) * f.C, dy_pitch = unsigned(f.wd) * f.C;
  float acc[9][kCh] = {};
  // Threads past the last channel group take no item (but reach the barrier).
  for (int item = cg < f.groups ? int(blockIdx.x) : f.items; item < f.items; item += gridDim.x) {
    const int cb = item % f.col_blocks, ns = item / f.col_blocks;
    const int n = ns / f.strips, h0 = ns % f.strips * f.rows - f.ph;
    const int q0 = (cb * f.qb + threadIdx.y) * kW;
    if (q0 >= f.wd) continue;
    const int steps = min(f.rows, f.span - f.ph - h0);  // x rows h0 + i
    // x columns x0 + s, dy rows p0 + i (p0 = h0 + ph - 2); unsigned offsets: the rows above the
    // image and the columns left of it wrap, and are never read (padding loads zeros).
    const int x0 = q0 - f.pw, p0 = h0 + f.ph - 2;
    const unsigned xo = (unsigned(n * f.hs + h0) * f.ws + x0) * f.C + c;
    const unsigned dyo = unsigned(n * f.hd + p0) * dy_pitch + unsigned(q0) * f.C + c;
    auto load_dy = [&](int i, bool ok, Raw<In> (&d)[kW]) {
      ok = ok && unsigned(p0 + i) < unsigned(f.hd);
#pragma unroll
      for (int u = 0; u < kW; ++u)
        d[u] = load_raw(dy + (dyo + unsigned(i) * dy_pitch + u * f.C), ok && q0 + u < f.wd);
    };
    // Step i: x row h0 + i and dy row h0 + i + ph (= p0 + i + 2).
    auto load_step = [&](int i, Raw<In> (&v)[kSpan], Raw<In> (&d)[kW]) {
      const bool ok = i < steps, row = ok && unsigned(h0 + i) < unsigned(f.hs);
#pragma unroll
      for (int s = 0; s < kSpan; ++s)
        v[s] = load_raw(x + (xo + unsigned(i) * x_pitch + s * f.C),
                        row && unsigned(x0 + s) < unsigned(f.ws));
      load_dy(i + 2, ok, d);
    };
    using Dy = float[kW][kCh];
    Raw<In> cur[kSpan], cur_d[kW], nxt[kSpan], nxt_d[kW];
    load_step(0, cur, cur_d);
    load_step(1, nxt, nxt_d);
    Dy d0, d1, d2;  // dy rows of steps 0, 1, 2 (mod 3)
    {
      Raw<In> r[kW];
      load_dy(1, true, r);  // filter row 1 of step 0
      to_floats<In>(r, d1);
      load_dy(0, true, r);  // filter row 2 of step 0
      to_floats<In>(r, d2);
    }
    // Step i: `fresh` = dy row h + ph (filter row 0), `mid` = h + ph - 1, `old` = h + ph - 2;
    // the next two steps' rows are already loading.
    auto step = [&](int i, Dy& fresh, const Dy& mid, const Dy& old) {
      Raw<In> far[kSpan], far_d[kW];
      load_step(i + 2, far, far_d);
      to_floats<In>(cur_d, fresh);
      float xv[kSpan][kCh];
      to_floats<In>(cur, xv);
#pragma unroll
      for (int u = 0; u < kW; ++u)
#pragma unroll
        for (int s = 0; s < 3; ++s)
#pragma unroll
          for (int k = 0; k < kCh; ++k) {
            acc[s][k] = fmaf(xv[u + s][k], fresh[u][k], acc[s][k]);
            acc[3 + s][k] = fmaf(xv[u + s][k], mid[u][k], acc[3 + s][k]);
            acc[6 + s][k] = fmaf(xv[u + s][k], old[u][k], acc[6 + s][k]);
          }
#pragma unroll
      for (int s = 0; s < kSpan; ++s) cur[s] = nxt[s], nxt[s] = far[s];
#pragma unroll
      for (int u = 0; u < kW; ++u) cur_d[u] = nxt_d[u], nxt_d[u] = far_d[u];
    };
    rotating_steps(steps, d0, d1, d2, step);
  }
  const int t = threadIdx.y * f.cgb + threadIdx.x;
#pragma unroll
  for (int tap = 0; tap < 9; ++tap)
#pragma unroll
    for (int k = 0; k < kCh; ++k) sums[t][tap][k] = acc[tap][k];
  __syncthreads();
  // Fixed-order sum over the block's column groups of each (tap, channel), channel fastest.
  const int cg0 = blockIdx.y * f.cgb, chans = min(f.cgb, f.groups - cg0) * kCh;
  for (int e = t; e < 9 * chans; e += f.cgb * f.qb) {
    const int tap = e / chans, ch = e % chans;
    float v = 0.f;
    for (int i = 0; i < f.qb; ++i) v += sums[i * f.cgb + ch / kCh][tap][ch % kCh];
    partial[(int64_t(blockIdx.x) * 9 + tap) * f.C + cg0 * kCh + ch] = v;
  }
}

Support supports(const Args& a) {
  const Problem& p = a.p;
  if (Support s = float_inputs(a); !s.ok) return s;
  if (a.in != DType::kBF16 && a.in != DType::kF16 && a.in != DType::kF32)
    return Support::No("bfloat16, float16 or float32 inputs only");
  if (a.out != a.in && a.out != DType::kF32)
    return Support::No("the result must have the input dtype or float32");
  if (p.G != p.C || p.K != p.C)
    return Support::No("needs groups == C == K (one output channel per input channel)");
  if (p.filt[0] != 1 || p.filt[1] != 3 || p.filt[2] != 3 || p.in[0] != 1)
    return Support::No("2-D 3x3 filters only");
  for (int i = 0; i < 3; ++i)
    if (p.stride[i] != 1 || p.rhs_dil[i] != 1 || p.lhs_dil[i] != 1)
      return Support::No("stride 1 and no dilation only");
  if (p.C % kCh != 0) return Support::No("C must be a multiple of " + std::to_string(kCh));
  if (p.x_elems() >= (int64_t(1) << 31) || p.y_elems() >= (int64_t(1) << 31))
    return Support::No("tensors of 2^31 or more elements are not supported");
  return Support::Yes();
}

// Strips per image for `blocks` blocks per strip when `wave` blocks run at once: the fewest
// rounds of (rows per strip + halo) steps, counting a partial wave as a whole one.
int pick_strips(int64_t blocks, int rows, int halo, int64_t wave) {
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int s = 1; s <= rows; ++s) {
    const int per = (rows + s - 1) / s;
    if (s > 1 && (rows + per - 1) / per != s) continue;  // the same strips as fewer
    const int64_t cost = (blocks * s + wave - 1) / wave * (per + halo);
    if (cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

// fwd / bwd_data: the strips when `wave` blocks run at once. bwd_data: dx = dy correlated with
// the flipped filter, padding 2 - pad.
ConvGeo conv_geo(const Args& a, int wave) {
  const Problem& p = a.p;
  ConvGeo g = {int(p.in[1]), int(p.in[2]), int(p.out[1]), int(p.out[2]), int(p.C),
               int(p.pad_lo[1]), int(p.pad_lo[2])};
  if (a.dir == Direction::kBwdData) g = {g.hd, g.wd, g.hs, g.ws, g.C, 2 - g.ph, 2 - g.pw};
  g.groups = g.C / kCh;
  g.col_blocks = int((int64_t((g.wd + kW - 1) / kW) * g.groups + kThreads - 1) / kThreads);
  g.strips = pick_strips(int64_t(p.N) * g.col_blocks, std::max(g.hd, 1), 2, wave);
  g.rows = (g.hd + g.strips - 1) / g.strips;
  return g;
}

// bwd_filter: the work items and the pass 1 grid, one wave of kFilterPerSm blocks on kWaveSms
// SMs at most (a constant, so that the workspace does not depend on the device).
FilterGeo filter_geo(const Args& a) {
  const Problem& p = a.p;
  FilterGeo f = {int(p.in[1]),     int(p.in[2]),     int(p.out[1]), int(p.out[2]), int(p.C),
                 int(p.pad_lo[1]), int(p.pad_lo[2])};
  f.groups = f.C / kCh;
  f.cgb = std::max(1, std::min(f.groups, kFilterThreads));
  const int cols = (f.wd + kW - 1) / kW;
  f.qb = std::max(1, std::min(kFilterThreads / f.cgb, cols));
  f.col_blocks = (cols + f.qb - 1) / f.qb;
  const int wave =
      kWaveSms * (a.in == DType::kF32 ? kFilterPerSm<float> : kFilterPerSm<__nv_bfloat16>);
  f.span = f.hd + 2;
  f.strips = pick_strips(int64_t(p.N) * f.col_blocks, f.span, 2, wave);
  f.rows = (f.span + f.strips - 1) / f.strips;
  f.items = f.wd == 0 || f.hs == 0 ? 0 : int(p.N) * f.strips * f.col_blocks;
  f.grid = std::min(f.items, wave);
  return f;
}

int64_t workspace_bytes(const Args& a) {
  if (a.dir != Direction::kBwdFilter) return 0;
  return align256(int64_t(filter_geo(a).grid) * 9 * a.p.C * int64_t(sizeof(float)));
}

template <typename In, typename Out>
Status run_typed(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  const Problem& p = a.p;
  const In* w = static_cast<const In*>(b.w);
  if (a.dir != Direction::kBwdFilter) {
    const bool fwd = a.dir == Direction::kFwd;
    const ConvGeo g = conv_geo(a, std::max(cuda::sm_count(), 1) * kConvPerSm);
    const int64_t blocks = g.hd == 0 ? 0 : int64_t(p.N) * g.strips * g.col_blocks;
    if (blocks == 0) return Status::Ok();
    depthwise3_conv_kernel<In, Out><<<unsigned(blocks), kThreads, 0, stream>>>(
        static_cast<const In*>(fwd ? b.x : b.y), w, static_cast<Out*>(b.result), g, !fwd);
    return cuda::check_launch("conv depthwise3_conv_kernel");
  }
  const FilterGeo f = filter_geo(a);
  float* partial = static_cast<float*>(ws);
  if (f.grid > 0) {
    depthwise3_filter_kernel<In>
        <<<dim3(f.grid, (f.groups + f.cgb - 1) / f.cgb), dim3(f.cgb, f.qb), 0, stream>>>(
            static_cast<const In*>(b.x), static_cast<const In*>(b.y), partial, f);
    if (Status st = cuda::check_launch("conv depthwise3_filter_kernel"); !st.ok()) return st;
  }
  return sum_partials(partial, static_cast<Out*>(b.result), f.grid, 9 * int(p.C), stream,
                      "conv depthwise3 partial_sum_kernel");
}

Status run(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  Status status = Status::Error("conv depthwise_3x3: unsupported dtypes");
  dispatch_io(a.in, a.out, [&](auto in_tag, auto out_tag) {
    using In = device_t<decltype(in_tag)>;
    using Out = device_t<decltype(out_tag)>;
    if constexpr (sizeof(In) <= 4) status = run_typed<In, Out>(a, b, ws, stream);  // no f64
  });
  return status;
}

}  // namespace

const CudaAlgorithm kCudaDepthwise3x3 = {"depthwise_3x3", /*deterministic=*/true,
                                         /*tensor_cores=*/false, supports, workspace_bytes, run};

}  // namespace jaxdnn::conv
