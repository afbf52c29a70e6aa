// Operand loaders of the GEMM core (cuda_gemm_core.cuh): how one thread finds the 16-byte
// chunks of a (BMN x 128-byte) k-slice of A or B in the conv tensors and copies them to shared
// memory. Each loader is a small state machine: the constructor places the thread's chunks at
// k-slice kt0 (one round of divisions), next() advances by one slice (increments only), load()
// issues the cp.asyncs, zero-filling padding, holes and the ragged edges.
//
//   loader        layout    rows x cols of the GEMM operand   used by
//   ActRows<fwd>  k-major   pixels x (tap, Cg)                implicit_gemm fwd A (x)
//   ActRows<bwd>  k-major   pixels x (tap, Kg)                implicit_gemm bwd_data A (dy)
//   TableRows     k-major   same, offsets from a table        implicit_precomp_gemm A
//   TableCols     mn-major  like ActCols, offsets from a table implicit_precomp_gemm bwd_filter A
//   WeightRows    k-major   Cg x (tap, Kg)                    bwd_data B (w^T)
//   ActCols       mn-major  (n,z,p,q) x (tap, Cg)             implicit_gemm bwd_filter A (x^T)
//   PlainK        k-major   a row-major matrix                im2col_gemm A (fwd, bwd_data)
//   PlainMn       mn-major  a row-major matrix                w (fwd B), dy (bwd_filter B),
//                                                             im2col_gemm bwd_filter A
//   TmaMn         mn-major  the same through TMA boxes        implicit_precomp_gemm's wgmma B
//   TmaKRows      k-major   rows of a matrix through TMA      implicit_precomp_gemm's wgmma
//                                                             bwd_data B, TF32 fwd B (w^T)
//   TmaIm2col     k-major   pixels x (tap, Cg) through TMA's  implicit_precomp_gemm's wgmma
//                           im2col mode                       A (fwd, stride-1 bwd_data)
//   TmaIm2colCols mn-major  (tap, Cg) x pixels, the same      implicit_precomp_gemm's wgmma
//                                                             bwd_filter A (x^T)
#pragma once

#include <cstdint>

#include "cc/conv/conv.h"
#include "cc/conv/gather_geo.h"
#include "cc/conv/cuda_gemm_core.cuh"
#include "cc/conv/cuda_tma.cuh"

namespace jaxdnn::conv::gemm {

// Position kk = tap * Cch + c along a (taps x channels) reduction, tap = (t * R + r) * S + s.
// A chunk never straddles two taps because Cch is a multiple of the chunk's elements.
struct TapCursor {
  int c, tap, t, r, s;
  __device__ __forceinline__ void set(int kk, int cch, const Geo& g) {
    tap = kk / cch;
    c = kk - tap * cch;
    s = tap % g.filt[2];
    r = tap / g.filt[2] % g.filt[1];
    t = tap / (g.filt[2] * g.filt[1]);
  }
  __device__ __forceinline__ void advance(int step, int cch, const Geo& g) {
    c += step;
    while (c >= cch) {
      c -= cch;
      ++tap;
      if (++s == g.filt[2]) {
        s = 0;
        if (++r == g.filt[1]) { r = 0; ++t; }
      }
    }
  }
};

// The slice cursor of the TMA loaders whose slices are one tap each (per_tap a multiple of
// the slice): k = tap * per_tap + kc.
struct SliceTap {
  int tap, kc;
  __device__ __forceinline__ void set(int kk, int per_tap) {
    tap = kk / per_tap;
    kc = kk - tap * per_tap;
  }
  __device__ __forceinline__ void advance(int step, int per_tap) {
    kc += step;
    if (kc == per_tap) {
      kc = 0;
      ++tap;
    }
  }
};

// Position of pixel j = ((n * D0 + d) * D1 + h) * D2 + w over dims `dims`.
struct PixelCursor {
  int n, d, h, w;
  __device__ __forceinline__ void set(int j, const int (&dims)[3]) {
    w = j % dims[2];
    h = j / dims[2] % dims[1];
    d = j / (dims[2] * dims[1]) % dims[0];
    n = j / (dims[2] * dims[1] * dims[0]);
  }
  __device__ __forceinline__ void advance(int step, const int (&dims)[3]) {
    w += step;
    while (w >= dims[2]) {
      w -= dims[2];
      if (++h == dims[1]) {
        h = 0;
        if (++d == dims[0]) { d = 0; ++n; }
      }
    }
  }
};

// A of fwd (x gathered: rows = output pixels, k = (tap, c in Cg)) and of bwd_data (dy
// gathered: rows = input pixels, k = (tap, k in Kg)).
template <typename T, Direction kDir, int BMN, int THREADS>
struct ActRows : Elems<T> {
  static constexpr bool kKMajor = true;
  using TileT = KMajorTile<BMN>;
  using Map = ChunkMap<BMN, TileT::kCpr, THREADS>;
  static constexpr bool kFwd = kDir == Direction::kFwd;
  struct Params { const T* act; Geo geo; int M; };

