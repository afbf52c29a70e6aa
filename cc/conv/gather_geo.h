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

// The pixel that GEMM row m reads through tap `tap`, as an index into the gathered tensor's
// pixels (x's for kFwd and kBwdFilter, dy's for kBwdData), or -1 on padding. Row m is an output
// pixel for kFwd / kBwdFilter and an input pixel for kBwdData.
template <Direction kDir>
JAXDNN_HD int64_t gathered_pixel(const Geo& g, int64_t m, int tap) {
  constexpr bool kFromOut = kDir != Direction::kBwdData;
  const int* rows = kFromOut ? g.out : g.in;
  const int* dims = kFromOut ? g.in : g.out;
  const int s = tap % g.filt[2], r = tap / g.filt[2] % g.filt[1], t = tap / (g.filt[2] * g.filt[1]);
  const int w = int(m % rows[2]), h = int(m / rows[2] % rows[1]), d = int(m / (rows[2] * rows[1]) % rows[0]);
  const int64_t n = m / (int64_t(rows[2]) * rows[1] * rows[0]);
  const int a0 = kFromOut ? fwd_coord(g, 0, d, t) : bwd_coord(g, 0, d, t);
  const int a1 = kFromOut ? fwd_coord(g, 1, h, r) : bwd_coord(g, 1, h, r);
  const int a2 = kFromOut ? fwd_coord(g, 2, w, s) : bwd_coord(g, 2, w, s);
  if ((a0 | a1 | a2) < 0) return -1;
  return ((n * dims[0] + a0) * dims[1] + a1) * dims[2] + a2;
}

// Calls fn(tap, pixel) for every tap of GEMM row m in tap order, the pixel as gathered_pixel
// gives it (-1 on padding). The row is decoded once and each axis's coordinate once per tap
// of that axis, in 32-bit arithmetic: kernels that walk every tap of a row through
// gathered_pixel spent ~300 instructions per tap on 64-bit divisions.
template <Direction kDir, typename Fn>
JAXDNN_HD void for_each_tap(const Geo& g, int64_t m, Fn&& fn) {
  constexpr bool kFromOut = kDir != Direction::kBwdData;
  const int* rows = kFromOut ? g.out : g.in;
  const int* dims = kFromOut ? g.in : g.out;
  auto coord = [&](int a, int i, int f) {
    return kFromOut ? fwd_coord(g, a, i, f) : bwd_coord(g, a, i, f);
  };
  const int w = int(m % rows[2]), h = int(m / rows[2] % rows[1]);
  const int64_t nd = m / (int64_t(rows[2]) * rows[1]);
  const int d = int(nd % rows[0]);
  const int64_t n = nd / rows[0];
  int tap = 0;
  for (int t = 0; t < g.filt[0]; ++t) {
    const int a0 = coord(0, d, t);
    for (int r = 0; r < g.filt[1]; ++r) {
      const int a1 = a0 < 0 ? -1 : coord(1, h, r);
      const int64_t p01 = (n * dims[0] + a0) * dims[1] + a1;
      for (int s = 0; s < g.filt[2]; ++s, ++tap) {
        const int a2 = a1 < 0 ? -1 : coord(2, w, s);
        fn(tap, a2 < 0 ? int64_t(-1) : p01 * dims[2] + a2);
      }
    }
  }
}

}  // namespace jaxdnn::conv::gemm
