// The gathers' geometry, shared by the CUDA kernels and host checks (dev/check_gather_geo.cc):
// the problem in int32, the input/output coordinate of one axis through one tap, and the pixel
// a GEMM row gathers through a tap (gathered_pixel for one tap, for_each_tap for all of them).
#pragma once

#include <cstdint>

#include "cc/conv/conv.h"

namespace jaxdnn::conv::gemm {

// The problem in int32 (the algorithms' supports() require every size to fit).
struct Geo {
  int in[3], filt[3], out[3], stride[3], pad[3], ldil[3], rdil[3];
  int C, K, Cg, Kg;
  JAXDNN_HD int taps() const { return filt[0] * filt[1] * filt[2]; }
};

inline Geo make_geo(const Problem& p) {
  Geo g;
  for (int a = 0; a < 3; ++a) {
    g.in[a] = int(p.in[a]); g.filt[a] = int(p.filt[a]); g.out[a] = int(p.out[a]);
    g.stride[a] = int(p.stride[a]); g.pad[a] = int(p.pad_lo[a]);
    g.ldil[a] = int(p.lhs_dil[a]); g.rdil[a] = int(p.rhs_dil[a]);
  }
  g.C = int(p.C); g.K = int(p.K); g.Cg = int(p.Cg()); g.Kg = int(p.Kg());
  return g;
}

// Input index along axis a that output o reads through tap f, or -1 (conv.h in_idx).
JAXDNN_HD int fwd_coord(const Geo& g, int a, int o, int f) {
  int u = o * g.stride[a] - g.pad[a] + f * g.rdil[a];
  if (g.ldil[a] == 1) return unsigned(u) < unsigned(g.in[a]) ? u : -1;
  if (u < 0 || u % g.ldil[a] != 0) return -1;
  u /= g.ldil[a];
  return u < g.in[a] ? u : -1;
}

// Output index along axis a that reads input i through tap f, or -1 (conv.h out_idx).
JAXDNN_HD int bwd_coord(const Geo& g, int a, int i, int f) {
  int num = i * g.ldil[a] + g.pad[a] - f * g.rdil[a];
  if (g.stride[a] == 1) return unsigned(num) < unsigned(g.out[a]) ? num : -1;
  if (num < 0 || num % g.stride[a] != 0) return -1;
  num /= g.stride[a];
  return num < g.out[a] ? num : -1;
}

// Row m of a gather: an output pixel for kFwd / kBwdFilter (reading x), an input pixel for
// kBwdData (reading dy), decoded once, in 32-bit arithmetic below the image index.
template <Direction kDir>
struct GatherRow {
  static constexpr bool kFromOut = kDir != Direction::kBwdData;
  const Geo& g;
  const int* dims;  // the gathered tensor's spatial dims
  int64_t n;
  int d, h, w;
  JAXDNN_HD GatherRow(const Geo& geo, int64_t m) : g(geo), dims(kFromOut ? geo.in : geo.out) {
    const int* rows = kFromOut ? geo.out : geo.in;
    w = int(m % rows[2]);
    h = int(m / rows[2] % rows[1]);
    const int64_t nd = m / (int64_t(rows[2]) * rows[1]);
    d = int(nd % rows[0]);
    n = nd / rows[0];
  }
  // The gathered tensor's coordinate along axis a through filter index f, or -1.
  JAXDNN_HD int coord(int a, int f) const {
    const int i = a == 0 ? d : (a == 1 ? h : w);
    return kFromOut ? fwd_coord(g, a, i, f) : bwd_coord(g, a, i, f);
  }
};

// The pixel that GEMM row m reads through tap `tap`, as an index into the gathered tensor's
// pixels, or -1 on padding.
template <Direction kDir>
JAXDNN_HD int64_t gathered_pixel(const Geo& g, int64_t m, int tap) {
  const GatherRow<kDir> row(g, m);
  const int s = tap % g.filt[2], r = tap / g.filt[2] % g.filt[1], t = tap / (g.filt[2] * g.filt[1]);
  const int a0 = row.coord(0, t), a1 = row.coord(1, r), a2 = row.coord(2, s);
  if ((a0 | a1 | a2) < 0) return -1;
  return ((row.n * row.dims[0] + a0) * row.dims[1] + a1) * row.dims[2] + a2;
}

// Calls fn(tap, pixel) for every tap of GEMM row m in tap order, the pixel as gathered_pixel
// gives it (-1 on padding). The row is decoded once and each axis's coordinate once per tap
// of that axis: kernels that walk every tap of a row through gathered_pixel spent ~300
// instructions per tap on divisions.
template <Direction kDir, typename Fn>
JAXDNN_HD void for_each_tap(const Geo& g, int64_t m, Fn&& fn) {
  const GatherRow<kDir> row(g, m);
  int tap = 0;
  for (int t = 0; t < g.filt[0]; ++t) {
    const int a0 = row.coord(0, t);
    for (int r = 0; r < g.filt[1]; ++r) {
      const int a1 = a0 < 0 ? -1 : row.coord(1, r);
      const int64_t p01 = (row.n * row.dims[0] + a0) * row.dims[1] + a1;
      for (int s = 0; s < g.filt[2]; ++s, ++tap) {
        const int a2 = a1 < 0 ? -1 : row.coord(2, s);
        fn(tap, a2 < 0 ? int64_t(-1) : p01 * row.dims[2] + a2);
      }
    }
  }
}

}  // namespace jaxdnn::conv::gemm
