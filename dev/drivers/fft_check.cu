// Standalone GPU check and benchmark of the fft and fft_tiling conv algorithms against the
// direct oracle (kCudaDirect). Build and run from the repository root:
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -I. dev/drivers/fft_check.cu cc/conv/cuda_fft.cu \
//     cc/conv/cuda_fft_tiling.cu cc/conv/cuda_direct.cu -o /tmp/fft_check && /tmp/fft_check
//
// Add `-DWITH_IMPLICIT_GEMM cc/conv/cuda_implicit_gemm.cu` to also time implicit_gemm (3xTF32,
// float32-accurate) in the benchmark. `/tmp/fft_check bench` runs only the benchmark,
// `/tmp/fft_check check` only the checks.
//
// Checks, for every case x dtype pair x direction that an algorithm supports: relative L2 error
// against direct run on the same inputs with a float32 result (tolerance 1e-5 for float32
// results, 1e-2 for float16/bfloat16 results), no NaN (the result is poisoned with 0xFF bytes
// before each call, so unwritten elements fail), and bitwise equality of two runs. Cases also
// state whether each algorithm must support them. One line per case, then ALL OK or
// FAILURES: n (exit code 1).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cc/common/cuda_util.h"
#include "cc/conv/cuda_algorithms.h"

namespace jaxdnn::conv {
extern const CudaAlgorithm kCudaFft;
extern const CudaAlgorithm kCudaFftTiling;
#ifdef WITH_IMPLICIT_GEMM
extern const CudaAlgorithm kCudaImplicitGemm;
#endif
}  // namespace jaxdnn::conv

using namespace jaxdnn;
using namespace jaxdnn::conv;

#define CUDA_OK(x)                                                                      \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)

namespace {

struct Case {
  const char* name;
  int64_t N, H, W, C, K, R, S, pad[4];  // pad: h_lo, h_hi, w_lo, w_hi
  bool fft_ok, tiling_ok;               // whether each algorithm must support it
};

Problem make_problem(const Case& c) {
  Problem p;
  p.N = c.N;
  p.C = c.C;
  p.K = c.K;
  p.in[1] = c.H;
  p.in[2] = c.W;
  p.filt[1] = c.R;
  p.filt[2] = c.S;
  p.pad_lo[1] = c.pad[0];
  p.pad_hi[1] = c.pad[1];
  p.pad_lo[2] = c.pad[2];
  p.pad_hi[2] = c.pad[3];
  for (int a = 0; a < 3; ++a)
    p.out[a] = out_size(p.in[a], p.filt[a], 1, p.pad_lo[a], p.pad_hi[a], 1, 1);
  return p;
}

template <typename T>
__global__ void fill_kernel(T* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    h *= 0xC2B2AE3Du;
    h ^= h >> 16;
    p[i] = cuda::from_acc<T>(float(h) * (2.0f / 4294967296.0f) - 1.0f);
  }
}

void fill(DType t, void* p, int64_t n, uint32_t seed) {
  if (n == 0) return;
  const unsigned blocks = cuda::grid_for(n, 256);
  switch (t) {
    case DType::kF32: fill_kernel<<<blocks, 256>>>(static_cast<float*>(p), n, seed); break;
    case DType::kF16: fill_kernel<<<blocks, 256>>>(static_cast<__half*>(p), n, seed); break;
    case DType::kBF16: fill_kernel<<<blocks, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed); break;
    case DType::kF64: fill_kernel<<<blocks, 256>>>(static_cast<double*>(p), n, seed); break;
  }
  CUDA_OK(cudaGetLastError());
}

