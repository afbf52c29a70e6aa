// Kernel-level timing of the norm training forward on the benchmark's batch norm (column path,
// NHWC 64x112x112x64; with -DSEGMENT the segment path, NCHW), CUDA events, median of 20:
//   - the three passes (stats, merge, apply);
//   - the single-pass fused kernel, its mean, var and y checked against the three passes', with
//     its phase times (%globaltimer at the phase boundaries of every block; percentiles over
//     blocks, and each block's phase-1 end with NFB_BLOCKS=1), back to back, after a 512 MB
//     read-only sweep (a clean L2), after a 512 MB memset (an L2 of dirty lines) and after the
//     apply pass;
//   - the stats pass after the same sweeps and after the fused kernel;
//   - the cost per launch of 8 back to back (the fused kernel's cooperative launch against a
//     regular one);
//   - the copy / read rooflines, and (column build) read-only probes of the stats and fused
//     kernels' access shapes and of bulk copies (cp.async.bulk) through a ring of shared-memory
//     slots.
// The kernels are the library's own (this file includes their sources), so two builds of it, one
// from an older tree, give a same-call A/B.
//   F="-std=c++17 -O3 --expt-relaxed-constexpr -I. -arch=sm_90"
//   nvcc $F -o /tmp/nfb dev/norm_fwd_bench.cu cc/norm/cuda_row.cu cc/norm/cuda_segment.cu
//   nvcc $F -DSEGMENT -o /tmp/nfb_seg dev/norm_fwd_bench.cu cc/norm/cuda_row.cu \
//     cc/norm/cuda_column.cu
//   /tmp/nfb [f32|bf16]
#include <cstdint>

__device__ unsigned long long g_phase[4][4096];  // [boundary][block]
__device__ __forceinline__ void phase_mark(int k) {
  if (threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    g_phase[k][blockIdx.x] = t;
  }
}
#define JAXDNN_NORM_PHASE(k) phase_mark(k)

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#ifdef SEGMENT
#include "cc/norm/cuda_segment.cu"
#define STATS segment_stats
#define APPLY segment_apply
#define FUSED segment_fused
#else
#include "cc/norm/cuda_column.cu"
#define STATS column_stats
#define APPLY column_apply
#define FUSED column_fused
#endif
#include "cc/norm/cuda_norm.cu"
#include "cc/conv/cuda_tma.cuh"
#include "dev/event_timing.cuh"

using namespace jaxdnn::norm;
using namespace jaxdnn::norm::cuda_impl;

