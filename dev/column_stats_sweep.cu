// The column path's statistics kernel alone over slices of different lengths (blocks ~ k x 132,
// k the blocks per SM), against the flat read roofline of the same bytes, on the benchmark's
// group_norm NHWC 32x56x56x256 and batch_norm NHWC 64x112x112x64, float32 and bfloat16. CUDA
// events, one launch per sample over 3 rotating copies of x (medians of 20; ~3 us above the
// kernel trace). A variant of cuda_column.cu (another kLoadsInFlight, stats_blocks_per_sm, row
// order) builds with -DCOLUMN_SRC='"path/to/variant.cu"'; benchmarks/NOTES.md, session 31.
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -I. -arch=sm_90 -o /tmp/css \
//     dev/column_stats_sweep.cu && /tmp/css
#include <cstdio>
#include <random>
#include <vector>
#ifndef COLUMN_SRC
#define COLUMN_SRC "cc/norm/cuda_column.cu"
#endif
#include COLUMN_SRC
#include "dev/event_timing.cuh"

using namespace jaxdnn::norm;
using namespace jaxdnn::norm::cuda_impl;

template <typename D>
void sweep(const char* name, Shape s) {
  const int64_t n = s.elems();
  const size_t bytes = size_t(n) * sizeof(D);
  std::vector<D> h(static_cast<size_t>(n));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.5f, 2.f);
  for (auto& v : h) v = D(normal(rng));
  D* x[3];
  for (auto& p : x) {
    CK_(cudaMalloc(&p, bytes));
    CK_(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
  }
  double *ws0, *ws1;  // partials: at most P * slices * CK doubles each (< 64 MB here)
  CK_(cudaMalloc(&ws0, 64 << 20));
  CK_(cudaMalloc(&ws1, 64 << 20));
  unsigned* sink;
  CK_(cudaMalloc(&sink, 4));
  int it = 0;
  const int64_t packs = int64_t(bytes / 16);
  const float t_read = median_us([&] {
    read_kernel<<<unsigned((packs + 255) / 256), 256>>>(
        reinterpret_cast<const uint4*>(x[it++ % 3]), packs, sink);
  });
  const double mb = double(bytes) / 1e6;  // MB / us = TB/s
  std::printf("%s %s, %.1f MB: flat read %.1f us (%.2f TB/s); library slices of %lld rows\n",
              name, sizeof(D) == 4 ? "float32" : "bfloat16", mb, t_read, mb / t_read,
              static_cast<long long>(column_stats_rows(s, Vec<D>::kN)));
  constexpr int N = Vec<D>::kN;
  const int64_t tiles = column_grid(s, N, kThreads, 1).tiles;
  for (int k : {2, 3, 4, 6, 8, 12}) {
    const int64_t per_p = k * int64_t(jaxdnn::cuda::sm_count()) / (s.P * tiles);
    if (per_p == 0) continue;
    const ColumnGrid g = column_grid(s, N, kThreads, (s.A + per_p - 1) / per_p);
    Fwd<D> f{s, true, true, A<D>(1e-5), x[0], nullptr, nullptr, nullptr,
             nullptr, nullptr, ws0, ws1, nullptr};
    const float t = median_us([&] {
      f.x = x[it++ % 3];
      column_stats_kernel<D, N><<<unsigned(g.blocks), kThreads>>>(f, g);
    });
    std::printf("  k=%2d: %6lld rows a slice, %5lld blocks  %6.1f us  %.2f TB/s\n", k,
                static_cast<long long>(g.rps), static_cast<long long>(g.blocks), t, mb / t);
  }
  for (auto& p : x) CK_(cudaFree(p));
  CK_(cudaFree(ws0));
  CK_(cudaFree(ws1));
  CK_(cudaFree(sink));
}

int main() {
  const Shape gn{32, 3136, 32, 8, 1, 1}, bn{1, 802816, 64, 1, 1, 1};
  sweep<float>("group_norm NHWC 32x56x56x256", gn);
  sweep<float>("batch_norm NHWC 64x112x112x64", bn);
  sweep<__nv_bfloat16>("group_norm NHWC 32x56x56x256", gn);
  sweep<__nv_bfloat16>("batch_norm NHWC 64x112x112x64", bn);
}