std::vector<double> to_host(DType t, const void* p, int64_t n) {
  std::vector<double> out(n);
  std::vector<unsigned char> raw(n * dtype_bytes(t));
  CUDA_OK(cudaMemcpy(raw.data(), p, raw.size(), cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char* e = raw.data() + i * dtype_bytes(t);
    switch (t) {
      case DType::kF32: { float v; std::memcpy(&v, e, 4); out[i] = v; break; }
      case DType::kF64: { double v; std::memcpy(&v, e, 8); out[i] = v; break; }
      case DType::kF16: { f16_t v; std::memcpy(&v, e, 2); out[i] = to_float(v); break; }
      case DType::kBF16: { bf16_t v; std::memcpy(&v, e, 2); out[i] = to_float(v); break; }
    }
  }
  return out;
}

int64_t result_elems(const Args& a) {
  return a.dir == Direction::kFwd ? a.p.y_elems()
         : a.dir == Direction::kBwdData ? a.p.x_elems() : a.p.w_elems();
}

struct DeviceBuf {
  void* p = nullptr;
  explicit DeviceBuf(int64_t bytes) { if (bytes > 0) CUDA_OK(cudaMalloc(&p, bytes)); }
  ~DeviceBuf() { if (p) cudaFree(p); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
};

// Runs `alg` once into a poisoned result; returns the status.
Status run_once(const CudaAlgorithm& alg, const Args& a, Buffers b, void* ws) {
  CUDA_OK(cudaMemset(b.result, 0xFF, result_elems(a) * dtype_bytes(a.out)));
  Status s = alg.run(a, b, ws, nullptr);
  if (s.ok()) {
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) s = Status::Error(std::string("async: ") + cudaGetErrorString(e));
  }
  return s;
}

double rel_l2(const std::vector<double>& out, const std::vector<double>& ref, bool* nan) {
  double num = 0, den = 0;
  *nan = false;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i])) *nan = true;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

const Case kCases[] = {
    {"2d_basic", 2, 7, 6, 5, 4, 3, 3, {1, 1, 1, 1}, true, true},
    {"oversized_pad", 1, 3, 4, 2, 3, 2, 2, {4, 5, 3, 3}, true, true},
    {"negative_pad", 2, 8, 9, 3, 2, 3, 3, {-1, 1, 1, -2}, true, true},
    {"valid_even_kernel", 2, 8, 7, 4, 3, 4, 2, {0, 0, 0, 0}, true, true},
    {"wide_channels", 2, 6, 6, 48, 40, 3, 3, {1, 1, 1, 1}, true, true},
    {"1d", 3, 1, 17, 4, 6, 1, 5, {0, 0, 3, 1}, true, true},
    {"1x1", 2, 8, 8, 6, 5, 1, 1, {0, 0, 0, 0}, true, true},
    {"single_channel", 3, 13, 11, 1, 1, 5, 5, {2, 2, 2, 2}, true, true},
    {"rgb_7x7", 2, 20, 24, 3, 7, 7, 7, {3, 3, 3, 3}, true, true},
    {"empty_input_padded", 1, 0, 4, 2, 3, 1, 2, {1, 1, 1, 1}, true, true},
    {"r7_56_small", 4, 56, 56, 16, 16, 7, 7, {3, 3, 3, 3}, true, true},
    {"r5_28_small", 4, 28, 28, 32, 32, 5, 5, {2, 2, 2, 2}, true, true},
    {"r3_56_tiles", 2, 56, 56, 8, 8, 3, 3, {1, 1, 1, 1}, true, true},
    {"big_plane", 1, 100, 120, 3, 4, 3, 3, {1, 1, 1, 1}, true, true},
    {"r7_224_batches", 8, 224, 224, 64, 64, 7, 7, {3, 3, 3, 3}, false, true},
    {"r7_56_n64", 64, 56, 56, 64, 64, 7, 7, {3, 3, 3, 3}, true, true},
    {"r7_28_n64", 64, 28, 28, 128, 128, 7, 7, {3, 3, 3, 3}, true, true},
};

struct DtypePair {
  DType in, out;
};
const DtypePair kDtypes[] = {{DType::kF32, DType::kF32},
                             {DType::kF16, DType::kF16},
                             {DType::kBF16, DType::kBF16},
                             {DType::kF16, DType::kF32},
                             {DType::kBF16, DType::kF32}};
const Direction kDirs[] = {Direction::kFwd, Direction::kBwdData, Direction::kBwdFilter};

