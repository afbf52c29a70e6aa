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

// A residue class: its three axes and the stride-1 forward problem that computes it (dy as
// the input, the sub-filter, the class's dx positions as the output).
struct StridedClass {
  int64_t r[3];
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
  StridedClass c;
  c.r[2] = ci % p.stride[2];
  c.r[1] = ci / p.stride[2] % p.stride[1];
  c.r[0] = ci / (p.stride[2] * p.stride[1]);
  Problem& q = c.sub;
  q.N = p.N;
  q.G = p.G;
  q.C = p.K;  // the sub-convolution reads dy
  q.K = p.C;  // and writes dx
  for (int a = 0; a < 3; ++a) {
    const AxisClass ax = axis_class(p, a, c.r[a]);
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

// Kernel parameters: one class's axes, and every class's sizes and result offset (-1: the
// class's dx is zero).
struct ClassTaps {
  AxisClass axis[3];
};
struct ClassMap {
  int64_t base[kMaxStridedClasses];
  int64_t sizes[kMaxStridedClasses][3];
};

// Element e of class c's sub-filter (layout (n0, n1, n2, Kg, C) = w' above): its offset in w.
JAXDNN_HD int64_t sub_filter_source(const Problem& p, const AxisClass (&ax)[3], int64_t e) {
  const int64_t C = p.C, Cg = p.Cg(), Kg = p.Kg(), K = p.K;
  const int64_t gc = e % C, k = e / C % Kg, j = e / (C * Kg);
  const int64_t g = gc / Cg, c = gc % Cg;
  const int64_t j2 = j % ax[2].taps, j1 = j / ax[2].taps % ax[1].taps, j0 = j / (ax[2].taps * ax[1].taps);
  const int64_t f0 = ax[0].first - j0 * ax[0].step, f1 = ax[1].first - j1 * ax[1].step,
                f2 = ax[2].first - j2 * ax[2].step;
  return (((f0 * p.filt[1] + f1) * p.filt[2] + f2) * Cg + c) * K + g * Kg + k;
}

// Where dx element e (layout (N, D, H, W, C)) comes from: the class and the element's offset
// in that class's dense result (N, I0, I1, I2, C).
struct ClassElement {
  int64_t ci, offset;
};

JAXDNN_HD ClassElement class_element(const Problem& p, const int64_t (&sizes)[kMaxStridedClasses][3],
                                     int64_t e) {
  const int64_t C = p.C, c = e % C, pix = e / C;
  const int64_t w = pix % p.in[2], h = pix / p.in[2] % p.in[1],
                d = pix / (p.in[2] * p.in[1]) % p.in[0], n = pix / (p.in[2] * p.in[1] * p.in[0]);
  const int64_t ci = ((d % p.stride[0]) * p.stride[1] + h % p.stride[1]) * p.stride[2] +
                     w % p.stride[2];
  const int64_t* I = sizes[ci];
  const int64_t qd = d / p.stride[0], qh = h / p.stride[1], qw = w / p.stride[2];
  return {ci, (((n * I[0] + qd) * I[1] + qh) * I[2] + qw) * C + c};
}

}  // namespace jaxdnn::conv
