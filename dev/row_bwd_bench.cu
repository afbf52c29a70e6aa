// Kernel-level check and timing of the norm row backward (layer/RMS norm, cc/norm/cuda_row.cu):
// for each (rows, K) given, float32 or bfloat16, training (random d(mean), d(var) cotangents):
//   - dx, d(scale), d(bias) of the library's cuda_backward against a float64 host reference
//     (relative L2 errors; dx poisoned with NaN before the run), and d(scale) bitwise equal
//     over two runs;
//   - CUDA-event medians (dev/event_timing.cuh) of the whole backward (the row kernel and the
//     partials' reduction), of row_backward alone, and of a flat grid that reads two arrays
//     and writes one, the same bytes (the traffic's own roofline).
// The row kernel is this tree's (the file includes cuda_row.cu), so two builds, one from an
// older tree, give a same-call A/B:
//   F="-std=c++17 -O3 --expt-relaxed-constexpr -I. -arch=sm_90"
//   nvcc $F -o /tmp/rbb dev/row_bwd_bench.cu cc/norm/cuda_norm.cu cc/norm/cuda_column.cu \
//     cc/norm/cuda_segment.cu
//   /tmp/rbb bf16 32768x4096 [rms] [more shapes...]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cc/norm/cuda_norm.h"
#include "cc/norm/cuda_row.cu"
#include "dev/event_timing.cuh"

using namespace jaxdnn::norm;
using namespace jaxdnn::norm::cuda_impl;

// out = a ^ b over 16-byte packs, one per thread: two reads and a write, no arithmetic.
__global__ void read2_write1_kernel(const uint4* a, const uint4* b, uint4* out, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) {
    const uint4 u = a[i], v = b[i];
    out[i] = uint4{u.x ^ v.x, u.y ^ v.y, u.z ^ v.z, u.w ^ v.w};
  }
}

float to_f(float v) { return v; }
float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename D> D from_f(float v);
template <> float from_f<float>(float v) { return v; }
template <> __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