  const Params& p;
  PixelCursor row[Map::kPerThread];
  bool row_ok[Map::kPerThread];
  TapCursor k;
  int cch, col;
  const T* base;

  __device__ __forceinline__ ActRows(const Params& params, int mn0, int g, int kt0, int tid)
      : p(params) {
    const Geo& geo = p.geo;
    cch = kFwd ? geo.Cg : geo.Kg;
    base = p.act + int64_t(g) * cch;
    col = Map::col(tid);
#pragma unroll
    for (int i = 0; i < Map::kPerThread; ++i) {
      const int m = mn0 + Map::row0(tid) + i * Map::kRowStep;
      row_ok[i] = m < p.M;
      row[i].set(m, kFwd ? geo.out : geo.in);
    }
    k.set(kt0 * Elems<T>::kBK + col * Elems<T>::kEpc, cch, geo);
  }

  __device__ __forceinline__ void load(uint32_t tile) {
    const Geo& geo = p.geo;
    const int* dims = kFwd ? geo.in : geo.out;
    const int channels = kFwd ? geo.C : geo.K;
#pragma unroll
    for (int i = 0; i < Map::kPerThread; ++i) {
      int a0, a1, a2;
      if constexpr (kFwd) {
        a0 = fwd_coord(geo, 0, row[i].d, k.t);
        a1 = fwd_coord(geo, 1, row[i].h, k.r);
        a2 = fwd_coord(geo, 2, row[i].w, k.s);
      } else {
        a0 = bwd_coord(geo, 0, row[i].d, k.t);
        a1 = bwd_coord(geo, 1, row[i].h, k.r);
        a2 = bwd_coord(geo, 2, row[i].w, k.s);
      }
      const bool ok = row_ok[i] && k.t < geo.filt[0] && (a0 | a1 | a2) >= 0;
      const int64_t pix = ((int64_t(row[i].n) * dims[0] + a0) * dims[1] + a1) * dims[2] + a2;
      cp_async16(tile + TileT::offset(Map::row0(threadIdx.x) + i * Map::kRowStep, col),
                 ok ? base + pix * channels + k.c : p.act, ok);
    }
  }

  __device__ __forceinline__ void next() { k.advance(Elems<T>::kBK, cch, p.geo); }
};

// A of implicit_precomp_gemm: like ActRows, but the element offset of every (pixel, tap) pair
// (or -1 for padding) comes from a table built once per call in the workspace.
template <typename T, int BMN, int THREADS>
struct TableRows : Elems<T> {
  static constexpr bool kKMajor = true;
  using TileT = KMajorTile<BMN>;
  using Map = ChunkMap<BMN, TileT::kCpr, THREADS>;
  struct Params { const T* act; const int* table; Geo geo; int M; int cch; };

