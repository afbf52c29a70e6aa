// Which launch shape lets an elementwise kernel reach the copy rate: float32 relu forward (1 in,
// 1 out) and backward (2 in, 1 out) over 32768x4096 with 16-byte packs, timed with CUDA events
// against cudaMemcpy D2D. "flat" launches one block per 256*U packs (U packs per thread, no
// loop); "persist" launches W waves of resident blocks that walk tiles of 256*U packs.
// The H200 result (benchmarks/NOTES.md, session 4) set the launch shape of every memory-bound
// kernel in jaxdnn: flat with U = 1.
//   nvcc -O3 -arch=sm_90a -o /tmp/launch_shape benchmarks/launch_shape.cu && /tmp/launch_shape
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
constexpr int T = 256;
__device__ __forceinline__ float4 relu4(float4 a) { return {fmaxf(a.x,0.f),fmaxf(a.y,0.f),fmaxf(a.z,0.f),fmaxf(a.w,0.f)}; }
__device__ __forceinline__ float4 drelu4(float4 a, float4 b) { return {a.x>0?b.x:0.f,a.y>0?b.y:0.f,a.z>0?b.z:0.f,a.w>0?b.w:0.f}; }
template <int U, bool B>
__global__ void __launch_bounds__(T) flat(const float4* __restrict__ a, const float4* __restrict__ b, float4* __restrict__ o, long n) {
  long base = long(blockIdx.x) * T * U + threadIdx.x;
  float4 x[U], y[U];
#pragma unroll
  for (int u = 0; u < U; ++u) { long i = base + u * T; if (i < n) { x[u] = a[i]; if (B) y[u] = b[i]; } }
#pragma unroll
  for (int u = 0; u < U; ++u) { long i = base + u * T; if (i < n) o[i] = B ? drelu4(x[u], y[u]) : relu4(x[u]); }
}
template <int U, bool B>
__global__ void __launch_bounds__(T) persist(const float4* __restrict__ a, const float4* __restrict__ b, float4* __restrict__ o, long n) {
  for (long tile = long(blockIdx.x) * T * U; tile < n; tile += long(gridDim.x) * T * U) {
    long base = tile + threadIdx.x;
    float4 x[U], y[U];
#pragma unroll
    for (int u = 0; u < U; ++u) { long i = base + u * T; if (i < n) { x[u] = a[i]; if (B) y[u] = b[i]; } }
#pragma unroll
    for (int u = 0; u < U; ++u) { long i = base + u * T; if (i < n) o[i] = B ? drelu4(x[u], y[u]) : relu4(x[u]); }
  }
}
template <typename F> float timeit(F f) {
  cudaEvent_t s, e; cudaEventCreate(&s); cudaEventCreate(&e);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) { cudaEventRecord(s); f(); cudaEventRecord(e); cudaEventSynchronize(e); float ms; cudaEventElapsedTime(&ms, s, e); t.push_back(ms); }
  std::sort(t.begin(), t.end()); return t[10] * 1e3f;
}
int main() {
  const long elems = 32768L * 4096, n = elems / 4; const size_t bytes = elems * 4;
  float4 *a, *b, *o; cudaMalloc(&a, bytes); cudaMalloc(&b, bytes); cudaMalloc(&o, bytes);
  cudaMemset(a, 1, bytes); cudaMemset(b, 1, bytes);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  auto report = [&](const char* name, float us, int ops) { printf("%-28s %8.1f us  %7.0f GB/s\n", name, us, ops * bytes / us / 1e3); };
  report("memcpy D2D", timeit([&] { cudaMemcpyAsync(o, a, bytes, cudaMemcpyDeviceToDevice); }), 2);
#define FLAT(U, B) report(B ? "flat U=" #U " bwd" : "flat U=" #U " fwd", timeit([&] { flat<U, B><<<(n + T * U - 1) / (T * U), T>>>(a, b, o, n); }), B ? 3 : 2)
#define PERS(U, B, W) { int per; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, persist<U, B>, T, 0); long g = std::min<long>((long)per * sms * W, (n + T * U - 1) / (T * U)); \
   char nm[64]; snprintf(nm, 64, "persist U=%d %s waves=%d (%d/SM)", U, B ? "bwd" : "fwd", W, per); report(nm, timeit([&] { persist<U, B><<<g, T>>>(a, b, o, n); }), B ? 3 : 2); }
  FLAT(1, false); FLAT(2, false); FLAT(4, false); FLAT(8, false);
  PERS(1, false, 1); PERS(4, false, 1); PERS(4, false, 2); PERS(4, false, 4); PERS(8, false, 1); PERS(2, false, 1);
  FLAT(1, true); FLAT(2, true); FLAT(4, true);
  PERS(1, true, 1); PERS(4, true, 1); PERS(4, true, 4); PERS(2, true, 1);
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
