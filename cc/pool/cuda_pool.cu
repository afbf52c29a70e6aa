// CUDA pooling kernels for any window, and the dispatcher of every pooling op.
//
//   window_fwd   algorithm "window": max_fwd, max_fwd_index, avg_fwd, one thread per (output
//                position, G vectors of V channels); it walks the window's valid taps. Traffic:
//                x read once from DRAM (overlapping windows re-read taps from L1/L2), y (and
//                idx) written once: N*D*H*W*C + N*Z*P*Q*C elements (+ N*Z*P*Q*C index bytes).
//   strip_fwd    the same ops for 2-D windows (window and stride 1 along D, no D padding) on
//                the vector path, of a shape in StripShapes (3/2 along W, 2 output rows
//                sharing an input row along H: the 3x3/2 family). One thread per (plane, strip
//                of S consecutive output rows, J = 2 output columns, one vector of channels):
//                it walks the strip's input rows once, top to bottom, each row's 5 column
//                vectors loaded one row ahead of the row it reduces, and merges each row into
//                the output rows whose windows hold it (row 2p+1 of a 3x3/2 pool into p and
//                p+1: read once, not twice). Taps reach each window in row-major order, so
//                results equal window_fwd's bit for bit (avg sums too). Algorithm "strip".
//   tile_fwd     the same ops for windows that tile the input (2x2 / stride 2, no padding) on
//                the vector path: one thread per output vector, its 4 taps loaded at once (no
//                loop, ~30 registers, 8 blocks per SM). Algorithm "tile".
//   window_bwd   algorithm "gather" (with max_gather): max_scatter, avg_bwd, as a gather: one
//                thread per (input position, G vectors of V channels) visits the windows
//                covering it (2.25 on average for 3x3 stride 2) and sums dy where the window
//                selected it (max) or dy/divisor (avg). No atomics: deterministic. Traffic: dy
//                (and idx) read once, dx written once.
//   max_gather   the jvp of max pooling: t at each window's selected element, one thread per
//                output element (a per-channel gather; not a training hot path).
// Global windows (one window covering the whole input): algorithm "global" (cuda_global.cu),
// which splits the window across threads and blocks.
//
// Vectors: V = 16 bytes of channels when C allows and the buffers are aligned (V = 1 otherwise),
// and G = 2 vectors per thread when a position has at least 16 vectors, which halves the index
// arithmetic while each load instruction of a warp still covers contiguous 128-byte lines.
// Forward columns: J = 2 adjacent output columns per thread (choose_layout) when the windows
// leave no gap and the state fits (J*G*V <= 16 channels). A 2x2/2 bf16 pool at C = 64 had one
// 16-byte vector and 4 taps per thread: 64 bytes read per ~60 instructions of index math, and
// only one row of taps (32 bytes) in flight. With J = 2 a thread walks the 4 contiguous taps
// of each window row once (128 bytes per row of taps, 4 loads in flight), and 3x3/2 windows
// read 5 columns instead of 6. Traffic unchanged: x read once from DRAM, y written once.
//
// strip_fwd on the benchmark (x 64x112x112x64, 3x3/2 pad 1; H200: 132 SMs, a wave of 2 blocks
// of 256 threads per SM at <= 128 registers; times of the kernel alone, CUDA events):
//   float32   16 lanes x 28 column pairs x 64 images = 28,672 threads per strip row; a wave
//             holds 67,584: 2 strips of 28 rows, 57,344 threads (224 blocks, one wave).
//             DRAM: x 205.5 MB (+0.9%: one row per image read by both strips) + y 51.4 MB =
//             259 MB, 63.6 us at the 4.07 TB/s copy rate. A thread issues, per input row, 5
//             LDG.128 and ~210 instructions (4 + 3 merges of 4 channels at 3 instructions,
//             every other row 2 stores and a slot shift): 10 loads per 8 outputs against 15
//             in window_fwd (3 rows x 5); 21.5M warp instructions, ~20 us of issue over all
//             schedulers. Measured max 66.3 us (window_fwd 75.1), avg 69.5 (73.6), max with
//             index 72.0 (93.5).
//   bfloat16  8 lanes: 4 strips of 14 rows (+2.7% of x), 57,344 threads; x 102.8 + y 25.7 MB,
//             31.6 us at the copy rate; ~260 instructions per row (the conversions). Measured
//             max 42.7 us (window_fwd 51.7), avg 39.9 (42.4), max with index 68.7 (77.2).
// 2x2/2: no input row is shared, so strips only save index math, and short threads stream
// better than one wave of long ones (window_fwd bf16 34.3 us alone against 39.7 for strips).
// tile_fwd (kernel trace, 64x112x112x64, docs/perf/pool.md): max bf16 31.0 us against window_fwd's
// 33.1 (60 registers, 50% occupancy) and XLA's 30.3-30.5 (128-thread blocks, 4 outputs per
// thread, 20 registers); float32 59.5 against 60.8 and XLA's 59.4 (4.32 TB/s).

#include <limits>
#include <tuple>
#include <type_traits>

#include "cc/common/cuda_pack.h"
#include "cc/pool/cuda_common.cuh"
#include "cc/pool/cuda_pool.h"