  const Params& p;
  const int* rows[Map::kPerThread];  // table row of each of the thread's pixels, or null
  TapCursor k;
  int col;
  const T* base;

  __device__ __forceinline__ TableRows(const Params& params, int mn0, int g, int kt0, int tid)
      : p(params) {
    base = p.act + int64_t(g) * p.cch;
    col = Map::col(tid);
    const int taps = p.geo.taps();
#pragma unroll
    for (int i = 0; i < Map::kPerThread; ++i) {
      const int m = mn0 + Map::row0(tid) + i * Map::kRowStep;
      rows[i] = m < p.M ? p.table + int64_t(m) * taps : nullptr;
    }
    k.set(kt0 * Elems<T>::kBK + col * Elems<T>::kEpc, p.cch, p.geo);
  }

  __device__ __forceinline__ void load(uint32_t tile) {
    const bool k_ok = k.t < p.geo.filt[0];
#pragma unroll
    for (int i = 0; i < Map::kPerThread; ++i) {
      const int off = (rows[i] != nullptr && k_ok) ? __ldg(rows[i] + k.tap) : -1;
      cp_async16(tile + TileT::offset(Map::row0(threadIdx.x) + i * Map::kRowStep, col),
                 off >= 0 ? base + off + k.c : p.act, off >= 0);
    }
  }

  __device__ __forceinline__ void next() { k.advance(Elems<T>::kBK, p.cch, p.geo); }
};

// B of bwd_data: w^T, rows = c in Cg, k = (tap, k in Kg), at w[(tap * Cg + c) * K + g*Kg + k].
template <typename T, int BMN, int THREADS>
struct WeightRows : Elems<T> {
  static constexpr bool kKMajor = true;
  using TileT = KMajorTile<BMN>;
  using Map = ChunkMap<BMN, TileT::kCpr, THREADS>;
  struct Params { const T* w; Geo geo; };

  const Params& p;
  int c0;  // the thread's first row (input channel)
  TapCursor k;
  int col;
  const T* base;

  __device__ __forceinline__ WeightRows(const Params& params, int mn0, int g, int kt0, int tid)
      : p(params) {
    base = p.w + int64_t(g) * p.geo.Kg;
    col = Map::col(tid);
    c0 = mn0 + Map::row0(tid);
    k.set(kt0 * Elems<T>::kBK + col * Elems<T>::kEpc, p.geo.Kg, p.geo);
  }

  __device__ __forceinline__ void load(uint32_t tile) {
    const Geo& geo = p.geo;
#pragma unroll
    for (int i = 0; i < Map::kPerThread; ++i) {
      const int c = c0 + i * Map::kRowStep;
      const bool ok = c < geo.Cg && k.t < geo.filt[0];
      cp_async16(tile + TileT::offset(Map::row0(threadIdx.x) + i * Map::kRowStep, col),
                 ok ? base + (int64_t(k.tap) * geo.Cg + c) * geo.K + k.c : p.w, ok);
    }
  }

  __device__ __forceinline__ void next() { k.advance(Elems<T>::kBK, p.geo.Kg, p.geo); }
};

// A of bwd_filter: x^T, rows (of the shared tile) = k = output pixels (n, z, p, q),
// mn = (tap, c in Cg), at x[n, in(z, t), in(p, r), in(q, s), g*Cg + c].
template <typename T, int BMN, int THREADS>
struct ActCols : Elems<T> {
  static constexpr bool kKMajor = false;
  using TileT = MnMajorTile<T, BMN, Elems<T>::kBK>;
  using Map = ChunkMap<Elems<T>::kBK, TileT::kCpr, THREADS>;
  struct Params { const T* x; Geo geo; int M; int pixels; };

  const Params& p;
  PixelCursor row[Map::kPerThread];
  int j0;            // pixel of the thread's first row in the current slice
  TapCursor tap;     // of the thread's column
  bool col_ok;
  int col;
  const T* base;

