// CUDA helpers shared by every kernel file: element loads/stores in the accumulator type,
// launches (programmatic dependent launch) and their checks that name the kernel, and grid
// sizing (plain and persistent grids).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "cc/common/dtype.h"
#include "cc/common/status.h"

namespace jaxdnn::cuda {

// Device storage type of each DType (host tags bf16_t/f16_t map onto the CUDA types).
template <typename HostT> struct DeviceOf { using type = HostT; };
template <> struct DeviceOf<bf16_t> { using type = __nv_bfloat16; };
template <> struct DeviceOf<f16_t> { using type = __half; };
template <typename HostT> using device_t = typename DeviceOf<HostT>::type;

template <typename T> struct DevAcc { using type = float; };
template <> struct DevAcc<double> { using type = double; };
template <typename T> using dev_acc_t = typename DevAcc<T>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

// The two 16-bit values packed in a 32-bit word, as floats (x: the low half). bfloat16 is the
// top half of a float: one shift or mask each.
template <typename T> __device__ __forceinline__ float2 unpack_acc(unsigned w);
template <> __device__ __forceinline__ float2 unpack_acc<__nv_bfloat16>(unsigned w) {
  return {__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u)};
}
template <> __device__ __forceinline__ float2 unpack_acc<__half>(unsigned w) {
  __half2 h;
  memcpy(&h, &w, sizeof(h));
  return __half22float2(h);
}

template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(float v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <typename T> __device__ __forceinline__ T from_acc(double v) {
  if constexpr (std::is_same_v<T, double>) return v; else return from_acc<T>(float(v));
}

// After a launch: the launch error (bad configuration, or an earlier asynchronous fault)
// becomes a Status that names the kernel.
inline Status check_launch(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::Ok();
  return Status::Error(std::string("CUDA error in ") + kernel + ": " + cudaGetErrorName(e) +
                       ": " + cudaGetErrorString(e));
}

// A runtime API result as a Status that names what was attempted.
inline Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();  // clear it, so that the next launch check does not report it again
  return Status::Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + ": " +
                       cudaGetErrorString(e));
}

// Programmatic dependent launch (sm_90), the way XLA:GPU launches its own fusions. A kernel
// started by `launch` is launched as the kernel before it on the stream drains (when its last
// block exits) instead of after that kernel has completed and flushed; its first statement must
// be await_prior_grids(), which holds every thread until the grids before it have completed and
// their writes are visible, the same order as a plain launch. Kernel trace on the H200: back-to-
// back plain launches start 0.3-0.9 us after the previous kernel ends, XLA's fusions 0.1-0.3 us
// before. There is no early trigger (griddepcontrol.launch_dependents at a kernel's start): the
// dependent grid's blocks then sat resident and waiting through the whole of a one-wave kernel,
// and batch_norm NCHW's two-call forward lost 5.7 us (docs/perf/gpu-memory.md).
__device__ __forceinline__ void await_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent launch, in
// clusters of `cluster` blocks along x (0: no clusters), checked (check_launch(name)). kernel
// must begin with await_prior_grids().
template <typename... Params, typename... Args>
Status launch_clusters(const char* name, unsigned cluster, void (*kernel)(Params...), dim3 grid,
                       dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  if (cluster > 0) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n++].val.clusterDim = {cluster, 1, 1};
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  return e == cudaSuccess ? check_launch(name) : check(e, name);
}

template <typename... Params, typename... Args>
Status launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
              cudaStream_t stream, Args&&... args) {
  return launch_clusters(name, 0, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// Streaming multiprocessors of the current device (0 if it cannot be queried).
inline int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 0;
  return sms;
}

// Blocks for a grid-stride loop over n items: one per `threads` items (each thread then runs
// the loop body once: the flat launch shape that streams fastest on the H200, 4.11 TB/s for a
// float32 relu against 3.74-3.81 for grids capped at one to four waves, docs/perf/gpu-memory.md),
// never more than max_blocks.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 0x7fffffff) {
  int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > max_blocks ? max_blocks : b));
}

// Division by a divisor d fixed on the host, 0 < d and 0 <= n < 2^31: multiply-high, add and
// shift (Granlund and Montgomery's round-up multiplier), a few instructions where a 32-bit
// division takes ~20 and a 64-bit one is a call of ~100.
struct FastDiv {
  uint32_t d = 1, mul = 1, shift = 0;  // divisor 1
  FastDiv() = default;
  __host__ __device__ explicit FastDiv(uint32_t d_) : d(d_) {
    while ((1u << shift) < d) ++shift;
    mul = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ int div(int n) const {  // umulhi(n, mul) < n: the sum fits
    return int((__umulhi(uint32_t(n), mul) + uint32_t(n)) >> shift);
  }
};

// FastDiv's interface for any int64_t divisor and dividend: the plain division.
struct PlainDiv {
  int64_t d = 1;
  PlainDiv() = default;
  __host__ __device__ explicit PlainDiv(int64_t d_) : d(d_) {}
  __device__ __forceinline__ int64_t div(int64_t n) const { return n / d; }
};

// Blocks for a persistent kernel, a grid-stride loop over `work` block-sized items: as many as
// the device holds at once (one wave: no block waits for a slot, none idles after the last
// wave), never more than the work, at least one. kKernel's occupancy at kThreads threads per
// block (and `smem` bytes of dynamic shared memory, the same at every call) depends only on the
// architecture and is queried once; the SM count on every launch.
template <auto kKernel, int kThreads>
unsigned resident_grid(int64_t work, size_t smem = 0) {
  static const int per_sm = [smem] {
    int n = 1;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kThreads, smem);
    return n < 1 ? 1 : n;
  }();
  int device = 0, sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t wave = int64_t(per_sm) * sms;
  return unsigned(work < 1 ? 1 : (work < wave ? work : wave));
}

}  // namespace jaxdnn::cuda
