// Host check of cc/conv/gather_geo.h: on random problems (strides, paddings, both dilations,
// 1 to 3 spatial axes), the pixel that every GEMM row gathers through every tap, from
// gathered_pixel and from for_each_tap, against conv.h's in_idx / out_idx in 64-bit
// arithmetic. Build and run:
//   g++ -std=c++17 -O2 -I. tests/native/check_gather_geo.cc -o /tmp/cgg && /tmp/cgg
#include <cstdio>
#include <random>

#include "cc/conv/gather_geo.h"

using namespace jaxdnn::conv;
using gemm::Geo;

// The pixel of the gathered tensor that row m reads through tap (t, r, s), or -1: fwd rows are
// output pixels reading x; bwd_data rows are input pixels reading dy.
template <Direction kDir>
int64_t expected(const Problem& p, int64_t m, int64_t t, int64_t r, int64_t s) {
  constexpr bool kFwd = kDir != Direction::kBwdData;
  const int64_t* rows = kFwd ? p.out : p.in;
  const int64_t* dims = kFwd ? p.in : p.out;
  const int64_t i2 = m % rows[2], i1 = m / rows[2] % rows[1], i0 = m / (rows[2] * rows[1]) % rows[0];
  const int64_t n = m / (rows[2] * rows[1] * rows[0]);
  const int64_t f[3] = {t, r, s}, i[3] = {i0, i1, i2};
  int64_t a[3];
  for (int ax = 0; ax < 3; ++ax) {
    a[ax] = kFwd ? in_idx(p, ax, i[ax], f[ax]) : out_idx(p, ax, i[ax], f[ax]);
    if (a[ax] < 0) return -1;
  }
  return ((n * dims[0] + a[0]) * dims[1] + a[1]) * dims[2] + a[2];
}

template <Direction kDir>
int check(const Problem& p) {
  const Geo g = gemm::make_geo(p);
  const int64_t rows = p.N * (kDir == Direction::kBwdData ? p.in_spatial() : p.out_spatial());
  int bad = 0;
  for (int64_t m = 0; m < rows; ++m) {
    int next = 0;
    gemm::for_each_tap<kDir>(g, m, [&](int tap, int64_t pix) {
      const int64_t s = tap % p.filt[2], r = tap / p.filt[2] % p.filt[1],
                    t = tap / (p.filt[2] * p.filt[1]);
      const int64_t want = expected<kDir>(p, m, t, r, s);
      bad += tap != next++ || pix != want || gemm::gathered_pixel<kDir>(g, m, tap) != want;
    });
    bad += next != g.taps();
  }
  return bad;
}

int main() {
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return int64_t(std::uniform_int_distribution<int>(lo, hi)(rng)); };
  int checked = 0, bad = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Problem p;
    p.N = pick(1, 2);
    p.C = p.K = 8;
    const int axes = int(pick(1, 3));
    for (int a = 3 - axes; a < 3; ++a) {
      p.in[a] = pick(1, 9);
      p.filt[a] = pick(1, 4);
      p.stride[a] = pick(1, 3);
      p.pad_lo[a] = pick(0, 3);
      p.pad_hi[a] = pick(0, 3);
      p.lhs_dil[a] = pick(1, 2);
      p.rhs_dil[a] = pick(1, 2);
      p.out[a] = out_size(p.in[a], p.filt[a], p.stride[a], p.pad_lo[a], p.pad_hi[a],
                          p.lhs_dil[a], p.rhs_dil[a]);
    }
    if (p.out_spatial() == 0) continue;
    bad += check<Direction::kFwd>(p) + check<Direction::kBwdData>(p);
    ++checked;
  }
  if (bad != 0) {
    std::printf("MISMATCH: %d (row, tap) pairs\n", bad);
    return 1;
  }
  std::printf("ok: %d problems\n", checked);
  return 0;
}