#define ST_(...)                                                   \
  do {                                                             \
    jaxdnn::Status s_ = (__VA_ARGS__);                                       \
    if (!s_.ok()) {                                                \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, s_.message.c_str()); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

// Access-pattern probe: blocks read 16-byte vectors of whole rows (row_vecs per row), a step of
// blockDim/row_vecs rows at a time, U steps of loads in flight per thread, no arithmetic. Block b
// owns `steps` chunks (one step's rows each) of `chunks`:
//   mode 0 contiguous  chunks b*steps + k
//   mode 1 rotated     the same chunks, starting at k = (b*37) % steps and wrapping
//   mode 2 interleaved chunks b + k*gridDim (the whole grid sweeps x together)
template <int U>
__global__ void pattern_kernel(const uint4* x, int64_t row_vecs, int64_t chunks, int steps,
                               int mode, unsigned* sink) {
  const int tx = threadIdx.x % row_vecs, ty = threadIdx.x / row_vecs;
  const int rows_per_step = blockDim.x / row_vecs;
  const int rot = mode == 1 ? int(blockIdx.x * 37ll % steps) : 0;
  unsigned acc = 0;
  for (int k0 = 0; k0 < steps; k0 += U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + u, kk = k < steps ? (k + rot) % steps : steps;  // steps: past the end
      const int64_t c = mode == 2 ? blockIdx.x + int64_t(kk) * gridDim.x
                                  : blockIdx.x * int64_t(steps) + kk;
      v[u] = kk < steps && c < chunks ? x[(c * rows_per_step + ty) * row_vecs + tx]
                                      : uint4{0, 0, 0, 0};
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

// Bulk-copy probe: each block streams its contiguous `per_block` bytes through a ring of S
// shared-memory slots of `chunk` bytes, filled by cp.async.bulk (one thread issues, the copy
// engine moves, an mbarrier counts the bytes); every warp reads each slot (16 B per thread per
// access) and releases it on an `empty` barrier, after which thread 0 refills it S chunks ahead.
__global__ void __launch_bounds__(512, 1)
    bulk_probe_kernel(const char* x, int64_t per_block, int chunk, int S, unsigned* sink) {
  using namespace jaxdnn::conv::gemm;
  extern __shared__ uint4 ring[];
  __shared__ uint64_t full[16], empty[16];
  const int tid = threadIdx.x, warps = blockDim.x / 32;
  const char* src = x + blockIdx.x * per_block;
  const int n = int(per_block / chunk), vecs = chunk / 16;
  auto bar = [](uint64_t* b) { return jaxdnn::cuda::smem_addr(b); };
  if (tid == 0) {
    for (int i = 0; i < S; ++i) mbar_init(bar(&full[i]), 1), mbar_init(bar(&empty[i]), warps);
    mbar_init_fence();
  }
  __syncthreads();
  auto issue = [&](int k) {
    const int sl = k % S;
    mbar_expect_bytes(bar(&full[sl]), chunk);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
        ::"r"(jaxdnn::cuda::smem_addr(ring) + sl * chunk), "l"(src + int64_t(k) * chunk),
        "r"(chunk), "r"(bar(&full[sl]))
        : "memory");
  };
  if (tid == 0)
    for (int k = 0; k < S && k < n; ++k) issue(k);
  unsigned acc = 0;
  for (int k = 0; k < n; ++k) {
    const int sl = k % S;
    const uint32_t par = (k / S) & 1;
    mbar_wait(bar(&full[sl]), par);
    for (int v = tid; v < vecs; v += blockDim.x) {
      const uint4 q = ring[sl * vecs + v];
      acc ^= q.x ^ q.y ^ q.z ^ q.w;
    }
    __syncwarp();
    if (tid % 32 == 0) mbar_arrive(bar(&empty[sl]));
    if (tid == 0 && k + S < n) {
      mbar_wait(bar(&empty[sl]), par);
      issue(k + S);
    }
  }
  if (acc == 0x12345678u) *sink = acc;
}

template <typename D>
void run(const char* name) {
  Shape s;
#ifdef SEGMENT
  s.P = 1, s.A = 64, s.C = 64, s.K = 1, s.T = 112 * 112;
#else
  s.P = 1, s.A = 64 * 112 * 112, s.C = 64, s.K = 1, s.T = 1;
#endif
  using Acc = A<D>;
  const int64_t n = s.elems(), bytes = n * int64_t(sizeof(D));
  std::vector<D> hx(static_cast<size_t>(n));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.5f, 2.0f);
  for (auto& v : hx) v = D(nd(rng));
  D *x, *y;
  Acc *scale, *bias, *mean, *var;
  double* ws;
  unsigned* sink;
  CK_(cudaMalloc(&x, bytes));
  CK_(cudaMalloc(&y, bytes));
  CK_(cudaMalloc(&scale, s.CK() * sizeof(Acc)));
  CK_(cudaMalloc(&bias, s.CK() * sizeof(Acc)));
  CK_(cudaMalloc(&mean, s.groups() * sizeof(Acc)));
  CK_(cudaMalloc(&var, s.groups() * sizeof(Acc)));
  CK_(cudaMalloc(&ws, fwd_workspace_bytes(s)));
  CK_(cudaMalloc(&sink, 4));
  CK_(cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice));
  std::vector<Acc> ones(size_t(s.CK()), Acc(1));
  CK_(cudaMemcpy(scale, ones.data(), s.CK() * sizeof(Acc), cudaMemcpyHostToDevice));
  CK_(cudaMemset(bias, 0, s.CK() * sizeof(Acc)));
  const Fwd<D> f{s, true, true, Acc(1e-5), x, scale, bias, y, mean, var, ws,
                 ws + fwd_partials(s)};
  const double mb = bytes / 1e6;
  auto rate = [&](double traffic, float us) { return traffic / us; };  // MB/us = TB/s

  const float t_copy = median_us([&] { cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice); });
  const int64_t packs = bytes / 16;
  const float t_read = median_us([&] {
    read_kernel<<<unsigned((packs + 255) / 256), 256>>>(reinterpret_cast<const uint4*>(x), packs,
                                                        sink);
  });