  __device__ __forceinline__ ActCols(const Params& params, int mn0, int g, int kt0, int tid)
      : p(params) {
    const Geo& geo = p.geo;
    col = Map::col(tid);
    const int m = mn0 + col * Elems<T>::kEpc;
    col_ok = m < p.M;
    tap.set(m, geo.Cg, geo);
    base = p.x + int64_t(g) * geo.Cg + tap.c;
    j0 = kt0 * Elems<T>::kBK + Map::row0(tid);
#pragma unroll
    for (int i = 0; i < Map::kPerThread; ++i) row[i].set(j0 + i * Map::kRowStep, geo.out);
  }

  __device__ __forceinline__ void load(uint32_t tile) {
    const Geo& geo = p.geo;
#pragma unroll
    for (int i = 0; i < Map::kPerThread; ++i) {
      const int a0 = fwd_coord(geo, 0, row[i].d, tap.t), a1 = fwd_coord(geo, 1, row[i].h, tap.r),
                a2 = fwd_coord(geo, 2, row[i].w, tap.s);
      const bool ok = col_ok && j0 + i * Map::kRowStep < p.pixels && (a0 | a1 | a2) >= 0;
      const int64_t pix = ((int64_t(row[i].n) * geo.in[0] + a0) * geo.in[1] + a1) * geo.in[2] + a2;
      cp_async16(tile + TileT::offset(Map::row0(threadIdx.x) + i * Map::kRowStep, col),
                 ok ? base + pix * geo.C : p.x, ok);
    }
  }

  __device__ __forceinline__ void next() {
    j0 += Elems<T>::kBK;
#pragma unroll
    for (int i = 0; i < Map::kPerThread; ++i) row[i].advance(Elems<T>::kBK, p.geo.out);
  }
};

// A of implicit_precomp_gemm's bwd_filter: like ActCols, with the x offset of every (output
// pixel, tap) pair (or -1) from the forward direction's table.
template <typename T, int BMN, int THREADS>
struct TableCols : Elems<T> {
  static constexpr bool kKMajor = false;
  using TileT = MnMajorTile<T, BMN, Elems<T>::kBK>;
  using Map = ChunkMap<Elems<T>::kBK, TileT::kCpr, THREADS>;
  struct Params { const T* x; const int* table; int taps; int M; int pixels; int Cg; };

  const Params& p;
  int tap, j0, col;
  bool col_ok;
  const T* base;

  __device__ __forceinline__ TableCols(const Params& params, int mn0, int g, int kt0, int tid)
      : p(params) {
    col = Map::col(tid);
    const int m = mn0 + col * Elems<T>::kEpc;
    col_ok = m < p.M;
    tap = m / p.Cg;
    base = p.x + int64_t(g) * p.Cg + (m - tap * p.Cg);
    j0 = kt0 * Elems<T>::kBK + Map::row0(tid);
  }

  __device__ __forceinline__ void load(uint32_t tile) {
#pragma unroll
    for (int i = 0; i < Map::kPerThread; ++i) {
      const int j = j0 + i * Map::kRowStep;
      const int off = (col_ok && j < p.pixels) ? __ldg(p.table + int64_t(j) * p.taps + tap) : -1;
      cp_async16(tile + TileT::offset(Map::row0(threadIdx.x) + i * Map::kRowStep, col),
                 off >= 0 ? base + off : p.x, off >= 0);
    }
  }

  __device__ __forceinline__ void next() { j0 += Elems<T>::kBK; }
};

// A row-major matrix with `rows` x `cols` used elements, leading dimension `ld` and group g's
// block at ptr + g * group_stride. Rows are the GEMM's k (mn-major) or its m/n (k-major).
template <typename T>
struct MatrixParams { const T* ptr; int64_t ld; int rows; int cols; int64_t group_stride; };

template <typename T, bool kKMajorT, int BMN, int THREADS>
struct Plain : Elems<T> {
  static constexpr bool kKMajor = kKMajorT;
  using TileT = std::conditional_t<kKMajorT, KMajorTile<BMN>, MnMajorTile<T, BMN, Elems<T>::kBK>>;
  using Map = ChunkMap<TileT::kRows, TileT::kCpr, THREADS>;
  using Params = MatrixParams<T>;

