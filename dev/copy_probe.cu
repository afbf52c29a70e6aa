// Stream probes on the H200 (float32, the benchmark's batch_norm size: 205.5 MB each way): which
// launch and access shape reads, and reads + writes y = a*x + b, fastest? Phase 1 of the fused
// norm forward is such a read stream and phase 3 such a read + write stream, each a loop in one
// resident 512-thread block per SM; XLA's two kernels are flat grids.
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -I. -arch=sm_90 -o /tmp/p dev/copy_probe.cu
// Median of 20 back-to-back runs each:
//   read + write:
//     memcpy         cudaMemcpyAsync device to device
//     flat U         one 256-thread block per U*4 KB, each thread U 16-byte packs a block apart
//     ring ...       one block per SM (T threads, or 4 blocks of 256), each streaming its
//                    contiguous share (or, "inter", 8 KB steps dealt round-robin) through the
//                    library's per-thread cp.async ring (ring_stream, fused phase 3's loop)
//     claim window   the same blocks, warps claiming 8 KB chunks in address order (atomicAdd)
//     regs ...       T-thread blocks, contiguous shares, batches of U register loads
//   two kernels: a ring read (K1) then a flat apply (K2), per pair and alone;
//   read only: a flat grid, batches of register loads, rings of several depths.
// H200 (2026-12-01, NOTES.md session 17): read + write flat 1 4.00-4.02 TB/s, flat 4 3.84-3.89,
// every one-wave loop 3.50-3.71 (claim window 3.60); the pair 156.3-157.4 us; read only flat 1
// 3.68-3.77, regs 512x8 3.85-3.93, ring 512x16 4.01-4.08.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cc/common/cuda_async.h"
#include "cc/norm/cuda_kernels.cuh"
#include "dev/event_timing.cuh"

__device__ __forceinline__ uint4 axpb(uint4 v) {
  float4 f = *reinterpret_cast<float4*>(&v);
  f.x = f.x * 1.5f + 0.25f, f.y = f.y * 1.5f + 0.25f, f.z = f.z * 1.5f + 0.25f,
  f.w = f.w * 1.5f + 0.25f;
  return *reinterpret_cast<uint4*>(&f);
}

template <int U>
__global__ void __launch_bounds__(256) flat_kernel(const uint4* x, uint4* y, int64_t packs) {
  const int64_t base = int64_t(blockIdx.x) * 256 * U + threadIdx.x;
  uint4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (base + u * 256 < packs) v[u] = __ldg(x + base + u * 256);
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (base + u * 256 < packs) y[base + u * 256] = axpb(v[u]);
}

// Steps of T packs (T*16 bytes); block b takes steps [b*per, (b+1)*per) (contiguous) or b, b + G,
// ... (interleaved); thread t the pack t of each step. kWrite: y = a*x + b at the same place;
// else (read only) each thread sums its packs (kept live by a store that never happens).
template <bool kWrite>
__device__ __forceinline__ void consume(uint4 v, uint4* y, int64_t at, float4& acc) {
  if constexpr (kWrite) {
    y[at] = axpb(v);
  } else {
    const float4 f = reinterpret_cast<const float4&>(v);
    acc.x += f.x, acc.y += f.y, acc.z += f.z, acc.w += f.w;
  }
}

template <int T, int kRing, bool kWrite>
__global__ void __launch_bounds__(T, 1)
    ring_kernel(const uint4* x, uint4* y, int64_t steps, bool inter) {
  extern __shared__ uint4 slots[];  // [kRing][T]
  const int64_t G = gridDim.x, b = blockIdx.x, per = (steps + G - 1) / G;
  const int64_t n = inter ? (steps - b + G - 1) / G
                          : max(int64_t(0), min(steps, b * per + per) - b * per);
  auto at = [&](int64_t q) { return (inter ? b + q * G : b * per + q) * T + threadIdx.x; };
  float4 acc = {0, 0, 0, 0};
  jaxdnn::norm::cuda_impl::ring_stream<kRing, uint4>(
      n, [&](int64_t q) { return x + at(q); },
      [&](int k) { return &slots[k * T + threadIdx.x]; },
      [&](int64_t q, const uint4& v) { consume<kWrite>(v, y, at(q), acc); });
  if (!kWrite && acc.x == 1234.5f) reinterpret_cast<float4*>(y)[b * T + threadIdx.x] = acc;
}

template <int T, int U, bool kWrite>
__global__ void __launch_bounds__(T) regs_kernel(const uint4* x, uint4* y, int64_t steps) {
  const int64_t G = gridDim.x, per = (steps + G - 1) / G, lo = blockIdx.x * per;
  const int64_t hi = min(steps, lo + per);
  float4 acc = {0, 0, 0, 0};
  for (int64_t s = lo; s < hi; s += U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s + u < hi) v[u] = __ldg(x + (s + u) * T + threadIdx.x);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s + u < hi) consume<kWrite>(v[u], y, (s + u) * T + threadIdx.x, acc);
  }
  if (!kWrite && acc.x == 1234.5f) reinterpret_cast<float4*>(y)[blockIdx.x * T + threadIdx.x] = acc;
}

