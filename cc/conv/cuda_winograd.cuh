// Winograd minimal filtering for 3x3 stride-1 convolutions: the transforms, the problem
// geometry and the tile loads/stores shared by the fused F(2x2,3x3) algorithm
// (cuda_winograd.cu) and the non-fused F(4x4,3x3) algorithm (cuda_winograd_nonfused.cu).
//
// F(m x m, 3x3) produces an m x m tile of the correlation y[i][j] = sum_rs d[i+r][j+s] g[r][s]
// from the a x a input tile d that covers it (a = m + 2):
//   Y = A^T [ (G g G^T) (.) (B^T d B) ] A          ((.) = elementwise, a*a "xi" positions)
// Summed over input channels, the elementwise products become a*a independent GEMMs
// M[xi] (tiles x K) = V[xi] (tiles x C) @ U[xi] (C x K) with V = B^T d B and U = G g G^T;
// the output transform is linear, so it runs once after the channel sum. Multiplies per output
// element and channel: a^2/m^2 instead of 9 (16/4 = 4 for F(2x2), 36/16 = 2.25 for F(4x4)).
//
// Transform points (Toom-Cook, plus the point at infinity):
//   F(2x2,3x3)  0, 1, -1                (Lavin & Gray's matrices)
//   F(4x4,3x3)  0, 1, -1, 1/2, -2       B^T and A^T hold only dyadic fractions, so the input
//                                       and output transforms round like plain adds; G's
//                                       thirds and fifteenths are applied in double to the
//                                       filter. Simulated in float32 (random normal data, C=64
//                                       .. 512), the relative L2 error is 1.1e-6 .. 2.8e-6,
//                                       35% below the classic 0, +-1, +-2 choice (1.7e-6 ..
//                                       4.3e-6); F(2x2) gives 2.7e-7 .. 6.9e-7.
//
// Every transform is a "sandwich" out = L in L^T with a constant matrix L (B^T, G, A^T or a
// transpose of one). `sandwich` unrolls it at compile time, skipping zero entries and
// multiplications by +-1, so each becomes the minimal add/FMA sequence.
//
// bwd_data with stride 1 is itself a forward correlation: dx = corr(dy padded by 2 - pad_lo,
// w flipped in r and s, with the channel roles swapped). `Geom` describes the problem a
// kernel computes in that forward form, and the filter transform applies the flip.
//
// Backward filter (the non-fused algorithm): with E = A dy A^T (dy an m x m tile of the
// output gradient) and V = B^T d B, the identity sum_ij Y_ij dy_ij = sum_rs g_rs dW_rs gives
//   dW = G^T [ sum_tiles V (.) E ] G,
// a GEMM over tiles per xi followed by a filter-space transform.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cc/common/cuda_util.h"
#include "cc/conv/conv.h"