int check_all() {
  const CudaAlgorithm* algs[] = {&kCudaFft, &kCudaFftTiling};
  int failures = 0;
  double max_err[2][2] = {};  // [algorithm][float32 result?]
  for (const Case& c : kCases) {
    const Problem p = make_problem(c);
    if (Status v = validate(p); !v.ok()) {
      std::printf("FAIL %s: invalid problem: %s\n", c.name, v.message.c_str());
      ++failures;
      continue;
    }
    for (const DtypePair& dt : kDtypes) {
      const int eb = dtype_bytes(dt.in);
      DeviceBuf x(p.x_elems() * eb), w(p.w_elems() * eb), y(p.y_elems() * eb);
      fill(dt.in, x.p, p.x_elems(), 1u);
      fill(dt.in, w.p, p.w_elems(), 2u);
      fill(dt.in, y.p, p.y_elems(), 3u);
      for (Direction dir : kDirs) {
        Args a;
        a.dir = dir;
        a.p = p;
        a.in = dt.in;
        a.out = dt.out;
        const int64_t n = result_elems(a);
        if (n == 0) continue;
        Args ao = a;
        ao.out = DType::kF32;
        DeviceBuf ref_buf(n * 4), res(n * dtype_bytes(dt.out));
        const Status so = run_once(kCudaDirect, ao, {x.p, w.p, y.p, ref_buf.p}, nullptr);
        if (!so.ok()) {
          std::printf("FAIL %s: direct oracle: %s\n", c.name, so.message.c_str());
          ++failures;
          continue;
        }
        const std::vector<double> ref = to_host(DType::kF32, ref_buf.p, n);
        for (int ai = 0; ai < 2; ++ai) {
          const CudaAlgorithm& alg = *algs[ai];
          const bool must = ai == 0 ? c.fft_ok : c.tiling_ok;
          char head[256];
          std::snprintf(head, sizeof(head), "%-11s %-10s %-8s->%-8s %-20s", alg.name,
                        direction_name(dir), dtype_name(dt.in), dtype_name(dt.out), c.name);
          const Support sup = alg.supports(a);
          if (!sup.ok) {
            std::printf("%s %s unsupported: %s\n", must ? "FAIL" : "skip", head,
                        sup.reason.c_str());
            failures += must;
            continue;
          }
          const int64_t wsb = alg.workspace_bytes(a);
          DeviceBuf ws(wsb);
          const Buffers b{x.p, w.p, y.p, res.p};
          Status s = run_once(alg, a, b, ws.p);
          if (!s.ok()) {
            std::printf("FAIL %s run: %s\n", head, s.message.c_str());
            ++failures;
            continue;
          }
          std::vector<unsigned char> first(n * dtype_bytes(dt.out)), second(first.size());
          CUDA_OK(cudaMemcpy(first.data(), res.p, first.size(), cudaMemcpyDeviceToHost));
          const std::vector<double> out = to_host(dt.out, res.p, n);
          s = run_once(alg, a, b, ws.p);
          CUDA_OK(cudaMemcpy(second.data(), res.p, second.size(), cudaMemcpyDeviceToHost));
          const bool same = s.ok() && first == second;
          bool nan = false;
          const double err = rel_l2(out, ref, &nan);
          const bool f32 = dt.out == DType::kF32;
          const double tol = f32 ? 1e-5 : 1e-2;
          const bool ok = !nan && err <= tol && same;
          if (!nan) max_err[ai][f32] = std::max(max_err[ai][f32], err);
          std::printf("%s %s err %.2e (tol %.0e)%s%s ws %.1f MB\n", ok ? "ok  " : "FAIL", head,
                      err, tol, nan ? " NaN" : "", same ? "" : " NOT-REPRODUCIBLE",
                      wsb / 1048576.0);
          failures += !ok;
        }
      }
    }
  }
  for (int ai = 0; ai < 2; ++ai)
    std::printf("max relative L2 %s: float32 results %.2e, 16-bit results %.2e\n",
                algs[ai]->name, max_err[ai][1], max_err[ai][0]);

  // Unsupported problems must say why.
  Case bad = {"bad", 2, 9, 9, 4, 4, 3, 3, {1, 1, 1, 1}, false, false};
  Problem strided = make_problem(bad);
  strided.stride[1] = 2;
  strided.out[1] = out_size(9, 3, 2, 1, 1, 1, 1);
  Problem grouped = make_problem(bad);
  grouped.G = 2;
  Problem dilated = make_problem(bad);
  dilated.rhs_dil[2] = 2;
  dilated.out[2] = out_size(9, 3, 1, 1, 1, 1, 2);
  const Problem bads[] = {strided, grouped, dilated, make_problem(bad)};
  for (int i = 0; i < 4; ++i) {
    Args a;
    a.p = bads[i];
    if (i == 3) a.in = a.out = DType::kF64;
    for (const CudaAlgorithm* alg : algs) {
      const Support s = alg->supports(a);
      std::printf("%s %-11s refuses case %d: %s\n", s.ok ? "FAIL" : "ok  ", alg->name, i,
                  s.reason.c_str());
      failures += s.ok || s.reason.empty();
    }
  }
  return failures;
}