#ifndef SEGMENT
  {
    const int64_t row_vecs = s.CK() * int64_t(sizeof(D)) / 16;  // 16-byte vectors per row
    const char* modes[3] = {"contiguous", "rotated", "interleaved"};
    auto probe = [&](auto u, int threads, int64_t blocks_or_zero, int steps, int mode) {
      const int64_t chunks = s.A / (threads / row_vecs);
      const int64_t blocks = blocks_or_zero ? blocks_or_zero : (chunks + steps - 1) / steps;
      if (blocks_or_zero) steps = int((chunks + blocks - 1) / blocks);
      const float tp = median_us([&] {
        pattern_kernel<decltype(u)::value><<<unsigned(blocks), threads>>>(
            reinterpret_cast<const uint4*>(x), row_vecs, chunks, steps, mode, sink);
      });
      std::printf("  pattern %4d thr x %5lld blocks, U=%d, %4d steps %-11s %7.1f us  %.2f TB/s\n",
                  threads, (long long)blocks, decltype(u)::value, steps, modes[mode], tp,
                  rate(mb, tp));
    };
    using U4 = std::integral_constant<int, 4>;
    using U8 = std::integral_constant<int, 8>;
    for (int mode : {0, 1, 2}) probe(U4{}, 256, 0, 32, mode);  // the stats kernel's shape
    for (int mode : {0, 1, 2}) probe(U4{}, 256, 0, 4, mode);   // one batch per thread
    for (int mode : {0, 1, 2}) probe(U8{}, 512, 132, 0, mode); // the fused kernel's phase 1
    for (int mode : {0, 2}) probe(U8{}, 512, 264, 0, mode);
    for (int mode : {0, 2}) probe(U4{}, 256, 528, 0, mode);
    CK_(cudaFuncSetAttribute(bulk_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             200 * 1024));
    struct Cfg { int threads, blocks, S, chunk; };
    for (Cfg c : {Cfg{512, 132, 2, 16384}, Cfg{512, 132, 4, 8192}, Cfg{512, 132, 4, 16384},
                  Cfg{512, 132, 8, 8192}, Cfg{512, 132, 8, 16384}, Cfg{512, 132, 4, 32768},
                  Cfg{512, 132, 6, 32768}, Cfg{512, 132, 12, 16384}, Cfg{256, 132, 8, 16384},
                  Cfg{128, 132, 8, 16384}, Cfg{256, 264, 4, 16384}, Cfg{256, 264, 6, 16384}}) {
      const int64_t per = bytes / c.blocks / c.chunk * c.chunk;
      const float tb = median_us([&] {
        bulk_probe_kernel<<<unsigned(c.blocks), c.threads, size_t(c.S) * c.chunk>>>(
            reinterpret_cast<const char*>(x), per, c.chunk, c.S, sink);
      });
      CK_(cudaGetLastError());
      std::printf("  bulk %4d thr x %4d blocks, %2d x %5d B slots  %7.1f us  %.2f TB/s\n",
                  c.threads, c.blocks, c.S, c.chunk, tb, rate(per * c.blocks / 1e6, tb));
    }
  }