namespace jaxdnn::conv::winograd {

// ---- constant transform matrices ------------------------------------------------------------

struct BtF2 {  // B^T of F(2x2,3x3): (4, 4)
  static constexpr int kRows = 4, kCols = 4;
  __host__ __device__ static constexpr double at(int i, int j) {
    constexpr double m[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
    return m[i][j];
  }
};
struct GF2 {  // G of F(2x2,3x3): (4, 3)
  static constexpr int kRows = 4, kCols = 3;
  __host__ __device__ static constexpr double at(int i, int j) {
    constexpr double m[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    return m[i][j];
  }
};
struct AtF2 {  // A^T of F(2x2,3x3): (2, 4)
  static constexpr int kRows = 2, kCols = 4;
  __host__ __device__ static constexpr double at(int i, int j) {
    constexpr double m[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
    return m[i][j];
  }
};

struct BtF4 {  // B^T of F(4x4,3x3), points 0, 1, -1, 1/2, -2, inf: (6, 6)
  static constexpr int kRows = 6, kCols = 6;
  __host__ __device__ static constexpr double at(int i, int j) {
    constexpr double m[6][6] = {{1, -1.5, -2, 1.5, 1, 0},   {0, -1, 0.5, 2.5, 1, 0},
                                {0, 1, -2.5, 0.5, 1, 0},    {0, -2, -1, 2, 1, 0},
                                {0, 0.5, -1, -0.5, 1, 0},   {0, 1, -1.5, -2, 1.5, 1}};
    return m[i][j];
  }
};
struct GF4 {  // G of F(4x4,3x3): (6, 3)
  static constexpr int kRows = 6, kCols = 3;
  __host__ __device__ static constexpr double at(int i, int j) {
    constexpr double m[6][3] = {{1, 0, 0},
                                {1.0 / 3, 1.0 / 3, 1.0 / 3},
                                {-1.0 / 3, 1.0 / 3, -1.0 / 3},
                                {-16.0 / 15, -8.0 / 15, -4.0 / 15},
                                {1.0 / 15, -2.0 / 15, 4.0 / 15},
                                {0, 0, 1}};
    return m[i][j];
  }
};
struct AtF4 {  // A^T of F(4x4,3x3): (4, 6)
  static constexpr int kRows = 4, kCols = 6;
  __host__ __device__ static constexpr double at(int i, int j) {
    constexpr double m[4][6] = {{1, 1, 1, 1, 1, 0},
                                {0, 1, -1, 0.5, -2, 0},
                                {0, 1, 1, 0.25, 4, 0},
                                {0, 1, -1, 0.125, -8, 1}};
    return m[i][j];
  }
};

template <class L>
struct Transposed {
  static constexpr int kRows = L::kCols, kCols = L::kRows;
  __host__ __device__ static constexpr double at(int i, int j) { return L::at(j, i); }
};

// The matrices of F(kM x kM, 3x3).
template <int kM> struct Winograd;
template <> struct Winograd<2> { using Bt = BtF2; using G = GF2; using At = AtF2; };
template <> struct Winograd<4> { using Bt = BtF4; using G = GF4; using At = AtF4; };

// sum_k L[i][k] * x(k), with zero entries skipped and +-1 entries as plain adds (the loop
// bounds and L are compile-time constants, so the branches fold away).
template <class L, typename T, typename X>
__device__ __forceinline__ T row_dot(int i, X x) {
  T acc = 0;
  bool any = false;
#pragma unroll
  for (int k = 0; k < L::kCols; ++k) {
    const double c = L::at(i, k);
    if (c == 0) continue;
    const T term = c == 1 ? x(k) : (c == -1 ? -x(k) : T(c) * x(k));
    acc = any ? acc + term : term;
    any = true;
  }
  return acc;
}

// out = L in L^T: (R, R) from (C, C) for L of shape (R, C).
template <class L, typename T>
__device__ __forceinline__ void sandwich(const T (&in)[L::kCols][L::kCols],
                                         T (&out)[L::kRows][L::kRows]) {
  T tmp[L::kRows][L::kCols];  // L in
#pragma unroll
  for (int i = 0; i < L::kRows; ++i)
#pragma unroll
    for (int j = 0; j < L::kCols; ++j)
      tmp[i][j] = row_dot<L, T>(i, [&](int k) { return in[k][j]; });
#pragma unroll
  for (int i = 0; i < L::kRows; ++i)
#pragma unroll
    for (int j = 0; j < L::kRows; ++j)
      out[i][j] = row_dot<L, T>(j, [&](int k) { return tmp[i][k]; });
}

// ---- the problem in forward form ------------------------------------------------------------

// out[n, p, q, grp*Kg + k] = sum_{r,s,c} in[n, p - pad_h + r, q - pad_w + s, grp*Cg + c] * f[r][s][c][k]
// over a (N, H, W, G*Cg) input and a (N, P, Q, G*Kg) output; reads outside the input are zero.
// For bwd_data, in = dy, out = dx and f is w flipped with its channel roles swapped (flip).
struct Geom {
  int64_t N, H, W, P, Q, pad_h, pad_w, G, Cg, Kg;
  int64_t TP, TQ;  // m x m output tiles per column and per row
  bool flip;