namespace jaxdnn::pool::gpu {
namespace {

// At least 3 resident blocks (768 threads) per SM: up to 85 registers, enough for the widest
// accumulators (2 vectors of 8 bf16 channels with their indices) without spilling, and enough
// loads in flight to cover the memory latency.
constexpr int kMinBlocks = 3;

// The forward epilogue of both forward kernels: stores output columns [q0, q0 + J) (those < Q)
// of one output row, column j from st[j], at element offset out + j*C (+ k*lanes*V for the
// k-th of the G vectors). avg divides by the window size, or with exclude-pad by the taps on
// the input: rows_in (planes times rows) times cols_in[j]. max with index: the first tap of
// window j lies on the input when its row's does (row_first_in) and its column's (col_first_in).
template <typename T, int V, int G, typename A, int J, Reduce R, typename Idx>
__device__ __forceinline__ void store_columns(const Geom& g,
                                              const WindowState<A, G * V, R> (&st)[J],
                                              int32_t out, int32_t q0, int32_t rows_in,
                                              const int32_t (&cols_in)[J], bool row_first_in,
                                              const bool (&col_first_in)[J], T* y, Idx* idx,
                                              bool include_pad) {
#pragma unroll
  for (int j = 0; j < J; ++j) {
    if (q0 + j >= g.out[2]) break;
    A inv = A(1);
    if constexpr (R == Reduce::kAvg)  // 1/0 = inf for a window of only padding: NaN, as flax
      inv = A(1) / A(include_pad ? g.window_size() : rows_in * cols_in[j]);
#pragma unroll
    for (int k = 0; k < G; ++k) {
      const int32_t o = out + j * g.C + k * g.lanes * V;
      st[j].template store<T, V, Idx>(k * V, y + o, R == Reduce::kMaxIndex ? idx + o : nullptr,
                                      inv, row_first_in && col_first_in[j]);
    }
  }
}

template <typename T, int V, int G, int J, Reduce R, typename Idx>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
window_fwd_kernel(Geom g, FastDiv q_groups, const T* __restrict__ x, T* __restrict__ y,
                  Idx* __restrict__ idx, bool include_pad) {
  using A = dev_acc_t<T>;
  cuda::await_prior_grids();
  const int32_t items = g.N * g.out[0] * g.out[1] * int32_t(q_groups.d) * g.lanes;
  for (int64_t i = blockIdx.x * kThreads + threadIdx.x; i < items; i += gridDim.x * kThreads) {
    const int32_t e = int32_t(i);  // (the 64-bit counter cannot overflow past `items`)
    int32_t lane, z, pp, qg;
    const int32_t pos = g.lanes_div.divmod(e, &lane);  // (n, z, pp, group of J columns)
    const int32_t n = g.out_div[0].divmod(g.out_div[1].divmod(q_groups.divmod(pos, &qg), &pp), &z);
    int32_t zs, z0, z1, ps, p0, p1;
    g.window_span(0, z, &zs, &z0, &z1);
    g.window_span(1, pp, &ps, &p0, &p1);
    // Output columns q_j = qg*J + j (those < Q), their window starts qs[j] and input columns
    // [w0[j], w1[j]); the row loop walks the union [w0[0], w_end) once, each tap going to the
    // windows that hold it.
    int32_t qs[J], w0[J], w1[J], w_end = 0;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int32_t q = qg * J + j;
      g.window_span(2, q, &qs[j], &w0[j], &w1[j]);
      if (q >= g.out[2]) w0[j] = w1[j] = 0;  // past the edge: an empty window, never stored
      w_end = max(w_end, w1[j]);
    }
    const T* xn = x + n * g.in_spatial() * g.C + lane * V;
    WindowState<A, G * V, R> st[J];
#pragma unroll
    for (int j = 0; j < J; ++j) st[j].init();
    for (int32_t d = z0; d < z1; ++d)
      for (int32_t h = p0; h < p1; ++h) {
        const T* row = xn + (d * g.in[1] + h) * g.in[2] * g.C;
        const int32_t k0 = ((d - zs) * g.window[1] + (h - ps)) * g.window[2];
#pragma unroll 4
        for (int32_t w = w0[0]; w < w_end; ++w) {
          A v[G * V];
#pragma unroll
          for (int k = 0; k < G; ++k)
            load_channels<T, V>(row + w * g.C + k * g.lanes * V, v + k * V);
#pragma unroll
          for (int j = 0; j < J; ++j)
            if (w >= w0[j] && w < w1[j]) st[j].add_tap(v, k0 + w - qs[j]);
        }
      }
    int32_t cols_in[J];
    bool col_first_in[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      cols_in[j] = w1[j] - w0[j];
      col_first_in[j] = w0[j] == qs[j] && w0[j] < w1[j];
    }
    const bool row_first_in = z0 == zs && z0 < z1 && p0 == ps && p0 < p1;
    const int32_t out = (((n * g.out[0] + z) * g.out[1] + pp) * g.out[2] + qg * J) * g.C + lane * V;
    store_columns<T, V, G>(g, st, out, qg * J, (z1 - z0) * (p1 - p0), cols_in, row_first_in,
                           col_first_in, y, idx, include_pad);
  }
}

// ---- tile forward ----

// One thread per output vector of a pool whose windows tile the input (window == stride == kK
// along H and W, 1 along D, no padding): its kK x kK taps are loaded at once (kK*kK 16-byte
// loads in flight, held as raw words) and reduced in window order, so results equal
// window_fwd's bit for bit. No loop, ~30 registers: XLA's shape for these pools.
template <typename T, int kK, Reduce R, typename Idx>
__global__ void __launch_bounds__(kThreads)
    tile_fwd_kernel(Geom g, const T* __restrict__ x, T* __restrict__ y, Idx* __restrict__ idx) {
  using A = dev_acc_t<T>;
  using W = cuda::Words<T>;
  constexpr int V = W::kN;
  cuda::await_prior_grids();
  const int32_t e = int32_t(blockIdx.x) * kThreads + int32_t(threadIdx.x);
  if (e >= g.N * g.out_spatial() * g.lanes) return;
  int32_t lane, z, pp, q;
  const int32_t n = g.split(g.lanes_div.divmod(e, &lane), g.out_div, &z, &pp, &q);
  const T* in = x + (((n * g.in[0] + z) * g.in[1] + pp * kK) * g.in[2] + q * kK) * g.C + lane * V;
  W taps[kK * kK];  // (row, column) of the window
#pragma unroll
  for (int r = 0; r < kK; ++r)
#pragma unroll
    for (int c = 0; c < kK; ++c) taps[r * kK + c] = W::load(in + (r * g.in[2] + c) * g.C);
  WindowState<A, V, R> st;
  st.init();
#pragma unroll
  for (int k = 0; k < kK * kK; ++k) {
    A v[V];
    taps[k].unpack(v);
    st.add_tap(v, k);
  }
  // Output (n, z, pp, q), channels lane*V: position e / lanes, so offset e*V (C = lanes*V).
  st.template store<T, V, Idx>(0, y + e * V, R == Reduce::kMaxIndex ? idx + e * V : nullptr,
                               A(1) / A(kK * kK), /*first_on_input=*/true);
}

// ---- strip forward ----

// A shape the strip kernel is compiled for: window kW and stride kStride along W, and kLive =
// ceil(window / stride) along H, the most output rows whose windows share one input row. Only
// the 3x3/2 family for now (2x2/2 measured slower than window_fwd: see the top of the file).
template <int KW, int SW, int L>
struct StripShape {
  static constexpr int kW = KW, kStride = SW, kLive = L;
};
using StripShapes = std::tuple<StripShape<3, 2, 2>>;

// 16-bit max with index: the states (value and index of 2 live rows x 2 columns x 8 channels)
// and two rows of 5 loads would not fit 128 registers, so one output column per thread. In
// bfloat16 that fits 80 registers: 3 blocks per SM (measured 68.7 us against 73 with 2, 3x3/2);
// float16's conversions need more.
template <typename T, Reduce R>
constexpr bool kStripNarrow = R == Reduce::kMaxIndex && sizeof(T) == 2;
template <typename T, Reduce R>
constexpr int kStripCols = kStripNarrow<T, R> ? 1 : 2;  // J: output columns per thread
template <typename T, Reduce R>  // up to 128 (80) registers: two rows of loads, L*J states
constexpr int kStripMinBlocks = kStripNarrow<T, R> && std::is_same_v<T, __nv_bfloat16> ? 3 : 2;
constexpr int kStripAhead = 1;  // input rows loaded ahead of the one being reduced

template <typename T, typename Shape, Reduce R, typename Idx>
__global__ void __launch_bounds__(kThreads, kStripMinBlocks<T, R>)
strip_fwd_kernel(Geom g, FastDiv q_groups, FastDiv strips, int32_t strip_rows,
                 const T* __restrict__ x, T* __restrict__ y, Idx* __restrict__ idx,
                 bool include_pad) {
  using A = dev_acc_t<T>;
  cuda::await_prior_grids();
  constexpr int V = cuda::Vec<T>::kN, J = kStripCols<T, R>, KW = Shape::kW, SW = Shape::kStride;
  constexpr int L = Shape::kLive, kCols = (J - 1) * SW + KW, kRing = kStripAhead + 1;
  using State = WindowState<A, V, R>;
  // A vector of channels held as raw words until it is used: a Vec of 16-bit elements is split
  // into one register per element as it arrives, which waits for the load where it is issued.
  using Words = cuda::Words<T>;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= g.N * g.in[0] * int32_t(strips.d) * int32_t(q_groups.d) * g.lanes) return;
  const int32_t e = int32_t(i);
  int32_t lane, qg, strip;  // n: the plane (image, depth) of this thread
  const int32_t n = strips.divmod(q_groups.divmod(g.lanes_div.divmod(e, &lane), &qg), &strip);
  const int32_t H = g.in[1], W = g.in[2], C = g.C, KH = g.window[1], SH = g.stride[1];