  const Params& p;
  const T* base;
  int r0, c0;  // the thread's first (row, column) element in the current slice

  __device__ __forceinline__ Plain(const Params& params, int mn0, int g, int kt0, int tid)
      : p(params) {
    base = p.ptr + int64_t(g) * p.group_stride;
    const int k0 = kt0 * Elems<T>::kBK, along = Map::col(tid) * Elems<T>::kEpc;
    r0 = (kKMajorT ? mn0 : k0) + Map::row0(tid);
    c0 = (kKMajorT ? k0 : mn0) + along;
  }

  __device__ __forceinline__ void load(uint32_t tile) {
#pragma unroll
    for (int i = 0; i < Map::kPerThread; ++i) {
      const int r = r0 + i * Map::kRowStep;
      const bool ok = r < p.rows && c0 < p.cols;
      cp_async16(tile + TileT::offset(Map::row0(threadIdx.x) + i * Map::kRowStep,
                                      Map::col(threadIdx.x)),
                 ok ? base + r * p.ld + c0 : p.ptr, ok);
    }
  }

  __device__ __forceinline__ void next() {
    if constexpr (kKMajorT) c0 += Elems<T>::kBK; else r0 += Elems<T>::kBK;
  }
};

template <typename T, int BMN, int THREADS> using PlainK = Plain<T, true, BMN, THREADS>;
template <typename T, int BMN, int THREADS> using PlainMn = Plain<T, false, BMN, THREADS>;

// PlainMn through the copy engine (wgmma kernel only, 16-bit): thread 0 issues one TMA box of
// 64 rows of k x 64 columns per 64-column block of the tile, completing on the slice's
// barrier. The map covers the whole matrix; group g's columns start at g * group_cols, and a
// box must not reach into the next group's columns (launchers use it when G == 1 or the
// group's columns are a multiple of 64, where boxes past the edge are zero-filled).
template <typename T, int BMN, int THREADS>
struct TmaMn : Elems<T> {
  static constexpr bool kKMajor = false;
  static constexpr bool kTma = true;
  using TileT = MnMajorTile<T, BMN, Elems<T>::kBK>;
  static constexpr uint32_t kBytes = uint32_t(BMN) * kSliceBytes;  // per slice
  static_assert(sizeof(T) == 2 && BMN % 64 == 0, "TMA boxes of 64 16-bit columns");
  struct Params {
    CUtensorMap map;  // aligned as the driver requires
    int group_cols;
  };

  const Params& p;
  int c0, r0;  // the tile's first column, the current slice's first row

  __device__ __forceinline__ TmaMn(const Params& params, int mn0, int g, int kt0, int)
      : p(params), c0(g * params.group_cols + mn0), r0(kt0 * Elems<T>::kBK) {}

  // Thread 0 only: announces the slice's bytes on `bar` and issues its boxes.
  __device__ __forceinline__ void load(uint32_t tile, uint32_t bar) {
    mbar_expect_bytes(bar, kBytes);
#pragma unroll
    for (int b = 0; b < BMN / 64; ++b)
      tma_load_2d(tile + uint32_t(b * Elems<T>::kBK * kSliceBytes), &p.map, c0 + 64 * b, r0, bar);
  }