// Persistent blocks whose warps claim 8 KB chunks in address order from a global counter (lane
// 0, atomicAdd, published a chunk ahead in a per-warp log) and stream them through the per-lane
// ring: the grid sweeps a narrow window, as a flat grid's blocks do in launch order. counter[1]
// counts finished warps; the last one zeroes both for the next launch.
constexpr int kChunkPacks = 512, kChunkSteps = kChunkPacks / 32;  // a warp's chunk: 16 steps
constexpr int kClaimRing = 16;
__global__ void __launch_bounds__(512, 1)
    claim_kernel(const uint4* x, uint4* y, int64_t packs, unsigned long long* counter) {
  extern __shared__ uint4 slots[];  // [kClaimRing][512]
  __shared__ int64_t log[16][4];    // per warp, chunk c's claim at c % 4
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t chunks = packs / kChunkPacks;
  unsigned long long next = 0;
  auto publish = [&](int64_t c) {
    if (lane == 0) {
      log[warp][c % 4] = int64_t(next);
      next = atomicAdd(counter, 1ull);
    }
  };
  if (lane == 0) next = atomicAdd(counter, 1ull);
  publish(0);
  publish(1);
  __syncwarp();
  auto issue = [&](int64_t q) {
    const int64_t c = q / kChunkSteps;
    const int r = int(q % kChunkSteps);
    if (r == 0 && c >= 1) {
      publish(c + 1);
      __syncwarp();
    }
    const int64_t ch = log[warp][c % 4];
    if (ch < chunks)
      jaxdnn::cuda::cp_async16(&slots[q % kClaimRing * 512 + threadIdx.x],
                       x + ch * kChunkPacks + r * 32 + lane);
    jaxdnn::cuda::cp_async_commit();
  };
  for (int q = 0; q < kClaimRing - 1; ++q) issue(q);
  for (int64_t q = 0;; ++q) {
    const int64_t ch = log[warp][q / kChunkSteps % 4];
    if (ch >= chunks) break;
    jaxdnn::cuda::cp_async_wait<kClaimRing - 2>();
    const uint4 v = slots[q % kClaimRing * 512 + threadIdx.x];
    y[ch * kChunkPacks + q % kChunkSteps * 32 + lane] = axpb(v);
    issue(q + kClaimRing - 1);
  }
  jaxdnn::cuda::cp_async_wait_all();
  if (lane == 0 && atomicAdd(counter + 1, 1ull) == gridDim.x * 16ull - 1) {
    __threadfence();
    counter[0] = 0;
    counter[1] = 0;
  }
}

// The second kernel of a two-kernel training forward in outline (float32, 64 columns; the first
// is ring_kernel read only): y = x*s[c] + t[c] with one pack per thread, coefficients from a
// 64-column table, in forward or reverse block order (reverse: the first kernel's last-read
// lines first), with plain or streaming (.cs) stores.
template <bool kReverse, bool kStream>
__global__ void __launch_bounds__(256) k2_kernel(const uint4* x, uint4* y, const float4* st,
                                                 int64_t packs) {
  const int64_t blk = kReverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t i = blk * 256 + threadIdx.x;
  if (i >= packs) return;
  const float4 sc = st[i % 16], sh = st[16 + i % 16];
  float4 v = reinterpret_cast<const float4&>(x[i]);
  v.x = v.x * sc.x + sh.x, v.y = v.y * sc.y + sh.y, v.z = v.z * sc.z + sh.z,
  v.w = v.w * sc.w + sh.w;
  if (kStream) __stcs(reinterpret_cast<float4*>(y) + i, v);
  else reinterpret_cast<float4*>(y)[i] = v;
}