  // Output rows [p_begin, p_end) of the strip read input rows [h_begin, h_end).
  const int32_t p_begin = strip * strip_rows, p_end = min(p_begin + strip_rows, g.out[1]);
  int32_t start, h_begin, h_end, unused;
  g.window_span(1, p_end - 1, &start, &unused, &h_end);
  g.window_span(1, p_begin, &start, &h_begin, &unused);
  // Output columns q0 + j read input columns w0 + j*SW + [0, KW): column c = w0 + c, loaded
  // when it lies on the input (ok[c]). The others stay at the reduction's identity (-inf;
  // -0.0 for avg, which leaves every sum unchanged), so the taps need no per-column test.
  const int32_t q0 = qg * J, w0 = q0 * SW - g.pad_lo[2];
  bool ok[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) ok[c] = uint32_t(w0 + c) < uint32_t(W);
  int32_t cols_in[J];
  bool col_first_in[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    cols_in[j] = 0;
#pragma unroll
    for (int s = 0; s < KW; ++s) cols_in[j] += ok[j * SW + s];
    col_first_in[j] = ok[j * SW];
  }
  const int32_t x0 = (n * H * W + w0) * C + lane * V;  // column w0 of row 0 (maybe < 0)

  A id[V];  // the reduction's identity in every channel
#pragma unroll
  for (int c = 0; c < V; ++c)
    id[c] = R == Reduce::kAvg ? A(-0.0) : -std::numeric_limits<A>::infinity();
  const Words identity = Words::pack(id);
  Words ring[kRing][kCols];  // kStripAhead rows in flight beyond the one being reduced
#pragma unroll
  for (int b = 0; b < kRing; ++b)
#pragma unroll
    for (int c = 0; c < kCols; ++c) ring[b][c] = identity;
  auto load_row = [&](Words (&row)[kCols], int32_t h) {
    const int32_t at = x0 + h * W * C;
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (ok[c]) row[c] = Words::load(x + (at + c * C));
  };