  JAXDNN_HD int64_t tiles() const { return N * TP * TQ; }
  JAXDNN_HD int64_t Cin() const { return G * Cg; }
  JAXDNN_HD int64_t Cout() const { return G * Kg; }
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// The forward form of a fwd or bwd_data problem (bwd_filter uses the fwd one), tiled by kM.
template <int kM>
Geom geom_of(const Problem& p, Direction dir) {
  Geom g{};
  g.N = p.N;
  g.G = p.G;
  g.flip = dir == Direction::kBwdData;
  if (g.flip) {
    g.H = p.out[1], g.W = p.out[2], g.P = p.in[1], g.Q = p.in[2];
    g.pad_h = 2 - p.pad_lo[1], g.pad_w = 2 - p.pad_lo[2];
    g.Cg = p.Kg(), g.Kg = p.Cg();
  } else {
    g.H = p.in[1], g.W = p.in[2], g.P = p.out[1], g.Q = p.out[2];
    g.pad_h = p.pad_lo[1], g.pad_w = p.pad_lo[2];
    g.Cg = p.Cg(), g.Kg = p.Kg();
  }
  g.TP = ceil_div(g.P, kM), g.TQ = ceil_div(g.Q, kM);
  return g;
}

// What both algorithms require of the problem.
inline Support support_3x3(const Args& a) {
  const Problem& p = a.p;
  if (Support s = float_inputs(a); !s.ok) return s;
  if (a.in == DType::kF64 || a.out == DType::kF64) return Support::No("float64: use direct");
  if (p.in[0] != 1 || p.filt[0] != 1 || p.out[0] != 1 || p.pad_lo[0] != 0)
    return Support::No("needs a 2-D problem (D = T = 1)");
  if (p.filt[1] != 3 || p.filt[2] != 3) return Support::No("needs a 3x3 filter");
  if (p.stride[1] != 1 || p.stride[2] != 1) return Support::No("needs stride 1");
  if (p.rhs_dil[1] != 1 || p.rhs_dil[2] != 1 || p.lhs_dil[1] != 1 || p.lhs_dil[2] != 1)
    return Support::No("needs no dilation");
  if (std::max(p.in[2] * p.C, p.out[2] * p.K) >= (int64_t(1) << 28))
    return Support::No("an image row of 2^28 or more elements");
  // The channel GEMMs pad Cg to 8+ and Kg to 64: one channel per group would be mostly padding
  // (and gigabytes of workspace at ImageNet sizes).
  if (p.Cg() == 1 && p.G > 1) return Support::No("depthwise: use depthwise");
  return Support::Yes();
}

// ---- tile loads and stores ------------------------------------------------------------------

// Reads the a x a input patches of one output tile of group `grp`, one channel at a time;
// elements outside the input (or of a tile past the end) read as zero. Offsets within a patch
// are 32-bit (support_3x3 bounds an image row).
template <int kM>
struct PatchReader {
  static constexpr int kA = kM + 2;
  int64_t base;                     // element offset of patch element (0, 0), channel 0 of the group
  int32_t row_stride, col_stride;   // W * Cin, Cin
  uint64_t inside;                  // bit i * kA + j: patch element (i, j) lies inside the input

  __device__ __forceinline__ PatchReader(const Geom& g, int64_t tile, int64_t grp) {
    const int64_t per_image = g.TP * g.TQ;
    const int64_t n = tile / per_image, tp = tile % per_image / g.TQ, tq = tile % g.TQ;
    const int64_t h0 = tp * kM - g.pad_h, w0 = tq * kM - g.pad_w;
    col_stride = int32_t(g.Cin());
    row_stride = int32_t(g.W * g.Cin());
    base = ((n * g.H + h0) * g.W + w0) * g.Cin() + grp * g.Cg;
    inside = 0;
    if (tile < g.tiles()) {
#pragma unroll
      for (int i = 0; i < kA; ++i)
#pragma unroll
        for (int j = 0; j < kA; ++j)
          inside |= uint64_t(h0 + i >= 0 && h0 + i < g.H && w0 + j >= 0 && w0 + j < g.W)
                    << (i * kA + j);
    }
  }