  __device__ __forceinline__ void next() { r0 += Elems<T>::kBK; }
};

// What the k-major TMA loaders share: a slice is one box of BMN rows x 128 bytes (64 16-bit
// elements, or 32 float read as TF32).
template <typename T, int BMN>
struct TmaKMajor : Elems<T> {
  static constexpr bool kKMajor = true;
  static constexpr bool kTma = true;
  using TileT = KMajorTile<BMN>;
  static constexpr uint32_t kBytes = uint32_t(BMN) * kSliceBytes;  // per slice
  static_assert(kBoxRow<T> == Elems<T>::kBK, "a box row is one slice row");
};

// A k-major operand whose rows are rows of a row-major matrix in memory, through TMA boxes:
// slice (tap, kc) of the tile at operand rows mn0.. of group g is the box {kBK columns at kc,
// BMN rows at tap * tap_rows + g * group_rows + mn0}, the reduction split into taps of
// tap_cols (a slice is one tap). Two uses:
//   bwd_data B = w^T: w as the (taps * Cg) x K matrix, tap_rows = Cg, tap_cols = Kg (one
//     group);
//   TF32 fwd B = w^T transposed in the workspace (K x Kd): tap_rows = 0, tap_cols = Kd (the
//     whole reduction is one "tap"), group_rows = Kg.
// Rows past the operand's edge read the next tap's or group's (or, past the matrix, zeros)
// into columns of the GEMM that are not stored.
struct TmaKRowsParams {
  CUtensorMap map;  // {cols, rows}, boxes {kBK, BMN}
  int tap_rows, tap_cols, group_rows;

  // The map of the rows x cols row-major matrix m (dense rows), boxes of box_rows.
  template <typename T>
  Status encode(const T* m, int64_t rows, int64_t cols, int box_rows) {
    return encode_tma_2d(&map, m, uint64_t(rows), uint64_t(cols), uint64_t(cols),
                         uint32_t(box_rows));
  }
};

template <typename T, int BMN, int THREADS>
struct TmaKRows : TmaKMajor<T, BMN> {
  using TmaKMajor<T, BMN>::kBytes;
  using Params = TmaKRowsParams;

  const Params& p;
  int r0;      // the tile's first row
  SliceTap k;  // the current slice's tap and first column

  __device__ __forceinline__ TmaKRows(const Params& params, int mn0, int g, int kt0, int)
      : p(params), r0(g * params.group_rows + mn0) {
    k.set(kt0 * Elems<T>::kBK, p.tap_cols);
  }

  // Thread 0 only: announces the slice's bytes on `bar` and issues its box.
  __device__ __forceinline__ void load(uint32_t tile, uint32_t bar) {
    mbar_expect_bytes(bar, kBytes);
    tma_load_2d(tile, &p.map, k.kc, k.tap * p.tap_rows + r0, bar);
  }

  __device__ __forceinline__ void next() { k.advance(Elems<T>::kBK, p.tap_cols); }
};

// What the im2col loaders share: the map (encode_tma_im2col) and the window of the gathered
// tensor. Result pixel (n, p, q) of the GEMM reads base (p * stride_h + lo_h, q * stride_w +
// lo_w) of image n at offset (r * dil_h, s * dil_w) for tap (r, s).
struct Im2colParams {
  CUtensorMap map;
  int Q, PQ;  // result pixels per row and per image
  int stride_h, stride_w, lo_h, lo_w, dil_h, dil_w, R, S;
  int cch;    // channels per group
  bool flip;  // TmaIm2col's bwd_data: tap (r, s) reads the filter's (R-1-r, S-1-s)

  // The base pixel (n, h, w) of result pixel m.
  __device__ __forceinline__ void base(int m, int& n, int& h, int& w) const {
    n = m / PQ;
    const int pq = m - n * PQ, row = pq / Q;
    h = row * stride_h + lo_h;
    w = (pq - row * Q) * stride_w + lo_w;
  }
};

// A of implicit_precomp_gemm's 2-D forward and stride-1 bwd_data on Hopper, through TMA's
// im2col mode: one box per slice, the tile's BMN consecutive result pixels x one slice of
// channels (64 16-bit, 32 TF32) of one tap, in place of the table lookups and per-chunk
// cp.asyncs of TableRows. k = (tap, channel) as in TableRows, channels per group a multiple
// of the slice (a slice is one tap). bwd_data is the forward of dy with the filter flipped
// (`flip`), from base lo = pad - dil * (R-1). Rides on B's barrier arrival (B must be a TMA
// loader too).
template <typename T, int BMN, int THREADS>
struct TmaIm2col : TmaKMajor<T, BMN> {
  using TmaKMajor<T, BMN>::kBytes;
  using Params = Im2colParams;