  // Slot i holds the state of output row p + i; input row h is tap row r0 - i*SH of it.
  State st[L][J];
#pragma unroll
  for (int i = 0; i < L; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j) st[i][j].init();
  int32_t p = p_begin, r0 = h_begin - start;
  int32_t out = ((n * g.out[1] + p) * g.out[2] + q0) * C + lane * V;
  // Stores output row p (slot 0), moves the slots up and starts output p + L in the last.
  auto finish = [&]() {
    int32_t s, lo, hi;
    g.window_span(1, p, &s, &lo, &hi);  // (D: window 1, no padding)
    store_columns<T, V, 1>(g, st[0], out, q0, hi - lo, cols_in, lo == s && lo < hi,
                           col_first_in, y, idx, include_pad);
#pragma unroll
    for (int i = 0; i + 1 < L; ++i)
#pragma unroll
      for (int j = 0; j < J; ++j) st[i][j] = st[i + 1][j];
#pragma unroll
    for (int j = 0; j < J; ++j) st[L - 1][j].init();
    ++p;
    r0 -= SH;
    out += g.out[2] * C;
  };
  // Input row h: first the outputs whose windows ended above it, then its taps into each
  // output row whose window holds it (slot i when h is its tap row r0 - i*SH), in column order:
  // every window takes its taps in row-major order. max reduces the row's taps of each window
  // first (the selection rule is associative: the same value and index), 4 + 3 merges per row
  // of a 3x3/2 pool instead of 9; avg adds tap by tap, in the order of window_fwd (the same
  // sums, bit for bit).
  auto reduce_row = [&](const Words (&row)[kCols]) {
    while (p < p_end && r0 >= KH) finish();
    [[maybe_unused]] State part[J];
    if constexpr (R != Reduce::kAvg) {
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int s = 0; s < KW; ++s) {
          A v[V];
          row[j * SW + s].unpack(v);
          if (s == 0) part[j].first_tap(v, 0);
          else part[j].add_tap(v, s);
        }
    }
#pragma unroll
    for (int i = 0; i < L; ++i) {
      const int32_t r = r0 - i * SH;
      if (p + i < p_end && uint32_t(r) < uint32_t(KH)) {
        if constexpr (R == Reduce::kAvg) {
#pragma unroll
          for (int c = 0; c < kCols; ++c) {
            A v[V];
            row[c].unpack(v);
#pragma unroll
            for (int j = 0; j < J; ++j)
              if (c >= j * SW && c < j * SW + KW) st[i][j].add_tap(v, 0);
          }
        } else {
#pragma unroll
          for (int j = 0; j < J; ++j) st[i][j].merge(part[j], r * KW);
        }
      }
    }
    ++r0;
  };

#pragma unroll
  for (int a = 0; a < kStripAhead; ++a)
    if (h_begin + a < h_end) load_row(ring[a], h_begin + a);
  // The ring unrolled by its length: every buffer is named at compile time (a run-time index
  // would put it in local memory, and copying a buffer would wait for its loads).
  for (int32_t h = h_begin; h < h_end; h += kRing) {
#pragma unroll
    for (int b = 0; b < kRing; ++b) {
      if (h + b >= h_end) break;
      if (h + b + kStripAhead < h_end)
        load_row(ring[(b + kStripAhead) % kRing], h + b + kStripAhead);
      reduce_row(ring[b]);
    }
  }
  while (p < p_end) finish();
}

