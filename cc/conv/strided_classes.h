// Strided bwd_data as stride-1 forward convolutions, one per residue class.
//
// With stride s along an axis (and no lhs dilation), input coordinate i = q*s + r receives
// dy from the taps f with (r + pad - f*dil) divisible by s only, at dy coordinate q + o(f),
// o(f) = (r + pad - f*dil) / s. Those taps depend on the residue r alone, so the input
// positions of one residue class (r0, r1, r2) form a dense (N, I0, I1, I2, C) tensor that is a
// plain stride-1 correlation of dy with the class's sub-filter:
//   taps    f_j = f_0 - j*(s/g) for j < n, where g = gcd(dil, s) and f_0 the largest
//           contributing tap, so that o(f_j) = o_0 + j*(dil/g) grows with j;
//   sub     in = dy's size, out = I = ceil((in_dx - r) / s), filter n taps, stride 1,
//           rhs dilation dil/g, pad_lo = -o_0 (and the pad_hi that makes the sizes agree);
//   filter  w'[j0][j1][j2][k][g*Cg + c] = w[f_j0][f_j1][f_j2][c][g*Kg + k] (channels swap
//           roles: the sub-convolution reads Kg channels per group and writes Cg).
// A 3x3 stride-2 layer then multiplies 9 taps in total over its four classes instead of 9 per
// input position (most of which fall between dy rows and multiply zeros).
#pragma once

#include <cstdint>
#include <numeric>

#include "cc/conv/conv.h"