int main() {
  const int64_t packs = int64_t(64) * 112 * 112 * 64 / 4, bytes = packs * 16;
  uint4 *x, *y;
  CK_(cudaMalloc(&x, bytes));
  CK_(cudaMalloc(&y, bytes));
  CK_(cudaMemset(x, 0x3c, bytes));
  int sms = 0;
  CK_(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double mb = bytes / 1e6;
  double traffic = 2 * mb;  // MB a run moves: read + write, then read only
  auto row = [&](const char* name, float us) {
    std::printf("  %-18s %7.1f us  %.2f TB/s\n", name, us, traffic / us);
  };
  // A one-wave ring kernel of T-thread blocks (blocks of them) with a ring `depth` deep.
  auto ring = [&](auto kernel, int T, int depth, int blocks, bool inter, const char* name) {
    const size_t smem = size_t(depth) * T * 16;
    CK_(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    row(name, median_us([&] { kernel<<<blocks, T, smem>>>(x, y, packs / T, inter); }));
  };
  auto regs = [&](auto kernel, int T, int blocks, const char* name) {
    row(name, median_us([&] { kernel<<<blocks, T>>>(x, y, packs / T); }));
  };

  std::printf("read+write %.1f MB each way, %d SMs\n", mb, sms);
  row("memcpy", median_us([&] { cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice); }));
  row("flat 1", median_us([&] { flat_kernel<1><<<unsigned(packs / 256), 256>>>(x, y, packs); }));
  row("flat 4", median_us([&] {
        flat_kernel<4><<<unsigned((packs + 1023) / 1024), 256>>>(x, y, packs);
      }));
  row("flat 8", median_us([&] {
        flat_kernel<8><<<unsigned((packs + 2047) / 2048), 256>>>(x, y, packs);
      }));
  ring(ring_kernel<512, 16, true>, 512, 16, sms, false, "ring 512x16 contig");
  ring(ring_kernel<512, 16, true>, 512, 16, sms, true, "ring 512x16 inter");
  ring(ring_kernel<1024, 8, true>, 1024, 8, sms, false, "ring 1024x8");
  ring(ring_kernel<1024, 12, true>, 1024, 12, sms, false, "ring 1024x12");
  ring(ring_kernel<256, 12, true>, 256, 12, 4 * sms, false, "ring 4x256x12");
  {
    unsigned long long* counter;
    CK_(cudaMalloc(&counter, 16));
    CK_(cudaMemset(counter, 0, 16));
    const size_t smem = size_t(kClaimRing) * 512 * 16;
    CK_(cudaFuncSetAttribute(claim_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    row("claim window", median_us([&] { claim_kernel<<<sms, 512, smem>>>(x, y, packs, counter); }));
    // Every pack written once: y = 1.5 x + 0.25 everywhere after a run on a zeroed y.
    CK_(cudaMemset(y, 0, bytes));
    claim_kernel<<<sms, 512, smem>>>(x, y, packs, counter);
    std::vector<float> hy(size_t(packs) * 4), hx(1);
    CK_(cudaMemcpy(hy.data(), y, bytes, cudaMemcpyDeviceToHost));
    CK_(cudaMemcpy(hx.data(), x, 4, cudaMemcpyDeviceToHost));
    const float want = hx[0] * 1.5f + 0.25f;
    int64_t bad = 0;
    for (float v : hy) bad += v != want;
    std::printf("  claim window check: %lld wrong of %lld\n", (long long)bad, (long long)hy.size());
    cudaFree(counter);
  }
  regs(regs_kernel<512, 8, true>, 512, sms, "regs 512x8");
  regs(regs_kernel<1024, 4, true>, 1024, sms, "regs 1024x4");
  regs(regs_kernel<256, 1, true>, 256, 8 * sms, "regs 2048/SM x1");
  regs(regs_kernel<256, 2, true>, 256, 8 * sms, "regs 2048/SM x2");
  {
    float* coef;
    CK_(cudaMalloc(&coef, 32 * 16));
    CK_(cudaMemset(coef, 0, 32 * 16));
    const size_t smem = size_t(16) * 512 * 16;
    constexpr auto k1_kernel = ring_kernel<512, 16, false>;
    CK_(cudaFuncSetAttribute(k1_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const unsigned grid2 = unsigned(packs / 256);
    auto k1 = [&] { k1_kernel<<<sms, 512, smem>>>(x, y, packs / 512, false); };
    auto st = reinterpret_cast<const float4*>(coef);
    std::printf("two kernels (K1 read ring + K2 flat apply), per pair and alone:\n");
    auto pair = [&](auto k2, const char* name) {
      const float tp = median_us([&] { k1(); k2(); });
      const float t2 = median_us([&] { k2(); });
      const float t1 = median_us([&] { k1(); });
      std::printf("  %-22s pair %6.1f us   K1 %5.1f  K2 %6.1f (%.2f TB/s)\n", name, tp, t1, t2,
                  2 * mb / t2);
    };
    pair([&] { k2_kernel<false, false><<<grid2, 256>>>(x, y, st, packs); }, "K2 forward");
    pair([&] { k2_kernel<true, false><<<grid2, 256>>>(x, y, st, packs); }, "K2 reverse");
    pair([&] { k2_kernel<true, true><<<grid2, 256>>>(x, y, st, packs); }, "K2 reverse .cs");
    pair([&] { k2_kernel<false, true><<<grid2, 256>>>(x, y, st, packs); }, "K2 forward .cs");
    cudaFree(coef);
  }
  traffic = mb;
  std::printf("read only %.1f MB\n", mb);
  regs(regs_kernel<256, 1, false>, 256, int(packs / 256), "flat 1");
  regs(regs_kernel<512, 8, false>, 512, sms, "regs 512x8");
  ring(ring_kernel<512, 8, false>, 512, 8, sms, false, "ring 512x8");
  ring(ring_kernel<512, 16, false>, 512, 16, sms, false, "ring 512x16");
  ring(ring_kernel<512, 24, false>, 512, 24, sms, false, "ring 512x24");
  ring(ring_kernel<1024, 8, false>, 1024, 8, sms, false, "ring 1024x8");
  cudaFree(x), cudaFree(y);
}
