// Standalone check and benchmark of the winograd and winograd_nonfused conv algorithms against
// the direct GPU oracle (kCudaDirect). Build and run from the repository root:
//
//   nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I. dev/drivers/winograd_check.cu \
//     cc/conv/cuda_winograd.cu cc/conv/cuda_winograd_nonfused.cu cc/conv/cuda_direct.cu \
//     -o /tmp/winograd_check && /tmp/winograd_check            # --no-bench: checks only
//
// For every problem of the grid, dtype pair and direction an algorithm supports: run direct
// and the algorithm on the same random inputs, the algorithm twice with its output and
// workspace poisoned (0xFF bytes, NaN) before each call; require no NaN, a relative L2 error
// within the dtype's tolerance (float32 result 1e-4, the Winograd tolerance; 16-bit results
// 1e-2) and, as both are declared deterministic, bitwise equal runs. Then time both
// algorithms and direct on the ResNet-50 3x3 stride-1 layers (N=64, float32, pad 1) with CUDA
// events and print effective TFLOP/s = 2*N*P*Q*K*C*9 / time. One line per case, a summary of
// the largest errors, and "ALL OK" or "FAILURES: n" (exit code 1).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cc/common/dtype.h"
#include "cc/conv/cuda_algorithms.h"

namespace jaxdnn::conv {
extern const CudaAlgorithm kCudaWinograd;
extern const CudaAlgorithm kCudaWinogradNonfused;
}  // namespace jaxdnn::conv

using namespace jaxdnn;
using namespace jaxdnn::conv;

#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                   \
                   cudaGetErrorString(e_));                                                \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

int g_failures = 0;
std::map<std::string, double> g_max_err;  // "algo dir in->out" -> largest error seen

// A 2-D 3x3 stride-1 problem: x (N, H, W, C), w (3, 3, C/G, K), pads per side.
Problem make_problem(int64_t N, int64_t H, int64_t W, int64_t C, int64_t K, int64_t G,
                     int64_t pad_t, int64_t pad_b, int64_t pad_l, int64_t pad_r) {
  Problem p;
  p.N = N, p.C = C, p.K = K, p.G = G;
  p.in[1] = H, p.in[2] = W;
  p.filt[1] = p.filt[2] = 3;
  p.pad_lo[1] = pad_t, p.pad_hi[1] = pad_b, p.pad_lo[2] = pad_l, p.pad_hi[2] = pad_r;
  for (int a = 1; a < 3; ++a)
    p.out[a] = out_size(p.in[a], 3, 1, p.pad_lo[a], p.pad_hi[a], 1, 1);
  return p;
}

std::string describe(const Problem& p) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "N%lld %lldx%lld C%lld K%lld G%lld pad(%lld,%lld)(%lld,%lld)",
                (long long)p.N, (long long)p.in[1], (long long)p.in[2], (long long)p.C,
                (long long)p.K, (long long)p.G, (long long)p.pad_lo[1], (long long)p.pad_hi[1],
                (long long)p.pad_lo[2], (long long)p.pad_hi[2]);
  return buf;
}

// Host <-> storage conversions through float.
void encode(DType t, const std::vector<float>& v, std::vector<unsigned char>& out) {
  const size_t n = v.size(), b = dtype_bytes(t);
  out.resize(n * b);
  for (size_t i = 0; i < n; ++i) {
    unsigned char* d = out.data() + i * b;
    switch (t) {
      case DType::kF32: std::memcpy(d, &v[i], 4); break;
      case DType::kF64: { const double x = v[i]; std::memcpy(d, &x, 8); break; }
      case DType::kF16: { const f16_t h = f16_from_float(v[i]); std::memcpy(d, &h, 2); break; }
      case DType::kBF16: { const bf16_t h = bf16_from_float(v[i]); std::memcpy(d, &h, 2); break; }
    }
  }
}

double decode(DType t, const unsigned char* d) {
  switch (t) {
    case DType::kF32: { float x; std::memcpy(&x, d, 4); return x; }
    case DType::kF64: { double x; std::memcpy(&x, d, 8); return x; }
    case DType::kF16: { f16_t h; std::memcpy(&h, d, 2); return to_float(h); }
    case DType::kBF16: { bf16_t h; std::memcpy(&h, d, 2); return to_float(h); }
  }
  return 0;
}

struct DeviceBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuf(size_t n) : bytes(n) {
    if (n) CHECK_CUDA(cudaMalloc(&ptr, n));
  }
  DeviceBuf(DeviceBuf&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr, o.bytes = 0; }
  DeviceBuf& operator=(DeviceBuf&&) = delete;
  ~DeviceBuf() { cudaFree(ptr); }
};