#endif
  const float t_stats = median_us([&] { ST_(STATS(f, nullptr)); });
  const float t_merge = median_us([&] { ST_(merge_stats(f, nullptr)); });
  const float t_apply = median_us([&] { ST_(APPLY(f, nullptr)); });
  std::vector<D> y3(static_cast<size_t>(n)), yf(static_cast<size_t>(n));
  CK_(cudaMemcpy(y3.data(), y, bytes, cudaMemcpyDeviceToHost));
  std::vector<Acc> m3(size_t(s.groups())), v3(size_t(s.groups()));
  CK_(cudaMemcpy(m3.data(), mean, s.groups() * sizeof(Acc), cudaMemcpyDeviceToHost));
  CK_(cudaMemcpy(v3.data(), var, s.groups() * sizeof(Acc), cudaMemcpyDeviceToHost));
  bool ran = false;
  int blocks = 0;
  {
    FusedCapacity cap;
#ifdef SEGMENT
    constexpr auto kernel = segment_fused_kernel<D, Vec<D>::kN>;
#else
    constexpr auto kernel = column_fused_kernel<D, Vec<D>::kN>;
#endif
    ST_(fused_capacity<kernel>(&cap));
    blocks = int(cap.blocks);
  }
  std::printf("%s  %lld elems, %.1f MB, blocks=%d\n", name, (long long)n, mb, blocks);
  std::printf("  copy  %7.1f us  %.2f TB/s (read+write)\n", t_copy, rate(2 * mb, t_copy));
  std::printf("  read  %7.1f us  %.2f TB/s\n", t_read, rate(mb, t_read));
  std::printf("  stats %7.1f us  %.2f TB/s\n", t_stats, rate(mb, t_stats));
  std::printf("  merge %7.1f us\n", t_merge);
  std::printf("  apply %7.1f us  %.2f TB/s\n", t_apply, rate(2 * mb, t_apply));
  std::printf("  3-pass sum %7.1f us\n", t_stats + t_merge + t_apply);
  // A 512 MB read-only sweep before a run leaves the L2 clean (no dirty y lines to write back).
  const int64_t flush_packs = (int64_t(512) << 20) / 16;
  uint4* flush_buf;
  CK_(cudaMalloc(&flush_buf, flush_packs * 16));
  CK_(cudaMemset(flush_buf, 1, flush_packs * 16));
  // Before each timed run: 0 nothing (back to back), 1 the read-only sweep (clean L2), 2 a 512 MB
  // memset (the L2 full of dirty lines of another buffer), 3 the apply pass (dirty y lines),
  // 4 the fused kernel (its dirty y lines).
  bool ran_pre = false;
  auto before = [&](int pre) {
    if (pre == 1)
      read_kernel<<<unsigned((flush_packs + 255) / 256), 256>>>(flush_buf, flush_packs, sink);
    if (pre == 2) cudaMemsetAsync(flush_buf, 0, flush_packs * 16);
    if (pre == 3) ST_(APPLY(f, nullptr));
    if (pre == 4) ST_(FUSED(f, nullptr, &ran_pre));
  };
  const char* pre_names[5] = {"back to back", "after a read sweep", "after a memset",
                              "after apply", "after fused"};
  for (int pre : {1, 2, 3, 4})
    std::printf("  stats %-22s %7.1f us\n", pre_names[pre],
                median_us([&] { ST_(STATS(f, nullptr)); }, [&] { before(pre); }));
  auto fused_run = [&](const char* label, int pre) {
    const float t = median_us([&] { ST_(FUSED(f, nullptr, &ran)); }, [&] { before(pre); });
    std::vector<Acc> mf(size_t(s.groups())), vf(size_t(s.groups()));
    CK_(cudaMemcpy(mf.data(), mean, s.groups() * sizeof(Acc), cudaMemcpyDeviceToHost));
    CK_(cudaMemcpy(vf.data(), var, s.groups() * sizeof(Acc), cudaMemcpyDeviceToHost));
    double dm = 0, dv = 0;
    for (int64_t g = 0; g < s.groups(); ++g) {
      dm = std::max(dm, std::abs(double(mf[g]) - double(m3[g])));
      dv = std::max(dv, std::abs(double(vf[g]) - double(v3[g])) / double(v3[g]));
    }
    CK_(cudaMemcpy(yf.data(), y, bytes, cudaMemcpyDeviceToHost));
    double dy = 0;
    for (int64_t i = 0; i < n; ++i)
      dy = std::max(dy, std::abs(double(float(yf[size_t(i)])) - double(float(y3[size_t(i)]))));
    // Phase times of the last run, per boundary over blocks, from the earliest start.
    std::vector<unsigned long long> ph(4 * 4096);
    CK_(cudaMemcpyFromSymbol(ph.data(), g_phase, ph.size() * 8));
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < blocks; ++b) t0 = std::min(t0, ph[b]);
    std::printf("  fused %-22s %7.1f us (ran=%d; vs 3-pass |dmean| %.1e rel dvar %.1e |dy| %.1e)\n",
                label, t, int(ran), dm, dv, dy);
    const char* names[4] = {"start", "phase1 done", "merge done", "end"};
    for (int k = 1; k < 4; ++k) {
      std::vector<double> at(static_cast<size_t>(blocks));
      for (int b = 0; b < blocks; ++b) at[size_t(b)] = (ph[k * 4096 + b] - t0) / 1e3;
      if (k == 1 && std::getenv("NFB_BLOCKS")) {
        std::printf("    phase1 by block:");
        for (int b = 0; b < blocks; ++b) std::printf(" %.0f", at[size_t(b)]);
        std::printf("\n");
      }
      std::sort(at.begin(), at.end());
      auto pct = [&](int q) { return at[size_t((blocks - 1) * q / 100)]; };
      std::printf("    %-12s first %6.1f  p10 %6.1f  p50 %6.1f  p90 %6.1f  last %6.1f us\n",
                  names[k], pct(0), pct(10), pct(50), pct(90), pct(100));
    }
  };
  for (int pre : {0, 1, 2, 3}) fused_run(pre_names[pre], pre);
  // Launch cost in a busy stream: 8 launches back to back between two events, per launch. The
  // regular (non-cooperative) launch of the fused kernel is only valid here, on an otherwise
  // idle GPU, where every block of the one-wave grid is resident anyway.
  auto per_launch = [&](auto launch) {
    return median_us([&] {
             for (int i = 0; i < 8; ++i) launch();
           }) / 8;
  };
  std::printf("  x8 back to back, per launch: fused %.1f us, stats %.1f, apply %.1f", per_launch(
      [&] { ST_(FUSED(f, nullptr, &ran)); }), per_launch([&] { ST_(STATS(f, nullptr)); }),
              per_launch([&] { ST_(APPLY(f, nullptr)); }));
#ifndef SEGMENT
  {
    constexpr auto kernel = column_fused_kernel<D, Vec<D>::kN>;
    FusedCapacity cap;
    ST_(fused_capacity<kernel>(&cap));
    const ColumnGrid g = fused_grid(s, Vec<D>::kN, cap.blocks);
    std::printf(", fused with a regular launch %.1f", per_launch([&] {
      kernel<<<unsigned(g.blocks), kFusedThreads, size_t(cap.stash_bytes)>>>(
          f, g, cap.stash_bytes / int64_t(sizeof(D)));
    }));
    CK_(cudaGetLastError());
  }
#endif
  std::printf("\n");
  cudaFree(flush_buf);
  cudaFree(x), cudaFree(y), cudaFree(scale), cudaFree(bias), cudaFree(mean), cudaFree(var),
      cudaFree(ws), cudaFree(sink);
}

int main(int argc, char** argv) {
  const bool bf = argc > 1 && !std::strcmp(argv[1], "bf16");
  if (bf) run<__nv_bfloat16>("bf16");
  else run<float>("f32");
  return 0;
}