template <typename T, int V, int G, bool kMax, typename Idx>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
window_bwd_kernel(Geom g, const T* __restrict__ dy, const Idx* __restrict__ idx,
                  T* __restrict__ dx, bool include_pad) {
  using A = dev_acc_t<T>;
  cuda::await_prior_grids();
  const int32_t items = g.N * g.in_spatial() * g.lanes;
  for (int64_t i = blockIdx.x * kThreads + threadIdx.x; i < items; i += gridDim.x * kThreads) {
    const int32_t e = int32_t(i);  // (the 64-bit counter cannot overflow past `items`)
    int32_t lane, d, h, w;
    const int32_t pos = g.lanes_div.divmod(e, &lane);  // input position (n, d, h, w)
    const int32_t n = g.split(pos, g.in_div, &d, &h, &w);
    int32_t z0, z1, p0, p1, q0, q1;
    g.covering(0, d, &z0, &z1);
    g.covering(1, h, &p0, &p1);
    g.covering(2, w, &q0, &q1);
    const int32_t yn = n * g.out[0];  // first output plane of image n
    A sum[G * V];
#pragma unroll
    for (int i = 0; i < G * V; ++i) sum[i] = A(0);
    for (int32_t z = z0; z < z1; ++z)
      for (int32_t pp = p0; pp < p1; ++pp)
#pragma unroll 2
        for (int32_t q = q0; q < q1; ++q) {
          const int32_t off = (((yn + z) * g.out[1] + pp) * g.out[2] + q) * g.C + lane * V;
          int32_t k = 0;  // this input's index inside window (z, pp, q)
          A scale = A(1);
          if constexpr (kMax) {
            k = ((d - z * g.stride[0] + g.pad_lo[0]) * g.window[1] +
                 (h - pp * g.stride[1] + g.pad_lo[1])) * g.window[2] +
                (w - q * g.stride[2] + g.pad_lo[2]);
          } else if (include_pad) {
            scale = A(1) / A(g.window_size());
          } else {
            int32_t s, a0, a1, b0, b1, c0, c1;
            g.window_span(0, z, &s, &a0, &a1);
            g.window_span(1, pp, &s, &b0, &b1);
            g.window_span(2, q, &s, &c0, &c1);
            scale = A(1) / A((a1 - a0) * (b1 - b0) * (c1 - c0));
          }
#pragma unroll
          for (int j = 0; j < G; ++j) {
            A v[V];
            load_channels<T, V>(dy + off + j * g.lanes * V, v);
            if constexpr (kMax) {
              const IdxVec<Idx, V> iv =
                  *reinterpret_cast<const IdxVec<Idx, V>*>(idx + off + j * g.lanes * V);
#pragma unroll
              for (int i = 0; i < V; ++i) sum[j * V + i] += int32_t(iv.v[i]) == k ? v[i] : A(0);
            } else {
#pragma unroll
              for (int i = 0; i < V; ++i) sum[j * V + i] += v[i] * scale;
            }
          }
        }
    const int32_t out = pos * g.C + lane * V;
#pragma unroll
    for (int j = 0; j < G; ++j) store_channels<T, V>(dx + out + j * g.lanes * V, sum + j * V);
  }
}

template <typename T, typename Idx>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
max_gather_kernel(Geom g, const T* __restrict__ t, const Idx* __restrict__ idx,
                  T* __restrict__ y) {
  cuda::await_prior_grids();
  const int32_t items = g.N * g.out_spatial() * g.C;  // lanes == C: one channel per thread
  const int32_t RS = g.window[1] * g.window[2];
  for (int64_t i = blockIdx.x * kThreads + threadIdx.x; i < items; i += gridDim.x * kThreads) {
    const int32_t e = int32_t(i);  // (the 64-bit counter cannot overflow past `items`)
    int32_t c, z, pp, q;
    const int32_t pos = g.lanes_div.divmod(e, &c);
    const int32_t n = g.split(pos, g.out_div, &z, &pp, &q);
    const Idx k = idx[e];
    if (k == kNoIndex<Idx>) {
      y[e] = from_acc<T>(0.0f);
      continue;
    }
    const int32_t kk = int32_t(k);
    const int32_t d = z * g.stride[0] - g.pad_lo[0] + kk / RS;
    const int32_t h = pp * g.stride[1] - g.pad_lo[1] + kk / g.window[2] % g.window[1];
    const int32_t w = q * g.stride[2] - g.pad_lo[2] + kk % g.window[2];
    y[e] = t[((n * g.in[0] + d) * g.in[1] + h) * g.in[2] * g.C + w * g.C + c];
  }
}

// ---- host side ----

struct Layout {
  int vec;     // channels per vector: the 16-byte width, or 1
  int groups;  // vectors per thread
  int cols;    // output columns per thread (forward)
};