namespace jaxdnn::conv {

constexpr int kMaxStridedClasses = 64;  // s0 * s1 * s2 at most (a larger stride keeps the
                                        // general path)

// One axis of one residue class.
struct AxisClass {
  int64_t size = 0;      // input positions q*s + r in [0, in_dx): ceil((in_dx - r) / s)
  int64_t taps = 0;      // contributing filter taps
  int64_t first = 0;     // f_0, the largest of them
  int64_t step = 1;      // f_j = first - j*step
  int64_t offset = 0;    // o_0 = (r + pad - first*dil) / s
  int64_t sub_dil = 1;   // o(f_j) - o(f_{j-1})
};

inline AxisClass axis_class(const Problem& p, int a, int64_t r) {
  AxisClass c;
  const int64_t s = p.stride[a], d = p.rhs_dil[a], pad = p.pad_lo[a];
  c.size = p.in[a] > r ? (p.in[a] - r + s - 1) / s : 0;
  const int64_t g = std::gcd(d, s);
  c.step = s / g;
  c.sub_dil = d / g;
  for (int64_t f = p.filt[a] - 1; f >= 0; --f) {
    if ((r + pad - f * d) % s != 0) continue;
    c.first = f;
    c.taps = f / c.step + 1;
    c.offset = (r + pad - f * d) / s;  // exact: the remainder is 0
    break;
  }
  return c;
}

// The residues (r0, r1, r2) of class number ci = (r0 * s1 + r1) * s2 + r2.
inline void class_residues(const Problem& p, int64_t ci, int64_t (&r)[3]) {
  r[0] = ci / (p.stride[2] * p.stride[1]);
  r[1] = ci / p.stride[2] % p.stride[1];
  r[2] = ci % p.stride[2];
}

// A residue class: its three axes and the stride-1 forward problem that computes it (dy as
// the input, the sub-filter, the class's dx positions as the output).
struct StridedClass {
  AxisClass axis[3];
  Problem sub;
  bool empty() const {  // no position, or positions no tap reaches (their dx is zero)
    return sub.N == 0 || sub.out[0] * sub.out[1] * sub.out[2] == 0 || sub.filt_spatial() == 0;
  }
};

inline int64_t strided_class_count(const Problem& p) {
  return p.stride[0] * p.stride[1] * p.stride[2];
}

// Whether bwd_data of p can run as residue classes: some stride above 1, no lhs dilation (the
// bwd_data of a transposed convolution), and few enough classes.
inline bool strided_classes_apply(const Problem& p) {
  bool strided = false;
  for (int a = 0; a < 3; ++a) {
    if (p.lhs_dil[a] != 1) return false;
    strided = strided || p.stride[a] > 1;
  }
  return strided && strided_class_count(p) <= kMaxStridedClasses;
}

// Class number ci = (r0 * s1 + r1) * s2 + r2.
inline StridedClass strided_class(const Problem& p, int64_t ci) {
  int64_t r[3];
  class_residues(p, ci, r);
  StridedClass c;
  Problem& q = c.sub;
  q.N = p.N;
  q.G = p.G;
  q.C = p.K;  // the sub-convolution reads dy
  q.K = p.C;  // and writes dx
  for (int a = 0; a < 3; ++a) {
    const AxisClass ax = axis_class(p, a, r[a]);
    c.axis[a] = ax;
    q.in[a] = p.out[a];
    q.out[a] = ax.taps == 0 ? 0 : ax.size;
    q.filt[a] = ax.taps;
    q.stride[a] = 1;
    q.lhs_dil[a] = 1;
    q.rhs_dil[a] = ax.sub_dil;
    q.pad_lo[a] = -ax.offset;
    // out_size(in, n, 1, lo, hi, 1, dil) == out when hi = out - 1 + (n-1)*dil + 1 - in - lo.
    q.pad_hi[a] = ax.taps == 0 ? 0 : ax.size + (ax.taps - 1) * ax.sub_dil - p.out[a] - q.pad_lo[a];
  }
  return c;
}

// Kernel parameters: every class's sub-filter taps (what sub_filter_source reads of its
// axes, compact enough for 64 classes) and where its sub-filter starts in the concatenated
// ones; every class's sizes and result offset (-1: the class's dx is zero).
struct FilterAxis {
  int32_t first, step, taps;
};
struct SubFilters {
  int64_t start[kMaxStridedClasses + 1];  // class ci: elements [start[ci], start[ci + 1])
  FilterAxis axis[kMaxStridedClasses][3];
  int count;
};
struct ClassMap {
  int64_t base[kMaxStridedClasses];
  int64_t sizes[kMaxStridedClasses][3];
};

// Element e of class c's sub-filter (layout (n0, n1, n2, Kg, C) = w' above): its offset in w.
// I: the index type, as in class_pixel; Axis: AxisClass or FilterAxis.
template <typename I = int64_t, typename Axis = AxisClass>
JAXDNN_HD I sub_filter_source(const Problem& p, const Axis (&ax)[3], I e) {
  const I C = I(p.C), Cg = I(p.Cg()), Kg = I(p.Kg()), K = I(p.K);
  const I t1 = I(ax[1].taps), t2 = I(ax[2].taps);
  const I gc = e % C, k = e / C % Kg, j = e / C / Kg;
  const I g = gc / Cg, c = gc % Cg;
  const I j2 = j % t2, j1 = j / t2 % t1, j0 = j / t2 / t1;
  const I f0 = I(ax[0].first) - j0 * I(ax[0].step), f1 = I(ax[1].first) - j1 * I(ax[1].step),
          f2 = I(ax[2].first) - j2 * I(ax[2].step);
  return (((f0 * I(p.filt[1]) + f1) * I(p.filt[2]) + f2) * Cg + c) * K + g * Kg + k;
}

// Where dx pixel `pix` (of N*D*H*W, row-major) comes from: the class and the pixel's index in
// that class's dense result (N, I0, I1, I2); the element's offset there is that index times C
// plus its channel. I: the index type (int32_t on the GPU when the sizes allow it: integer
// division is the scatter's cost).
struct ClassPixel {
  int64_t ci, index;
};

template <typename I = int64_t>
JAXDNN_HD ClassPixel class_pixel(const Problem& p, const int64_t (&sizes)[kMaxStridedClasses][3],
                                 I pix) {
  const I W = I(p.in[2]), H = I(p.in[1]), D = I(p.in[0]);
  const I s0 = I(p.stride[0]), s1 = I(p.stride[1]), s2 = I(p.stride[2]);
  const I w = pix % W, h = pix / W % H, dn = pix / W / H, d = dn % D, n = dn / D;
  const I ci = ((d % s0) * s1 + h % s1) * s2 + w % s2;
  const I I0 = I(sizes[ci][0]), I1 = I(sizes[ci][1]), I2 = I(sizes[ci][2]);
  return {ci, ((n * I0 + d / s0) * I1 + h / s1) * I2 + w / s2};
}

}  // namespace jaxdnn::conv
