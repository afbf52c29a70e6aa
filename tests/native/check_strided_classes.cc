// Host check of cc/conv/strided_classes.h: on random problems, strided bwd_data computed as
// residue classes (sub-problems, sub-filters and the dx scatter exactly as the CUDA path uses
// them, each class run through a naive stride-1 forward convolution) against a naive
// bwd_data (the adjoint of the naive forward). Build and run:
//   g++ -std=c++17 -O2 -I. tests/native/check_strided_classes.cc -o /tmp/csc && /tmp/csc
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cc/conv/strided_classes.h"

using namespace jaxdnn::conv;

// Calls fn(y offset, x offset, w offset) for every multiply-add of the convolution p: output
// pixel, tap (through in_idx, skipping padding), group, input and output channel.
template <typename Fn>
void for_each_mac(const Problem& p, Fn&& fn) {
  const int64_t Cg = p.Cg(), Kg = p.Kg();
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t z = 0; z < p.out[0]; ++z)
      for (int64_t o1 = 0; o1 < p.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < p.out[2]; ++o2)
          for (int64_t t = 0; t < p.filt[0]; ++t)
            for (int64_t r = 0; r < p.filt[1]; ++r)
              for (int64_t u = 0; u < p.filt[2]; ++u) {
                const int64_t d = in_idx(p, 0, z, t), h = in_idx(p, 1, o1, r),
                              x = in_idx(p, 2, o2, u);
                if (d < 0 || h < 0 || x < 0) continue;
                const int64_t yo = (((n * p.out[0] + z) * p.out[1] + o1) * p.out[2] + o2) * p.K;
                const int64_t xo = (((n * p.in[0] + d) * p.in[1] + h) * p.in[2] + x) * p.C;
                const int64_t wo = ((t * p.filt[1] + r) * p.filt[2] + u) * Cg * p.K;
                for (int64_t g = 0; g < p.G; ++g)
                  for (int64_t c = 0; c < Cg; ++c)
                    for (int64_t k = 0; k < Kg; ++k)
                      fn(yo + g * Kg + k, xo + g * Cg + c, wo + c * p.K + g * Kg + k);
              }
}

// y of a forward problem (N, Z, P, Q, K) from x (N, D, H, W, C) and w (T, R, S, Cg, K).
std::vector<double> naive_fwd(const Problem& q, const std::vector<double>& x,
                              const std::vector<double>& w) {
  std::vector<double> y(size_t(q.y_elems()), 0.0);
  for_each_mac(q, [&](int64_t yo, int64_t xo, int64_t wo) {
    y[size_t(yo)] += x[size_t(xo)] * w[size_t(wo)];
  });
  return y;
}

// dx of p as the adjoint of its forward: every multiply-add sends dy * w back to the x
// element it read (the class path never walks p's taps this way).
std::vector<double> naive_bwd_data(const Problem& p, const std::vector<double>& dy,
                                   const std::vector<double>& w) {
  std::vector<double> dx(size_t(p.x_elems()), 0.0);
  for_each_mac(p, [&](int64_t yo, int64_t xo, int64_t wo) {
    dx[size_t(xo)] += dy[size_t(yo)] * w[size_t(wo)];
  });
  return dx;
}

int main() {
  std::mt19937_64 rng(7);
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::normal_distribution<double> normal;
  int checked = 0, classes = 0, empty = 0;
  for (int trial = 0; checked < 400 && trial < 20000; ++trial) {
    Problem p;
    p.N = uni(1, 2);
    p.G = uni(1, 2);
    p.C = p.G * uni(1, 3);
    p.K = p.G * uni(1, 3);
    bool strided = false;
    for (int a = 0; a < 3; ++a) {
      const bool live = a > 0 || uni(0, 3) == 0;  // mostly 2-D
      p.filt[a] = live ? uni(1, 5) : 1;
      p.stride[a] = live ? uni(1, 4) : 1;
      p.rhs_dil[a] = live ? uni(1, 3) : 1;
      p.pad_lo[a] = live ? uni(0, 4) : 0;
      p.pad_hi[a] = live ? uni(0, 4) : 0;
      p.in[a] = live ? uni(1, 11) : 1;
      p.out[a] = out_size(p.in[a], p.filt[a], p.stride[a], p.pad_lo[a], p.pad_hi[a], 1,
                          p.rhs_dil[a]);
      strided = strided || p.stride[a] > 1;
    }
    if (!strided || !validate(p).ok() || p.out_spatial() == 0 || !strided_classes_apply(p))
      continue;
    std::vector<double> dy(size_t(p.y_elems())), w(size_t(p.w_elems()));
    for (double& v : dy) v = normal(rng);
    for (double& v : w) v = normal(rng);
    const std::vector<double> want = naive_bwd_data(p, dy, w);

    // The class path: results per class, then the scatter of class_pixel.
    const int64_t nc = strided_class_count(p);
    std::vector<std::vector<double>> results(static_cast<size_t>(nc));
    int64_t sizes[kMaxStridedClasses][3] = {};
    for (int64_t ci = 0; ci < nc; ++ci) {
      const StridedClass sc = strided_class(p, ci);
      for (int a = 0; a < 3; ++a) sizes[ci][a] = sc.axis[a].size;
      ++classes;
      if (sc.empty()) {
        ++empty;
        continue;
      }
      if (!validate(sc.sub).ok()) {
        std::printf("invalid sub-problem: %s\n", validate(sc.sub).message.c_str());
        return 1;
      }
      std::vector<double> wsub(size_t(sc.sub.w_elems()));
      for (int64_t e = 0; e < sc.sub.w_elems(); ++e)
        wsub[size_t(e)] = w[size_t(sub_filter_source(p, sc.axis, e))];
      results[size_t(ci)] = naive_fwd(sc.sub, dy, wsub);
    }
    double err = 0, ref = 0;
    for (int64_t e = 0; e < p.x_elems(); ++e) {
      const ClassPixel cp = class_pixel(p, sizes, e / p.C);
      const std::vector<double>& r = results[size_t(cp.ci)];
      const double got = r.empty() ? 0.0 : r[size_t(cp.index * p.C + e % p.C)];
      err = std::max(err, std::fabs(got - want[size_t(e)]));
      ref = std::max(ref, std::fabs(want[size_t(e)]));
    }
    if (err > 1e-9 * (1 + ref)) {
      std::printf("MISMATCH trial %d: err %g (ref %g)\n", trial, err, ref);
      return 1;
    }
    ++checked;
  }
  std::printf("ok: %d problems, %d classes (%d empty)\n", checked, classes, empty);
  return 0;
}