template <typename T, typename Idx>
Layout choose_layout(const Problem& p, const Buffers& b, bool fwd) {
  constexpr int kN = cuda::Vec<T>::kN;
  const void* index = b.index_in != nullptr ? b.index_in : b.index_out;
  Layout l{1, 1, 1};
  if (p.C % kN == 0 && aligned(b.a, cuda::kVecBytes) && aligned(b.result, cuda::kVecBytes) &&
      aligned(index, alignof(IdxVec<Idx, kN>))) {
    // Two vectors per thread when a position has >= 16 (8+ lanes still read 128 contiguous
    // bytes); not with int32 indices, whose 32-byte index vectors would not fit the registers.
    const bool pair = p.C / kN >= 16 && (p.C / kN) % 2 == 0 && sizeof(Idx) == 1;
    l = {kN, pair ? 2 : 1, 1};
  }
  // Two output columns per thread in the forward (up to 16 channels of state each), when
  // their windows leave no gap between them (stride <= window): twice the bytes in flight
  // per thread for the same index arithmetic, and taps shared by both windows read once.
  if (fwd && p.out[2] >= 2 && p.stride[2] <= p.window[2] && l.vec * l.groups * 2 <= 16)
    l.cols = 2;
  return l;
}

// Calls fn(integral_constant V, integral_constant G) for the layout (G = 2 only compiled
// where choose_layout can pick it).
template <int kN, bool kPairs, typename Fn>
void with_layout(Layout l, Fn&& fn) {
  using One = std::integral_constant<int, 1>;
  if (l.vec == 1) fn(One{}, One{});
  else if constexpr (kPairs) {
    if (l.groups == 2) fn(std::integral_constant<int, kN>{}, std::integral_constant<int, 2>{});
    else fn(std::integral_constant<int, kN>{}, One{});
  } else {
    fn(std::integral_constant<int, kN>{}, One{});
  }
}

// The registry. tile and strip run on the vector path: C in whole 16-byte vectors (the
// buffers are 16-byte aligned, as XLA's are).
constexpr int64_t kTileWindow = 2;

Support vector_channels(const Args& a) {
  const int64_t n = cuda::kVecBytes / dtype_bytes(a.dtype);
  if (a.p.C % n == 0) return Support::Yes();
  return Support::No("C = " + std::to_string(a.p.C) + " channels are not whole 16-byte vectors");
}

// Whether a window runs in 2-D (window and stride 1 along D, no D padding).
bool planar(const Problem& p) {
  return p.window[0] == 1 && p.stride[0] == 1 && p.pad_lo[0] == 0 && p.pad_hi[0] == 0;
}

// Output rows whose windows hold an input row (along H).
int64_t strip_live_rows(const Problem& p) { return (p.window[1] + p.stride[1] - 1) / p.stride[1]; }

Support global_support(const Args& a) {
  if (a.p.global()) return Support::Yes();
  return Support::No("the window does not cover the whole (unpadded) input");
}

Support tile_support(const Args& a) {
  const Problem& p = a.p;
  bool tiles = planar(p);
  for (int ax = 1; ax < 3; ++ax)
    tiles = tiles && p.pad_lo[ax] == 0 && p.pad_hi[ax] == 0 && p.window[ax] == kTileWindow &&
            p.stride[ax] == kTileWindow;
  if (!tiles) return Support::No("the windows do not tile the input (2x2, stride 2, no padding)");
  return vector_channels(a);
}

Support strip_support(const Args& a) {
  const Problem& p = a.p;
  bool shape = false;
  std::apply(
      [&](auto... shapes) {
        ((shape = shape || (p.window[2] == decltype(shapes)::kW &&
                            p.stride[2] == decltype(shapes)::kStride &&
                            strip_live_rows(p) == decltype(shapes)::kLive)),
         ...);
      },
      StripShapes{});
  if (!planar(p) || p.stride[1] > p.window[1] || !shape)
    return Support::No("not a 2-D window of a strip shape (3 wide, stride 2 along W; 2 output "
                       "rows per input row along H)");
  return vector_channels(a);
}

Support any_call(const Args&) { return Support::Yes(); }

const Algorithm kGlobal{"global", true, global_support};
const Algorithm kTile{"tile", true, tile_support};
const Algorithm kStrip{"strip", true, strip_support};
const Algorithm kWindow{"window", true, any_call};
const Algorithm kGather{"gather", false, any_call};