// Average milliseconds of `reps` runs after one warm-up, or -1 when unsupported.
double time_ms(const CudaAlgorithm& alg, const Args& a, const Buffers& b, int reps) {
  if (!alg.supports(a).ok) return -1;
  DeviceBuf ws(alg.workspace_bytes(a));
  if (!alg.run(a, b, ws.p, nullptr).ok()) return -1;
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  CUDA_OK(cudaEventRecord(e0));
  for (int i = 0; i < reps; ++i)
    if (!alg.run(a, b, ws.p, nullptr).ok()) return -1;
  CUDA_OK(cudaEventRecord(e1));
  CUDA_OK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
  CUDA_OK(cudaEventDestroy(e0));
  CUDA_OK(cudaEventDestroy(e1));
  return ms / reps;
}

void bench() {
  const Case shapes[] = {
      {"56x56 64->64 7x7", 64, 56, 56, 64, 64, 7, 7, {3, 3, 3, 3}, true, true},
      {"28x28 128->128 7x7", 64, 28, 28, 128, 128, 7, 7, {3, 3, 3, 3}, true, true},
      {"28x28 128->128 5x5", 64, 28, 28, 128, 128, 5, 5, {2, 2, 2, 2}, true, true},
      {"56x56 64->64 3x3", 64, 56, 56, 64, 64, 3, 3, {1, 1, 1, 1}, true, true},
      {"224x224 64->64 7x7", 8, 224, 224, 64, 64, 7, 7, {3, 3, 3, 3}, false, true},
  };
  std::vector<std::pair<const char*, const CudaAlgorithm*>> algs = {
      {"fft", &kCudaFft}, {"fft_tiling", &kCudaFftTiling}, {"direct", &kCudaDirect}};
#ifdef WITH_IMPLICIT_GEMM
  algs.push_back({"implicit_gemm", &kCudaImplicitGemm});
#endif
  std::printf("\nbenchmark, float32, N as listed; TFLOP/s = 2 * macs / time\n");
  for (const Case& c : shapes) {
    const Problem p = make_problem(c);
    DeviceBuf x(p.x_elems() * 4), w(p.w_elems() * 4), y(p.y_elems() * 4);
    fill(DType::kF32, x.p, p.x_elems(), 1u);
    fill(DType::kF32, w.p, p.w_elems(), 2u);
    fill(DType::kF32, y.p, p.y_elems(), 3u);
    for (Direction dir : kDirs) {
      Args a;
      a.dir = dir;
      a.p = p;
      DeviceBuf res(result_elems(a) * 4);
      const Buffers b{x.p, w.p, y.p, res.p};
      std::printf("N=%-3lld %-20s %-10s", (long long)c.N, c.name, direction_name(dir));
      for (auto& [name, alg] : algs) {
        const double ms = time_ms(*alg, a, b, alg == &kCudaDirect ? 2 : 10);
        if (ms < 0)
          std::printf("  %s: n/a", name);
        else
          std::printf("  %s %.3f ms %.1f TFLOP/s", name, ms, 2 * p.macs() / (ms * 1e9));
      }
      std::printf("\n");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  int failures = 0;
  if (mode != "bench") failures = check_all();
  if (mode != "check") bench();
  if (failures) {
    std::printf("FAILURES: %d\n", failures);
    return 1;
  }
  std::printf("ALL OK\n");
  return 0;
}
