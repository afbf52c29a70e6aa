// Standalone check and benchmark of the depthwise conv algorithm against the direct GPU oracle
// (kCudaDirect). Build and run from the repository root:
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -I. dev/drivers/depthwise_check.cu \
//     cc/conv/cuda_depthwise.cu cc/conv/cuda_direct.cu -o /tmp/depthwise_check \
//     && /tmp/depthwise_check            # --no-bench: checks only; --bench-only: timings only
//
// For every problem of the grid, dtype pair and direction: run direct and depthwise on the same
// random inputs, depthwise twice with its output and workspace poisoned (0xFF bytes, NaN) before
// each call; require no NaN, a relative L2 error within the result dtype's tolerance (float64
// 1e-10, float32 1e-5, 16-bit 1e-2) and bitwise equal runs (the algorithm is declared
// deterministic). Then check and time the two benchmark shapes (N=64, NHWC: 56x56x144 3x3 pad 1
// and 56x56x96 7x7 pad 3, groups = C) in bfloat16 and float32 with CUDA events, printing
// TFLOP/s = 2*macs/time, GB/s of the operands and result, direct's time, and the ratio to the
// XLA/cuDNN numbers measured on the H200 (target: 1.5x). One line per case, the largest errors,
// and "ALL OK" or "FAILURES: n" (exit code 1).

#include <cuda_runtime.h>

#include <algorithm>
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
extern const CudaAlgorithm kCudaDepthwise;
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
std::map<std::string, double> g_max_err;  // "dir in->out" -> largest error seen

// A depthwise problem: x (N, D, H, W, C), w (1, R, S, 1, C*Kg), groups = C; pads per side.
struct Shape {
  const char* name;
  int64_t N, H, W, C, Kg, R, S;
  int64_t sh = 1, sw = 1, pad_t = 0, pad_b = 0, pad_l = 0, pad_r = 0, dh = 1, dw = 1, D = 1;
};

Problem make_problem(const Shape& s) {
  Problem p;
  p.N = s.N, p.C = s.C, p.K = s.C * s.Kg, p.G = s.C;
  const int64_t in[3] = {s.D, s.H, s.W}, f[3] = {1, s.R, s.S}, st[3] = {1, s.sh, s.sw};
  const int64_t lo[3] = {0, s.pad_t, s.pad_l}, hi[3] = {0, s.pad_b, s.pad_r};
  const int64_t dil[3] = {1, s.dh, s.dw};
  for (int a = 0; a < 3; ++a) {
    p.in[a] = in[a], p.filt[a] = f[a], p.stride[a] = st[a];
    p.pad_lo[a] = lo[a], p.pad_hi[a] = hi[a], p.rhs_dil[a] = dil[a];
    p.out[a] = out_size(in[a], f[a], st[a], lo[a], hi[a], 1, dil[a]);
  }
  return p;
}