// The forward ops on tile_fwd_kernel (windows that tile the input: tile_support), on the
// vector path.
template <typename T, typename Idx>
Status tile_forward(const Args& a, const Buffers& b, const Layout& layout, cudaStream_t stream) {
  constexpr int kN = cuda::Vec<T>::kN, kK = kTileWindow;
  const Problem& p = a.p;
  if (layout.vec != kN) return Status::Error("pool tile: buffers not 16-byte aligned");
  const int64_t xi = p.in_spatial() * p.C, yi = p.out_spatial() * p.C;  // per image
  const T* in = static_cast<const T*>(b.a);
  T* out = static_cast<T*>(b.result);
  Idx* idx_out = static_cast<Idx*>(b.index_out);
  return over_batch_slices(p, int32_t(p.C / kN), [&](const Geom& g, int64_t n0) {
    const unsigned grid = cuda::grid_for(int64_t(g.N) * p.out_spatial() * g.lanes, kThreads);
    auto run = [&](auto kernel, auto* index, const char* name) {
      return cuda::launch(name, kernel, grid, kThreads, 0, stream, g, in + n0 * xi,
                          out + n0 * yi, index);
    };
    uint8_t* const none = nullptr;
    switch (a.op) {
      case Op::kMaxFwd:
        return run(tile_fwd_kernel<T, kK, Reduce::kMax, uint8_t>, none,
                   "pool tile_fwd_kernel (max)");
      case Op::kMaxFwdIndex:
        return run(tile_fwd_kernel<T, kK, Reduce::kMaxIndex, Idx>, idx_out + n0 * yi,
                   "pool tile_fwd_kernel (max with index)");
      case Op::kAvgFwd:
        return run(tile_fwd_kernel<T, kK, Reduce::kAvg, uint8_t>, none,
                   "pool tile_fwd_kernel (avg)");
      default:
        return Status::Error("pool: unexpected op");
    }
  });
}

// One strip_fwd_kernel launch over the planes of g. Strip length: as many strips per plane as
// one wave of resident blocks holds (at least one strip, at most one output row each), so
// that the grid fills the GPU while the rows shared by two strips (one per strip boundary
// for 3x3/2) stay few.
template <typename T, typename S, Reduce R, typename I>
Status launch_strip(const Problem& p, const Geom& g, const T* x, T* y, I* idx, bool inc,
                    cudaStream_t stream) {
  constexpr int J = kStripCols<T, R>;
  const int64_t groups = (p.out[2] + J - 1) / J;
  const int64_t per_strip = int64_t(g.N) * p.in[0] * groups * g.lanes;  // threads
  if (per_strip == 0) return Status::Ok();
  const int64_t wave =  // blocks of one full wave (resident_grid caps its answer at `work`)
      cuda::resident_grid<strip_fwd_kernel<T, S, R, I>, kThreads>(
          std::numeric_limits<int64_t>::max());
  const int64_t want = std::clamp<int64_t>(wave * kThreads / per_strip, 1, p.out[1]);
  const int64_t rows = (p.out[1] + want - 1) / want, strips = (p.out[1] + rows - 1) / rows;
  return cuda::launch("pool strip_fwd_kernel", strip_fwd_kernel<T, S, R, I>,
                      cuda::grid_for(per_strip * strips, kThreads), kThreads, 0, stream, g,
                      FastDiv(uint32_t(groups)), FastDiv(uint32_t(strips)), int32_t(rows), x, y,
                      idx, inc);
}

// The forward ops on strip_fwd_kernel (2-D windows of a StripShapes entry: strip_support), on
// the vector path.
template <typename T, typename Idx>
Status strip_forward(const Args& a, const Buffers& b, const Layout& layout, cudaStream_t stream) {
  const Problem& p = a.p;
  constexpr int kN = cuda::Vec<T>::kN;
  if (layout.vec != kN) return Status::Error("pool strip: buffers not 16-byte aligned");
  const int64_t live = strip_live_rows(p);
  Status status = Status::Error("pool strip: no strip shape matches the window");
  const int64_t xi = p.in_spatial() * p.C, yi = p.out_spatial() * p.C;  // per image
  const T* in = static_cast<const T*>(b.a);
  T* out = static_cast<T*>(b.result);
  Idx* idx_out = static_cast<Idx*>(b.index_out);
  const bool inc = a.count_include_pad;
  bool launched = false;
  auto try_shape = [&](auto shape) {
    using S = decltype(shape);
    if (launched || p.window[2] != S::kW || p.stride[2] != S::kStride || live != S::kLive)
      return;
    launched = true;
    status = over_batch_slices(p, int32_t(p.C / kN), [&](const Geom& g, int64_t n0) {
      const T* x = in + n0 * xi;
      T* y = out + n0 * yi;
      switch (a.op) {
        case Op::kMaxFwd:
          return launch_strip<T, S, Reduce::kMax, uint8_t>(p, g, x, y, nullptr, inc, stream);
        case Op::kMaxFwdIndex:
          return launch_strip<T, S, Reduce::kMaxIndex, Idx>(p, g, x, y, idx_out + n0 * yi, inc,
                                                            stream);
        case Op::kAvgFwd:
          return launch_strip<T, S, Reduce::kAvg, uint8_t>(p, g, x, y, nullptr, inc, stream);
        default:
          return Status::Error("pool: unexpected op");
      }
    });
  };
  std::apply([&](auto... shapes) { (try_shape(shapes), ...); }, StripShapes{});
  return status;
}

