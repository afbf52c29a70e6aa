// One-thread timing of the CPU batch norm forwards (NHWC 8x56x56x64 float32, the CPU benchmark's
// shape) against a plain loop y = x*g + h, interleaved run by run so that the shared host's
// drift hits both alike; min and median of 301 runs. Build against the in-place build's kernel
// library, optionally with another revision's object of one kernel file ahead of it (LIB is
// build/inplace/cc/libjaxdnn_cpu_kernels.a):
//   g++ -O3 -std=c++17 -mavx2 -mfma -I. dev/cpu_norm_bench.cc [old_column.o] $LIB -lpthread
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cc/norm/cpu_norm.h"

using namespace jaxdnn;
using namespace jaxdnn::norm;

namespace {

double us_since(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
}

// Times each function of fs once per round, `rounds` rounds; returns the sorted times per function.
template <typename... Fs>
std::vector<std::vector<double>> interleaved(int rounds, Fs... fs) {
  std::vector<std::vector<double>> t(sizeof...(Fs));
  for (int r = 0; r < rounds; ++r) {
    size_t k = 0;
    ((void)[&] {
      const auto a = std::chrono::steady_clock::now();
      fs();
      t[k++].push_back(us_since(a));
    }(), ...);
  }
  for (auto& v : t) std::sort(v.begin(), v.end());
  return t;
}

}  // namespace

int main() {
  const int64_t rows = 8 * 56 * 56, C = 64, n = rows * C;
  std::vector<float> x(n), y(n), scale(C), bias(C), mean(C), var(C), m2(C), v2(C), g(C), h(C);
  for (int64_t i = 0; i < n; ++i) x[i] = std::sin(i * 0.001f) * 2 + 0.5f;
  for (int c = 0; c < C; ++c)
    scale[c] = 1 + c * 0.01f, bias[c] = c * 0.1f, mean[c] = 0.1f * c, var[c] = 1 + 0.05f * c;
  Problem p;
  p.s.A = rows;
  p.s.C = C;
  FwdBuffers b;
  b.x = x.data(), b.scale = scale.data(), b.bias = bias.data(), b.y = y.data();
  b.mean = mean.data(), b.var = var.data();
  std::vector<char> ws(size_t(fwd_workspace_bytes(p.s)));
  FwdBuffers bt = b;
  bt.mean = m2.data(), bt.var = v2.data(), bt.ws = ws.data();
  const SerialParallel one;
  auto plain = [&] {
    for (int c = 0; c < C; ++c) {
      g[c] = scale[c] / std::sqrt(var[c] + 1e-5f);
      h[c] = bias[c] - mean[c] * g[c];
    }
    for (int64_t a = 0; a < rows; ++a)
      for (int c = 0; c < C; ++c) y[a * C + c] = x[a * C + c] * g[c] + h[c];
  };
  const auto t = interleaved(
      301, [&] { (void)cpu_inference(p, b, one); }, plain, [&] { (void)cpu_forward(p, bt, one); });
  const double mb = 2.0 * n * 4 / 1e6;
  const char* names[3] = {"inference", "plain loop", "training"};
  for (int k = 0; k < 3; ++k)
    std::printf("%-11s min %6.0f us  median %6.0f us  (%.1f GB/s at the median, read + write)\n",
                names[k], t[k][0], t[k][t[k].size() / 2], mb / t[k][t[k].size() / 2] * 1e3);
  std::printf("inference / plain loop at the median: %.2f\n", t[0][150] / t[1][150]);
}