  // The patch of channel c (of the group); all zero unless `valid`.
  template <typename In>
  __device__ __forceinline__ void read(const In* __restrict__ in, int64_t c, bool valid,
                                       float (&d)[kA][kA]) const {
    const In* p = in + (base + c);  // dereferenced only inside the image
    const uint64_t m = valid ? inside : 0;
#pragma unroll
    for (int i = 0; i < kA; ++i)
#pragma unroll
      for (int j = 0; j < kA; ++j)
        d[i][j] = m >> (i * kA + j) & 1u ? cuda::to_acc(p[i * row_stride + j * col_stride]) : 0.f;
  }
};

// Writes the m x m output tile `tile` of output channel k of group grp, clipped to (P, Q).
template <int kM, typename Out>
__device__ __forceinline__ void write_tile(Out* __restrict__ out, const Geom& g, int64_t tile,
                                           int64_t grp, int64_t k, const float (&y)[kM][kM]) {
  if (tile >= g.tiles()) return;
  const int64_t per_image = g.TP * g.TQ;
  const int64_t n = tile / per_image, p0 = tile % per_image / g.TQ * kM, q0 = tile % g.TQ * kM;
#pragma unroll
  for (int i = 0; i < kM; ++i)
#pragma unroll
    for (int j = 0; j < kM; ++j)
      if (p0 + i < g.P && q0 + j < g.Q)
        out[((n * g.P + p0 + i) * g.Q + q0 + j) * g.Cout() + grp * g.Kg + k] =
            cuda::from_acc<Out>(y[i][j]);
}

// ---- filter transform -----------------------------------------------------------------------

// U[xi][grp][ci][co] = (G f G^T)[xi] for the (cgp, kgp)-padded channel block of each group,
// zero outside (Cg, Kg): f = w[.][.][ci][grp*Kg + co] for fwd, and for bwd_data (flip)
// f[r][s] = w[2-r][2-s][co][grp*Cg + ci]. Computed in double, stored as float. One thread per
// (grp, ci, co); co is fastest, so the stores coalesce.
template <int kM, typename In>
__global__ void filter_transform_kernel(Geom g, const In* __restrict__ w, float* __restrict__ u,
                                        int64_t cgp, int64_t kgp) {
  using L = typename Winograd<kM>::G;
  constexpr int kA = kM + 2;
  const int64_t total = g.G * cgp * kgp;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t co = e % kgp, ci = e / kgp % cgp, grp = e / (kgp * cgp);
    double f[3][3] = {};
    if (ci < g.Cg && co < g.Kg) {
#pragma unroll
      for (int r = 0; r < 3; ++r)
#pragma unroll
        for (int s = 0; s < 3; ++s)
          f[r][s] = cuda::to_acc(
              g.flip ? w[(((2 - r) * 3 + 2 - s) * g.Kg + co) * g.Cin() + grp * g.Cg + ci]
                     : w[((r * 3 + s) * g.Cg + ci) * g.Cout() + grp * g.Kg + co]);
    }
    double t[kA][kA];
    sandwich<L>(f, t);
#pragma unroll
    for (int xi = 0; xi < kA * kA; ++xi) u[xi * total + e] = float(t[xi / kA][xi % kA]);
  }
}

// Launches filter_transform_kernel over the (G, cgp, kgp) block into u.
template <int kM, typename In>
Status transform_filter(const Geom& g, const void* w, float* u, int64_t cgp, int64_t kgp,
                        cudaStream_t stream, const char* name) {
  constexpr int kThreads = 256;
  const int64_t total = g.G * cgp * kgp;
  if (total == 0) return Status::Ok();
  filter_transform_kernel<kM, In><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
      g, static_cast<const In*>(w), u, cgp, kgp);
  return cuda::check_launch(name);
}

}  // namespace jaxdnn::conv::winograd