template <typename T, typename Idx>
Status run_typed(const Algorithm& algo, const Args& a, const Buffers& b, cudaStream_t stream) {
  const Problem& p = a.p;
  constexpr int kN = cuda::Vec<T>::kN;
  const int64_t xi = p.in_spatial() * p.C, yi = p.out_spatial() * p.C;  // per image
  const T* in = static_cast<const T*>(b.a);
  T* out = static_cast<T*>(b.result);
  const Idx* idx_in = static_cast<const Idx*>(b.index_in);
  Idx* idx_out = static_cast<Idx*>(b.index_out);
  const bool inc = a.count_include_pad;
  Status status;

  if (a.op == Op::kMaxGather) {
    return over_batch_slices(p, int32_t(p.C), [&](const Geom& g, int64_t n0) {
      const int64_t items = g.N * p.out_spatial() * p.C;
      return cuda::launch("pool max_gather_kernel", max_gather_kernel<T, Idx>,
                          cuda::grid_for(items, kThreads), kThreads, 0, stream, g, in + n0 * xi,
                          idx_in + n0 * yi, out + n0 * yi);
    });
  }
  const bool bwd = a.op == Op::kMaxScatter || a.op == Op::kAvgBwd;
  const Layout layout = choose_layout<T, Idx>(p, b, !bwd);
  if (&algo == &kTile) return tile_forward<T, Idx>(a, b, layout, stream);
  if (&algo == &kStrip) return strip_forward<T, Idx>(a, b, layout, stream);
  with_layout<kN, sizeof(Idx) == 1>(layout, [&](auto v_c, auto g_c) {
    constexpr int V = decltype(v_c)::value, G = decltype(g_c)::value;
    const int32_t lanes = int32_t(p.C / (V * G));
    status = over_batch_slices(p, lanes, [&](const Geom& g, int64_t n0) {
      // Forward reduction R with selection indices of type I (index: nullptr without), over
      // groups of `layout.cols` output columns (2 only compiled where choose_layout can pick
      // it, and with one-byte indices).
      auto forward = [&](auto r_c, auto* index, const char* name) {
        using I = std::remove_pointer_t<decltype(index)>;
        auto launch = [&](auto j_c) {
          constexpr int J = decltype(j_c)::value;
          const int64_t groups = (p.out[2] + J - 1) / J;
          const int64_t items = g.N * p.out[0] * p.out[1] * groups * lanes;
          if (items == 0) return Status::Ok();
          return cuda::launch(name, window_fwd_kernel<T, V, G, J, decltype(r_c)::value, I>,
                              cuda::grid_for(items, kThreads), kThreads, 0, stream, g,
                              FastDiv(uint32_t(groups)), in + n0 * xi, out + n0 * yi, index, inc);
        };
        if constexpr (sizeof(I) == 1 && V * G * 2 <= 16) {
          if (layout.cols == 2) return launch(std::integral_constant<int, 2>{});
        }
        return launch(std::integral_constant<int, 1>{});
      };
      using RC = std::integral_constant<Reduce, Reduce::kMax>;
      using RI = std::integral_constant<Reduce, Reduce::kMaxIndex>;
      using RA = std::integral_constant<Reduce, Reduce::kAvg>;
      uint8_t* const no_index = nullptr;
      const unsigned blocks = cuda::grid_for(g.N * p.in_spatial() * lanes, kThreads);
      switch (a.op) {
        case Op::kMaxFwd:
          return forward(RC{}, no_index, "pool window_fwd_kernel (max)");
        case Op::kMaxFwdIndex:
          return forward(RI{}, idx_out + n0 * yi, "pool window_fwd_kernel (max with index)");
        case Op::kAvgFwd:
          return forward(RA{}, no_index, "pool window_fwd_kernel (avg)");
        case Op::kMaxScatter:
          return cuda::launch("pool window_bwd_kernel (max)", window_bwd_kernel<T, V, G, true, Idx>,
                              blocks, kThreads, 0, stream, g, in + n0 * yi, idx_in + n0 * yi,
                              out + n0 * xi, inc);
        case Op::kAvgBwd:
          return cuda::launch("pool window_bwd_kernel (avg)",
                              window_bwd_kernel<T, V, G, false, uint8_t>, blocks, kThreads, 0,
                              stream, g, in + n0 * yi, static_cast<const uint8_t*>(nullptr),
                              out + n0 * xi, inc);
        default:
          return Status::Error("pool: unexpected op");
      }
    });
  });
  return status;
}

}  // namespace
}  // namespace jaxdnn::pool::gpu

namespace jaxdnn::pool {

const std::vector<const Algorithm*>& cuda_algorithms() {
  static const std::vector<const Algorithm*> kAll = {&gpu::kGlobal, &gpu::kTile, &gpu::kStrip,
                                                     &gpu::kWindow, &gpu::kGather};
  return kAll;
}

Status cuda_run(const Algorithm& algo, const Args& a, const Buffers& b, cudaStream_t stream) {
  Status s = validate(a.p);
  if (!s.ok()) return s;
  if (&algo == &gpu::kGlobal) return gpu::global_fwd(a, b, stream);
  const bool ok = dispatch_io(a.dtype, a.dtype, [&](auto tag, auto) {
    using T = cuda::device_t<decltype(tag)>;
    s = a.index == IndexType::kU8 ? gpu::run_typed<T, uint8_t>(algo, a, b, stream)
                                  : gpu::run_typed<T, int32_t>(algo, a, b, stream);
  });
  if (!ok) return Status::Error(std::string("pool: unsupported dtype ") + dtype_name(a.dtype));
  return s;
}

}  // namespace jaxdnn::pool