DeviceBuf upload_random(DType t, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = nd(rng);
  std::vector<unsigned char> bytes;
  encode(t, v, bytes);
  DeviceBuf d(bytes.size());
  if (!bytes.empty()) CHECK_CUDA(cudaMemcpy(d.ptr, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  return d;
}

int64_t result_elems(const Args& a) {
  switch (a.dir) {
    case Direction::kFwd: return a.p.y_elems();
    case Direction::kBwdData: return a.p.x_elems();
    case Direction::kBwdFilter: return a.p.w_elems();
  }
  return 0;
}

// Runs `alg` with its output and workspace poisoned first; returns the result bytes.
std::vector<unsigned char> run_poisoned(const CudaAlgorithm& alg, const Args& a, Buffers b,
                                        DeviceBuf& result, DeviceBuf& ws) {
  CHECK_CUDA(cudaMemset(result.ptr, 0xFF, result.bytes));
  if (ws.bytes) CHECK_CUDA(cudaMemset(ws.ptr, 0xFF, ws.bytes));
  b.result = result.ptr;
  const Status st = alg.run(a, b, ws.ptr, nullptr);
  if (!st.ok()) {
    std::printf("    %s run error: %s\n", alg.name, st.message.c_str());
    ++g_failures;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<unsigned char> host(result.bytes);
  CHECK_CUDA(cudaMemcpy(host.data(), result.ptr, result.bytes, cudaMemcpyDeviceToHost));
  return host;
}

// Mean time of `iters` calls (after one warm-up), in seconds.
double time_runs(const CudaAlgorithm& alg, const Args& a, const Buffers& b, void* ws,
                 int iters) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  alg.run(a, b, ws, nullptr);
  CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) alg.run(a, b, ws, nullptr);
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms * 1e-3 / iters;
}

double tolerance(DType out) { return out == DType::kF32 ? 1e-4 : 1e-2; }

// Checks one (algorithm, problem, direction, dtypes) case; with `bench_iters` > 0 also times
// it against direct.
void check_case(const CudaAlgorithm& alg, const Problem& p, Direction dir, DType in, DType out,
                int bench_iters) {
  Args a;
  a.dir = dir, a.p = p, a.in = in, a.out = out;
  const std::string what = std::string(alg.name) + " " + direction_name(dir) + " " +
                           dtype_name(in) + "->" + dtype_name(out);
  const Support sup = alg.supports(a);
  if (!sup.ok) {
    std::printf("%-46s %-44s skip: %s\n", what.c_str(), describe(p).c_str(), sup.reason.c_str());
    return;
  }
  const int64_t n = result_elems(a);
  if (n == 0) {
    std::printf("%-46s %-44s empty result\n", what.c_str(), describe(p).c_str());
    return;
  }
  std::mt19937 rng(1234);
  DeviceBuf x = upload_random(in, p.x_elems(), rng);
  DeviceBuf w = upload_random(in, p.w_elems(), rng);
  DeviceBuf y = upload_random(in, p.y_elems(), rng);
  const Buffers bufs{x.ptr, w.ptr, y.ptr, nullptr};
  DeviceBuf res(size_t(n) * dtype_bytes(out));
  DeviceBuf no_ws(0);
  DeviceBuf ws(size_t(alg.workspace_bytes(a)));

  const std::vector<unsigned char> ref = run_poisoned(kCudaDirect, a, bufs, res, no_ws);
  const std::vector<unsigned char> got = run_poisoned(alg, a, bufs, res, ws);
  const std::vector<unsigned char> again = run_poisoned(alg, a, bufs, res, ws);

  double num = 0, den = 0;
  int64_t nans = 0;
  const int ob = dtype_bytes(out);
  for (int64_t i = 0; i < n; ++i) {
    const double r = decode(out, ref.data() + i * ob), v = decode(out, got.data() + i * ob);
    if (std::isnan(v)) { ++nans; continue; }
    num += (v - r) * (v - r);
    den += r * r;
  }
  const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const bool same = got == again;
  const bool ok = nans == 0 && err <= tolerance(out) && same;
  double& worst = g_max_err[what];
  worst = std::max(worst, err);
  if (!ok) ++g_failures;
  std::printf("%-46s %-44s ws %10lld B  rel_l2 %.2e%s%s  %s\n", what.c_str(),
              describe(p).c_str(), (long long)ws.bytes, err,
              nans ? (" NaN x" + std::to_string(nans)).c_str() : "",
              same ? "" : " NOT-REPRODUCIBLE", ok ? "ok" : "FAIL");

  if (bench_iters > 0) {
    DeviceBuf res2(size_t(n) * dtype_bytes(out));
    Buffers b = bufs;
    b.result = res2.ptr;
    const double t_alg = time_runs(alg, a, b, ws.ptr, bench_iters);
    const double t_dir = time_runs(kCudaDirect, a, b, nullptr, 2);
    const double flops = 2 * p.macs();
    std::printf("  BENCH %-40s %-30s %9.1f us %7.1f TFLOP/s   direct %9.1f us %6.1f TFLOP/s"
                "   speedup %.1fx\n",
                what.c_str(), describe(p).c_str(), t_alg * 1e6, flops / t_alg * 1e-12,
                t_dir * 1e6, flops / t_dir * 1e-12, t_dir / t_alg);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool bench = !(argc > 1 && std::strcmp(argv[1], "--no-bench") == 0);
  const CudaAlgorithm* algs[] = {&kCudaWinograd, &kCudaWinogradNonfused};
  const Direction dirs[] = {Direction::kFwd, Direction::kBwdData, Direction::kBwdFilter};
  struct Pair { DType in, out; };
  const Pair dtypes[] = {{DType::kF32, DType::kF32},  {DType::kF16, DType::kF16},
                         {DType::kBF16, DType::kBF16}, {DType::kF16, DType::kF32},
                         {DType::kBF16, DType::kF32},  {DType::kF64, DType::kF64}};
  const Problem grid[] = {
      make_problem(2, 7, 6, 5, 4, 1, 1, 1, 1, 1),         // SAME
      make_problem(1, 9, 13, 3, 7, 1, 0, 0, 0, 0),        // VALID
      make_problem(2, 8, 7, 16, 16, 1, 2, 0, 0, 2),       // asymmetric padding
      make_problem(1, 3, 4, 2, 3, 1, 3, 4, 4, 3),         // padding wider than the filter
      make_problem(2, 8, 9, 3, 2, 1, -1, 1, 1, -1),       // negative padding
      make_problem(2, 6, 5, 6, 9, 3, 1, 1, 1, 1),         // groups (Cg 2, Kg 3)
      make_problem(1, 5, 9, 48, 80, 2, 1, 1, 1, 1),       // groups (Cg 24, Kg 40)
      make_problem(1, 5, 5, 4, 8, 4, 1, 1, 1, 1),         // depthwise, multiplier 2
      make_problem(2, 6, 6, 48, 40, 1, 1, 1, 1, 1),       // the test suite's wide case
      make_problem(3, 9, 11, 20, 70, 1, 1, 1, 1, 1),      // two output-channel blocks
      make_problem(3, 13, 17, 37, 70, 1, 1, 2, 0, 1),     // odd sizes, partial channel steps
      make_problem(1, 1, 1, 2, 2, 1, 1, 1, 1, 1),         // 1x1 image
      make_problem(2, 2, 1, 3, 2, 1, 1, 1, 1, 1),         // 2x1 image
      make_problem(2, 0, 5, 3, 4, 1, 1, 1, 1, 1),         // empty image: dw = 0
      make_problem(1, 1, 4, 3, 2, 1, 0, 0, 0, 0),         // empty dy: dx = 0
      make_problem(2, 12, 12, 128, 192, 2, 1, 1, 1, 1),   // groups, several blocks
      make_problem(2, 14, 14, 256, 256, 1, 1, 1, 1, 1),   // deep channels
      make_problem(8, 56, 56, 64, 64, 1, 1, 1, 1, 1),     // bwd_filter split into 3
  };
  for (const Problem& p : grid)
    for (const CudaAlgorithm* alg : algs)
      for (Direction d : dirs)
        for (const Pair& t : dtypes) check_case(*alg, p, d, t.in, t.out, 0);

  // ResNet-50 3x3 stride-1 layers, N = 64, float32: checked, then timed when benchmarking.
  const Problem resnet[] = {make_problem(64, 56, 56, 64, 64, 1, 1, 1, 1, 1),
                            make_problem(64, 28, 28, 128, 128, 1, 1, 1, 1, 1),
                            make_problem(64, 14, 14, 256, 256, 1, 1, 1, 1, 1),
                            make_problem(64, 7, 7, 512, 512, 1, 1, 1, 1, 1)};
  for (const Problem& p : resnet)
    for (const CudaAlgorithm* alg : algs)
      for (Direction d : dirs) check_case(*alg, p, d, DType::kF32, DType::kF32, bench ? 20 : 0);

  std::printf("\nlargest relative L2 error per algorithm, direction and dtypes:\n");
  for (const auto& [what, err] : g_max_err)
    std::printf("  %-46s %.2e%s\n", what.c_str(), err,
                err > 1e-5 && what.find("->float32") != std::string::npos
                    ? "  (above the test suite's float32 1e-5)"
                    : "");
  if (g_failures) {
    std::printf("FAILURES: %d\n", g_failures);
    return 1;
  }
  std::printf("ALL OK\n");
  return 0;
}