double rel_l2(const std::vector<double>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(got[i]) - ref[i];
    num += std::isfinite(d) ? d * d : INFINITY;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

template <typename D>
bool run(const char* name, int64_t R, int64_t K, bool centered) {
  const int64_t n = R * K;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  std::vector<D> x(n), dy(n);
  std::vector<float> scale(K), mean(R), var(R), dmean(R), dvar(R);
  for (int64_t i = 0; i < n; ++i) x[i] = from_f<D>(3.0f + nd(rng)), dy[i] = from_f<D>(nd(rng));
  for (auto& v : scale) v = ud(rng);
  for (int64_t r = 0; r < R; ++r) {
    double s = 0, q = 0;
    for (int64_t k = 0; k < K; ++k) s += to_f(x[r * K + k]);
    const double m = centered ? s / K : 0;
    for (int64_t k = 0; k < K; ++k) q += (to_f(x[r * K + k]) - m) * (to_f(x[r * K + k]) - m);
    mean[r] = float(m), var[r] = float(q / K);
    dmean[r] = centered ? 1e-3f * nd(rng) : 0.0f, dvar[r] = 1e-3f * nd(rng);
  }
  // float64 reference from the float32 statistics the kernel reads.
  const double eps = 1e-5;
  std::vector<double> rdx(n), rdg(K, 0), rdb(K, 0);
  for (int64_t r = 0; r < R; ++r) {
    const double m = mean[r], rs = 1 / std::sqrt(double(var[r]) + eps);
    double sg = 0, sgx = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double g = scale[k] * double(to_f(dy[r * K + k]));
      sg += g, sgx += g * (to_f(x[r * K + k]) - m) * rs;
    }
    for (int64_t k = 0; k < K; ++k) {
      const double xc = to_f(x[r * K + k]) - m, d = to_f(dy[r * K + k]);
      rdx[r * K + k] = rs * (scale[k] * d - (centered ? sg / K : 0) - xc * rs * sgx / K) +
                       dmean[r] / K + 2 * dvar[r] * xc / K;
      rdg[k] += d * xc * rs, rdb[k] += d;
    }
  }
  Problem p;
  p.s = Shape{R, 1, 1, K, 1, 1};
  p.dtype = sizeof(D) == 4 ? jaxdnn::DType::kF32 : jaxdnn::DType::kBF16;
  p.centered = centered;
  p.eps = eps;
  const int64_t ws_bytes = bwd_workspace_bytes(p.s, p.dtype);
  D *dx_, *x_, *dy_;
  float *scale_, *mean_, *var_, *dmean_, *dvar_, *dg_, *db_;
  void* ws_;
  CK_(cudaMalloc(&x_, n * sizeof(D)));
  CK_(cudaMalloc(&dy_, n * sizeof(D)));
  CK_(cudaMalloc(&dx_, n * sizeof(D)));
  for (float** f : {&scale_, &dg_, &db_}) CK_(cudaMalloc(f, K * 4));
  for (float** f : {&mean_, &var_, &dmean_, &dvar_}) CK_(cudaMalloc(f, R * 4));
  CK_(cudaMalloc(&ws_, ws_bytes));
  CK_(cudaMemcpy(x_, x.data(), n * sizeof(D), cudaMemcpyHostToDevice));
  CK_(cudaMemcpy(dy_, dy.data(), n * sizeof(D), cudaMemcpyHostToDevice));
  CK_(cudaMemcpy(scale_, scale.data(), K * 4, cudaMemcpyHostToDevice));
  CK_(cudaMemcpy(mean_, mean.data(), R * 4, cudaMemcpyHostToDevice));
  CK_(cudaMemcpy(var_, var.data(), R * 4, cudaMemcpyHostToDevice));
  CK_(cudaMemcpy(dmean_, dmean.data(), R * 4, cudaMemcpyHostToDevice));
  CK_(cudaMemcpy(dvar_, dvar.data(), R * 4, cudaMemcpyHostToDevice));
  CK_(cudaMemset(dx_, 0xff, n * sizeof(D)));  // NaN
  BwdBuffers b;
  b.training = true;
  b.dy = dy_, b.dmean = dmean_, b.dvar = dvar_, b.x = x_, b.scale = scale_, b.mean = mean_;
  b.var = var_, b.dx = dx_, b.dscale = dg_, b.dbias = db_, b.ws = ws_;
  const auto backward = [&] {
    const jaxdnn::Status s = cuda_backward(p, b, 0);
    if (!s.ok()) std::printf("cuda_backward: %s\n", s.message.c_str()), std::exit(1);
  };
  backward();
  CK_(cudaDeviceSynchronize());
  std::vector<D> hdx(n);
  std::vector<float> gdx(n), gdg(K), gdb(K), gdg2(K);
  CK_(cudaMemcpy(hdx.data(), dx_, n * sizeof(D), cudaMemcpyDeviceToHost));
  CK_(cudaMemcpy(gdg.data(), dg_, K * 4, cudaMemcpyDeviceToHost));
  CK_(cudaMemcpy(gdb.data(), db_, K * 4, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < n; ++i) gdx[i] = to_f(hdx[i]);
  backward();
  CK_(cudaMemcpy(gdg2.data(), dg_, K * 4, cudaMemcpyDeviceToHost));
  const bool same = std::memcmp(gdg.data(), gdg2.data(), K * 4) == 0;
  const double edx = rel_l2(rdx, gdx), edg = rel_l2(rdg, gdg), edb = rel_l2(rdb, gdb);
  const double tol_dx = sizeof(D) == 4 ? 1e-5 : 6e-3;
  const bool ok = edx < tol_dx && edg < 1e-4 && edb < 1e-4 && same;
  // Timings.
  const Bwd<D> v{p.s,   centered, 1e-5f, dy_, x_,
                 scale_, mean_,   var_,  dx_, GradCoef<float>{true, centered, dmean_, dvar_,
                                                                nullptr, nullptr},
                 static_cast<float*>(ws_), static_cast<float*>(ws_) + bwd_partials(p.s),
                 nullptr};
  int64_t slices = 0;
  const float t_all = median_us(backward);
  const float t_row = median_us([&] {
    const jaxdnn::Status s = row_backward(v, &slices, 0);
    if (!s.ok()) std::printf("row_backward: %s\n", s.message.c_str()), std::exit(1);
  });
  const int64_t packs = n * int64_t(sizeof(D)) / 16;
  const float t_copy = median_us([&] {
    read2_write1_kernel<<<unsigned((packs + 255) / 256), 256>>>(
        reinterpret_cast<const uint4*>(x_), reinterpret_cast<const uint4*>(dy_),
        reinterpret_cast<uint4*>(dx_), packs);
  });
  const double bytes = 3.0 * n * sizeof(D);
  std::printf("%-5s %s %6lldx%-6lld slices %4lld | all %7.1f us %5.2f TB/s | row %7.1f us %5.2f "
              "TB/s | r2w1 %7.1f us %5.2f TB/s | err dx %.2e dg %.2e db %.2e det %d %s\n",
              name, centered ? "layer" : "rms  ", (long long)R, (long long)K, (long long)slices,
              t_all, bytes / t_all * 1e-6, t_row, bytes / t_row * 1e-6, t_copy,
              bytes / t_copy * 1e-6, edx, edg, edb, int(same), ok ? "ok" : "FAIL");
  for (void* q : {(void*)x_, (void*)dy_, (void*)dx_, (void*)scale_, (void*)dg_, (void*)db_,
                  (void*)mean_, (void*)var_, (void*)dmean_, (void*)dvar_, ws_})
    CK_(cudaFree(q));
  return ok;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::printf("usage: %s f32|bf16 RxK [rms] [RxK [rms]]...\n", argv[0]);
    return 2;
  }
  const bool bf = !std::strcmp(argv[1], "bf16");
  bool ok = true;
  for (int i = 2; i < argc; ++i) {
    long long R, K;
    if (std::sscanf(argv[i], "%lldx%lld", &R, &K) != 2) continue;
    const bool rms = i + 1 < argc && !std::strcmp(argv[i + 1], "rms");
    ok &= bf ? run<__nv_bfloat16>("bf16", R, K, !rms) : run<float>("f32", R, K, !rms);
  }
  return ok ? 0 : 1;
}