std::string describe(const Problem& p) {
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "N%lld %s%lldx%lld C%lld K%lld %lldx%lld s(%lld,%lld) pad(%lld,%lld)(%lld,%lld) "
                "dil(%lld,%lld)",
                (long long)p.N, p.in[0] > 1 ? ("D" + std::to_string(p.in[0]) + " ").c_str() : "",
                (long long)p.in[1], (long long)p.in[2], (long long)p.C, (long long)p.K,
                (long long)p.filt[1], (long long)p.filt[2], (long long)p.stride[1],
                (long long)p.stride[2], (long long)p.pad_lo[1], (long long)p.pad_hi[1],
                (long long)p.pad_lo[2], (long long)p.pad_hi[2], (long long)p.rhs_dil[1],
                (long long)p.rhs_dil[2]);
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
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = u(rng);
  std::vector<unsigned char> bytes;
  encode(t, v, bytes);
  DeviceBuf d(bytes.size());
  if (!bytes.empty())
    CHECK_CUDA(cudaMemcpy(d.ptr, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
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

// Bytes of the two operands and the result of a direction.
double bytes_moved(const Args& a) {
  const double ib = dtype_bytes(a.in), ob = dtype_bytes(a.out);
  const double x = double(a.p.x_elems()), w = double(a.p.w_elems()), y = double(a.p.y_elems());
  switch (a.dir) {
    case Direction::kFwd: return (x + w) * ib + y * ob;
    case Direction::kBwdData: return (y + w) * ib + x * ob;
    case Direction::kBwdFilter: return (x + y) * ib + w * ob;
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
  CHECK_CUDA(cudaGetLastError());
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms * 1e-3 / iters;
}

double tolerance(DType out) {
  return out == DType::kF64 ? 1e-10 : out == DType::kF32 ? 1e-5 : 1e-2;
}

// Checks one (problem, direction, dtypes) case; with `bench_iters` > 0 also times it against
// direct and, when xla_tflops > 0, against XLA's number.
void check_case(const Problem& p, Direction dir, DType in, DType out, int bench_iters = 0,
                double xla_tflops = 0) {
  const CudaAlgorithm& alg = kCudaDepthwise;
  Args a;
  a.dir = dir, a.p = p, a.in = in, a.out = out;
  const std::string what =
      std::string(direction_name(dir)) + " " + dtype_name(in) + "->" + dtype_name(out);
  if (Status v = validate(p); !v.ok()) {
    std::printf("%-28s %-62s INVALID PROBLEM: %s\n", what.c_str(), describe(p).c_str(),
                v.message.c_str());
    ++g_failures;
    return;
  }
  const Support sup = alg.supports(a);
  if (!sup.ok) {
    std::printf("%-28s %-62s UNSUPPORTED: %s\n", what.c_str(), describe(p).c_str(),
                sup.reason.c_str());
    ++g_failures;  // every problem of the grid is one the algorithm claims
    return;
  }
  const int64_t n = result_elems(a);
  if (n == 0) {
    std::printf("%-28s %-62s empty result\n", what.c_str(), describe(p).c_str());
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
  std::printf("%-28s %-62s ws %9lld B  rel_l2 %.2e%s%s  %s\n", what.c_str(), describe(p).c_str(),
              (long long)ws.bytes, err, nans ? (" NaN x" + std::to_string(nans)).c_str() : "",
              same ? "" : " NOT-REPRODUCIBLE", ok ? "ok" : "FAIL");

  if (bench_iters > 0) {
    DeviceBuf res2(size_t(n) * dtype_bytes(out));
    Buffers b = bufs;
    b.result = res2.ptr;
    const double t = time_runs(alg, a, b, ws.ptr, bench_iters);
    const double t_dir = time_runs(kCudaDirect, a, b, nullptr, 2);
    const double flops = 2 * p.macs();
    const double tf = flops / t * 1e-12;
    std::printf("  BENCH %-26s %8.1f us %6.2f TFLOP/s %7.0f GB/s | direct %9.1f us | XLA %5.1f "
                "TFLOP/s -> %.2fx (target 1.5x)%s\n",
                what.c_str(), t * 1e6, tf, bytes_moved(a) / t * 1e-9, t_dir * 1e6, xla_tflops,
                tf / xla_tflops, tf >= 1.5 * xla_tflops ? "" : "  BELOW TARGET");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool bench = !(argc > 1 && std::strcmp(argv[1], "--no-bench") == 0);
  const bool checks = !(argc > 1 && std::strcmp(argv[1], "--bench-only") == 0);
  const Direction dirs[] = {Direction::kFwd, Direction::kBwdData, Direction::kBwdFilter};
  struct Pair { DType in, out; };
  const Pair dtypes[] = {{DType::kF32, DType::kF32},  {DType::kF16, DType::kF16},
                         {DType::kBF16, DType::kBF16}, {DType::kF16, DType::kF32},
                         {DType::kBF16, DType::kF32},  {DType::kF64, DType::kF64}};
  //  name                   N   H   W    C  Kg  R   S  sh sw  pads t,b,l,r   dh dw  D
  const Shape grid[] = {
      {"3x3 c5",              3, 13, 17,   5, 1, 3,  3, 1, 1,  1, 1, 1, 1},
      {"3x3 c24 mult2",       3, 13, 17,  24, 2, 3,  3, 1, 1,  1, 1, 1, 1},
      {"3x3 c144 s2 asym",    3, 13, 17, 144, 1, 3,  3, 2, 2,  1, 0, 0, 1},
      {"3x3 c24 dil2",        2, 13, 17,  24, 1, 3,  3, 1, 1,  2, 2, 2, 2,  2, 2},
      {"3x3 c5 s2 mult2",     3, 13, 17,   5, 2, 3,  3, 2, 2,  1, 1, 1, 1},
      {"5x5 c8 s2",           2, 11, 13,   8, 1, 5,  5, 2, 2,  2, 1, 2, 2},
      {"5x5 c4 mult2",        1,  6,  6,   4, 2, 5,  5, 1, 1,  2, 2, 2, 2},
      {"7x7 c16",             1, 12, 19,  16, 1, 7,  7, 1, 1,  3, 3, 3, 3},
      {"7x7 c96 tall",        1, 40,  9,  96, 1, 7,  7, 1, 1,  3, 3, 3, 3},
      {"7x7 c16 s2",          1, 15, 15,  16, 1, 7,  7, 2, 2,  3, 3, 3, 3},
      {"7x7 c16 s2 mult2",    2, 15, 14,  16, 2, 7,  7, 2, 2,  3, 3, 3, 3},
      {"9x9 c8",              1, 12, 12,   8, 1, 9,  9, 1, 1,  4, 4, 4, 4},
      {"4x2 c6 asym",         2,  8,  9,   6, 1, 4,  2, 1, 1,  2, 0, 0, 3},
      {"3x3 c3 negative pad", 2,  8,  9,   3, 1, 3,  3, 1, 2, -1, 1, 1, -2},
      {"3x2 c5 s(3,2) mult3", 1, 10, 12,   5, 3, 3,  2, 3, 2,  1, 2, 0, 1,  2, 1},
      {"oversized pad",       1,  3,  4,   2, 1, 2,  2, 1, 1,  4, 5, 3, 3},
      {"1x1 c9",              2,  5,  6,   9, 1, 1,  1, 1, 1,  0, 0, 0, 0},
      {"1-D k5 s2 dil2",      3,  1, 17,   4, 1, 1,  5, 1, 2,  0, 0, 3, 1,  1, 2},
      {"1-D k31 c8",          2,  1, 40,   8, 1, 1, 31, 1, 1,  0, 0, 15, 15},
      {"1-D k3 c7 mult2",     2,  1, 23,   7, 2, 1,  3, 1, 1,  0, 0, 1, 1},
      {"3-D planes",          1,  6,  7,   4, 1, 3,  3, 1, 1,  1, 1, 1, 1,  1, 1, 3},
      {"empty image",         2,  0,  5,   3, 1, 3,  3, 1, 1,  0, 0, 0, 0},
      {"empty image padded",  1,  0,  4,   2, 1, 1,  3, 1, 1,  1, 1, 1, 1},
      {"empty dy",            1,  1,  4,   3, 1, 3,  3, 1, 1,  0, 0, 0, 0},
      {"56x56 c144 N2",       2, 56, 56, 144, 1, 3,  3, 1, 1,  1, 1, 1, 1},
      {"28x28 c192 s2 N2",    2, 28, 28, 192, 1, 3,  3, 2, 2,  0, 1, 0, 1},
      {"56x56 c96 7x7 N2",    2, 56, 56,  96, 1, 7,  7, 1, 1,  3, 3, 3, 3},
      {"32x32 c64 5x5 N2",    2, 32, 32,  64, 1, 5,  5, 1, 1,  2, 2, 2, 2},
  };
  if (checks)
    for (const Shape& s : grid)
      for (Direction d : dirs)
        for (const Pair& t : dtypes) check_case(make_problem(s), d, t.in, t.out);

  // The benchmark shapes, N = 64, checked and (unless --no-bench) timed. XLA/cuDNN TFLOP/s
  // on the H200 per direction: bfloat16, then float32.
  struct Bench {
    Shape s;
    double xla_bf16[3], xla_f32[3];
  };
  const Bench benches[] = {
      {{"(a) 56x56x144 3x3", 64, 56, 56, 144, 1, 3, 3, 1, 1, 1, 1, 1, 1}, {5.3, 7.0, 4.5},
       {4.4, 5.3, 4.2}},
      {{"(b) 56x56x96 7x7", 64, 56, 56, 96, 1, 7, 7, 1, 1, 3, 3, 3, 3}, {9.0, 26.2, 10.5},
       {4.2, 16.8, 0.3}},
  };
  for (const Bench& b : benches) {
    std::printf("\n%s\n", b.s.name);
    for (int d = 0; d < 3; ++d) {
      check_case(make_problem(b.s), dirs[d], DType::kBF16, DType::kBF16, bench ? 20 : 0,
                 b.xla_bf16[d]);
      check_case(make_problem(b.s), dirs[d], DType::kF32, DType::kF32, bench ? 20 : 0,
                 b.xla_f32[d]);
    }
  }

  std::printf("\nlargest relative L2 error per direction and dtypes:\n");
  for (const auto& [what, err] : g_max_err) std::printf("  %-28s %.2e\n", what.c_str(), err);
  if (g_failures) {
    std::printf("FAILURES: %d\n", g_failures);
    return 1;
  }
  std::printf("ALL OK\n");
  return 0;
}