  const Params& p;
  int n, h, w, c0;  // the tile's first base pixel; the group's first channel
  SliceTap k;       // the current slice's tap and channel

  __device__ __forceinline__ TmaIm2col(const Params& params, int mn0, int g, int kt0, int)
      : p(params), c0(g * params.cch) {
    p.base(mn0, n, h, w);
    k.set(kt0 * Elems<T>::kBK, p.cch);
  }

  // Thread 0 only, before B's load (whose arrival completes the slot's phase).
  __device__ __forceinline__ void load(uint32_t tile, uint32_t bar) {
    int r = k.tap / p.S, s = k.tap - r * p.S;
    if (p.flip) {
      r = p.R - 1 - r;
      s = p.S - 1 - s;
    }
    mbar_expect_more(bar, kBytes);
    tma_load_im2col(tile, &p.map, c0 + k.kc, w, h, n, uint16_t(s * p.dil_w),
                    uint16_t(r * p.dil_h), bar);
  }

  __device__ __forceinline__ void next() { k.advance(Elems<T>::kBK, p.cch); }
};

// A of implicit_precomp_gemm's 2-D bwd_filter on Hopper (x^T, mn-major: rows (tap, c), k =
// output pixels), through the forward's im2col map read kBK pixels at a time: per 64-row
// block of the tile, one box of the slice's kBK consecutive output pixels x 64 channels of
// one tap, placed as TmaMn places its boxes (16-bit; channels per group a multiple of 64, so
// that a block is one tap). Blocks past the taps * cch rows re-read the last block into rows
// that are not stored. Rides on B's barrier arrival, as TmaIm2col.
template <typename T, int BMN, int THREADS>
struct TmaIm2colCols : Elems<T> {
  static constexpr bool kKMajor = false;
  static constexpr bool kTma = true;
  static constexpr int kBlocks = BMN / 64;
  using TileT = MnMajorTile<T, BMN, Elems<T>::kBK>;
  static constexpr uint32_t kBytes = uint32_t(BMN) * kSliceBytes;  // per slice
  static_assert(sizeof(T) == 2 && BMN % 64 == 0, "TMA boxes of 64 16-bit channels");
  using Params = Im2colParams;

  const Params& p;
  int c[kBlocks];                           // each block's channel
  uint16_t off_h[kBlocks], off_w[kBlocks];  // and filter offset
  int m;                                    // the current slice's first output pixel

  __device__ __forceinline__ TmaIm2colCols(const Params& params, int mn0, int g, int kt0, int)
      : p(params), m(kt0 * Elems<T>::kBK) {
    const int rows = p.R * p.S * p.cch;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const int row = min(mn0 + 64 * b, rows - 64);
      const int tap = row / p.cch, r = tap / p.S;
      c[b] = g * p.cch + row - tap * p.cch;
      off_h[b] = uint16_t(r * p.dil_h);
      off_w[b] = uint16_t((tap - r * p.S) * p.dil_w);
    }
  }

  // Thread 0 only, before B's load (whose arrival completes the slot's phase).
  __device__ __forceinline__ void load(uint32_t tile, uint32_t bar) {
    int n, h, w;
    p.base(m, n, h, w);
    mbar_expect_more(bar, kBytes);
#pragma unroll
    for (int b = 0; b < kBlocks; ++b)
      tma_load_im2col(tile + uint32_t(b * Elems<T>::kBK * kSliceBytes), &p.map, c[b], w, h, n,
                      off_w[b], off_h[b], bar);
  }

  __device__ __forceinline__ void next() { m += Elems<T>::kBK; }
};

}  // namespace jaxdnn::conv::gemm
