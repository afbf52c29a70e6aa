// Shared by the dev tools' CUDA drivers (norm_fwd_bench.cu, copy_probe.cu, stats_probe.cu): CK_
// exits on a CUDA error with its place; median_us times f with CUDA events (median of 20 runs
// after 3 warm-ups, pre() before each, untimed) and checks that its launches started;
// read_kernel is the flat read roofline (one 16-byte pack per thread).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK_(x)                                                               \
  do {                                                                       \
    cudaError_t e_ = (x);                                                    \
    if (e_ != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

template <typename F, typename Pre>
float median_us(F f, Pre pre) {
  cudaEvent_t a, b;
  CK_(cudaEventCreate(&a));
  CK_(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) pre(), f();
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) {
    pre();
    CK_(cudaEventRecord(a));
    f();
    CK_(cudaEventRecord(b));
    CK_(cudaEventSynchronize(b));
    float ms;
    CK_(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3f);
  }
  CK_(cudaGetLastError());  // a launch that failed to start
  CK_(cudaEventDestroy(a));
  CK_(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[10];
}
template <typename F>
float median_us(F f) {
  return median_us(f, [] {});
}

// Reads n 16-byte packs, one per thread; writes *sink only if their words' xor is a constant
// (never, in practice), so that the loads are not optimised away.
__global__ void read_kernel(const uint4* x, int64_t n, unsigned* sink) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) {
    const uint4 v = x[i];
    if ((v.x ^ v.y ^ v.z ^ v.w) == 0x12345678u) *sink = 1;
  }
}
