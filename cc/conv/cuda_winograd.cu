// winograd: fused Winograd F(2x2,3x3) for 3x3 stride-1 convolutions, fwd and bwd_data.
//
// Two kernels (cuda_winograd.cuh has the transforms and the bwd_data-as-forward geometry):
//   1. filter_transform_kernel  U[16][G][Cgp][Kgp] = G f G^T into the workspace (for bwd_data
//      f is w flipped in r and s with the channel roles swapped), zero-padded to Cgp = Cg
//      rounded up to 8 and Kgp = Kg rounded up to 64.
//   2. winograd_f2_kernel: one CTA per (32 output tiles of 2x2) x (64 output channels of one
//      group); it loops over the group's input channels in steps of 8:
//        load    each thread reads one 4x4 input patch (one tile, one channel; zero outside
//                the image) into registers and transforms it, B^T d B, into smem
//                V (16, 8, 32); the step's U (16, 8, 64) arrives by cp.async;
//        multiply 16 independent (32 x 8) @ (8 x 64) products accumulate in registers: the
//                thread grid is 16 xi x (4 x 4), each thread owning one xi and an 8 x 16
//                (tiles x channels) block, so one k of the product is 6 LDS.128 + 128 FFMA;
//      double-buffered: the next step's global loads are in flight during the multiply, one
//      __syncthreads per step. The epilogue passes the 16 x 32 x 64 accumulators through smem
//      in four 16-channel slices; each thread then gathers the 16 xi of a (tile, channel),
//      applies A^T m A and writes the 2x2 outputs (clipped to the image).
//
// Tiles: CTA (32 tiles, 64 channels) x 8-channel steps, 256 threads, 1 CTA / SM (128 float
// accumulators per thread; 104 KB of smem: V 2 x (16, 8, 36+pad), U 2 x (16, 8, 64+pad)).
// Work: 16 * tiles * Kg * Cg FMAs per group against 36 * P * Q * Kg * Cg for direct (2.25x
// fewer; tiles = N * ceil(P/2) * ceil(Q/2)); per step a CTA loads 32*8 patches of 16 values
// (cached, each input element is read by 4 overlapping patches) and 16*8*64 floats of U (L2
// resident: 16*C*K*4 bytes, 0.25 .. 16 MB on ResNet-50), i.e. ~13 FMAs per smem byte.
//
// Performance (H200, float32, N=64, ResNet-50 3x3 layers): the main loop is FFMA-bound (74% of
// its instructions are FFMA; the rest loads, transforms and addresses). At ~63% of the 67
// TFLOP/s FMA peak: 56x56, 28x28 and 14x14 are 3.3 G FMA each, ~156 us, ~95 effective TFLOP/s
// (2*N*P*Q*K*C*9 / time); 7x7 is 4.3 G FMA (4x4 tiles of 2x2 cover 8x8: 31% waste), ~205 us,
// ~72. Measured (H200, float32): 32 / 42 / 46 / 42 at 56 / 28 / 14 / 7, 35-50% of the
// prediction; winograd_nonfused beats it on every layer (benchmarks/results/conv_gpu-*).
// Numerics: transforms and accumulation in float32 (float16/bfloat16 converted on load); the
// filter transform in double. Deterministic: fixed summation order, no atomics. The transforms
// mix a tile's values: one inf or NaN operand makes NaN or inf across its tile (conv.h).

#include <cuda_pipeline.h>

#include <type_traits>

#include "cc/conv/cuda_algorithms.h"
#include "cc/conv/cuda_winograd.cuh"

namespace jaxdnn::conv {
namespace {

using cuda::device_t;
using winograd::Geom;
using W2 = winograd::Winograd<2>;

constexpr int kXi = 16;          // 4x4 transformed positions
constexpr int kTiles = 32;       // output tiles per CTA
constexpr int kOutCh = 64;       // output channels per CTA
constexpr int kInCh = 8;         // input channels per main-loop step
constexpr int kThreads = 256;
constexpr int kVRow = kTiles + 4;             // V row (one xi, one channel): conflict-free stores
constexpr int kVXi = kInCh * kVRow + 16;      // +16: a warp's two xi on different banks
constexpr int kUXi = kInCh * kOutCh + 16;
constexpr int kMRow = 16 + 4;                 // epilogue slice: (xi, tile) rows of 16 channels
constexpr int kMXi = kTiles * kMRow + 4;

struct Smem {
  float v[2][kXi * kVXi];  // (buf, xi, channel, tile): B^T d B
  float u[2][kXi * kUXi];  // (buf, xi, channel, out channel): G g G^T
};
constexpr int kSmemBytes = int(sizeof(Smem));
static_assert(kXi * kMXi * int(sizeof(float)) <= kSmemBytes, "epilogue slice fits");

struct Plan {
  Geom g;
  int64_t cgp, kgp;  // padded channel block of U
  int64_t ws_floats() const { return kXi * g.G * cgp * kgp; }
};

Plan plan_of(const Args& a) {
  Plan pl;
  pl.g = winograd::geom_of<2>(a.p, a.dir);
  pl.cgp = winograd::round_up(pl.g.Cg, kInCh);
  pl.kgp = winograd::round_up(pl.g.Kg, kOutCh);
  return pl;
}

template <typename In, typename Out>
__global__ void __launch_bounds__(kThreads, 1)
winograd_f2_kernel(Geom g, const In* __restrict__ in, const float* __restrict__ u_ws,
                   Out* __restrict__ out, int64_t cgp, int64_t kgp) {
  extern __shared__ float4 smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x;
  const int64_t kblocks = kgp / kOutCh;
  const int64_t grp = blockIdx.y / kblocks, k0 = blockIdx.y % kblocks * kOutCh;
  const int64_t t0 = int64_t(blockIdx.x) * kTiles;
  const int64_t steps = cgp / kInCh;

  // Load role: tile tt, channel tc of each step.
  const int tt = tid / kInCh, tc = tid % kInCh;
  const winograd::PatchReader<2> patch(g, t0 + tt, grp);
  // Multiply role: one xi; tiles {16*i + 4*tm + e}, channels {16*j + 4*tn + e} (e < 4).
  const int xi = tid / 16, tm = tid / 4 % 4, tn = tid % 4;

  // The step's U block (16, 8, 64): 2048 16-byte chunks, 8 per thread: chunk tid + 256*i is
  // column cu of row (xi, c) = (tid / 128 + 2*i, cu_row) of the block.
  const int cu = tid % 16 * 4, cu_row = tid / 16 % kInCh, cu_xi = tid / 128;
  const int64_t u_xi_stride = g.G * cgp * kgp;
  const float* u_src = u_ws + cu_xi * u_xi_stride + (grp * cgp + cu_row) * kgp + k0 + cu;
  auto copy_u = [&](int64_t step, int buf) {
    const float* src = u_src + step * kInCh * kgp;
    float* dst = &sm.u[buf][cu_xi * kUXi + cu_row * kOutCh + cu];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      __pipeline_memcpy_async(dst + 2 * i * kUXi, src + 2 * i * u_xi_stride, 16);
    __pipeline_commit();
  };
  auto store_v = [&](const float (&d)[4][4], int buf) {
    float v[4][4];
    winograd::sandwich<W2::Bt>(d, v);
#pragma unroll
    for (int x = 0; x < kXi; ++x) sm.v[buf][x * kVXi + tc * kVRow + tt] = v[x / 4][x % 4];
  };

  float acc[8][16] = {};  // (tiles, channels) of this thread's xi
  float d[4][4];
  if (steps > 0) {
    copy_u(0, 0);
    patch.read(in, tc, tc < g.Cg, d);
    store_v(d, 0);
    __pipeline_wait_prior(0);
  }
  __syncthreads();
  for (int64_t s = 0; s < steps; ++s) {
    // The next step's loads are in flight during this step's products (on the last step, the
    // last step again, into the idle buffer: branch-free, so the loads are issued early).
    const int buf = int(s & 1);
    const int64_t next = s + 1 < steps ? s + 1 : s, c_next = next * kInCh + tc;
    copy_u(next, buf ^ 1);
    patch.read(in, c_next, c_next < g.Cg, d);
    const float* vb = &sm.v[buf][xi * kVXi + tm * 4];
    const float* ub = &sm.u[buf][xi * kUXi + tn * 4];
#pragma unroll
    for (int c = 0; c < kInCh; ++c) {
      float a[8], b[16];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        *reinterpret_cast<float4*>(&a[4 * i]) =
            *reinterpret_cast<const float4*>(vb + c * kVRow + 16 * i);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        *reinterpret_cast<float4*>(&b[4 * j]) =
            *reinterpret_cast<const float4*>(ub + c * kOutCh + 16 * j);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    store_v(d, buf ^ 1);
    __pipeline_wait_prior(0);
    __syncthreads();
  }

  // Epilogue, per 16-channel slice q: (xi, tile, channel) through smem, then A^T m A.
  float* ms = reinterpret_cast<float*>(smem_raw);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int tile = i / 4 * 16 + tm * 4 + i % 4;
      *reinterpret_cast<float4*>(&ms[xi * kMXi + tile * kMRow + tn * 4]) =
          make_float4(acc[i][4 * q], acc[i][4 * q + 1], acc[i][4 * q + 2], acc[i][4 * q + 3]);
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = tid + kThreads * h, kl = e % 16, tl = e / 16;
      const int64_t k = k0 + q * 16 + kl;
      float m[4][4], y[2][2];
#pragma unroll
      for (int x = 0; x < kXi; ++x) m[x / 4][x % 4] = ms[x * kMXi + tl * kMRow + kl];
      winograd::sandwich<W2::At>(m, y);
      if (k < g.Kg) winograd::write_tile<2>(out, g, t0 + tl, grp, k, y);
    }
    __syncthreads();
  }
}

Support supports(const Args& a) {
  Support s = winograd::support_3x3(a);
  if (!s.ok) return s;
  if (a.dir == Direction::kBwdFilter)
    return Support::No("fused winograd has no bwd_filter (winograd_nonfused has)");
  const Plan pl = plan_of(a);
  if (pl.g.G * (pl.kgp / kOutCh) > 65535) return Support::No("too many groups");
  return Support::Yes();
}

int64_t workspace_bytes(const Args& a) {
  return plan_of(a).ws_floats() * int64_t(sizeof(float));
}

template <typename In, typename Out>
Status run_typed(const Plan& pl, const void* in, const void* w, void* out, float* u,
                 cudaStream_t stream) {
  const Geom& g = pl.g;
  const int64_t tile_blocks = winograd::ceil_div(g.tiles(), kTiles);
  if (tile_blocks == 0) return Status::Ok();
  Status st = winograd::transform_filter<2, In>(g, w, u, pl.cgp, pl.kgp, stream,
                                                "conv winograd filter_transform_kernel");
  if (!st.ok()) return st;
  auto kernel = winograd_f2_kernel<In, Out>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
      cudaSuccess)
    return cuda::check_launch("conv winograd winograd_f2_kernel (shared memory size)");
  const dim3 grid(unsigned(tile_blocks), unsigned(g.G * (pl.kgp / kOutCh)));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(g, static_cast<const In*>(in), u,
                                                 static_cast<Out*>(out), pl.cgp, pl.kgp);
  return cuda::check_launch("conv winograd winograd_f2_kernel");
}

Status run(const Args& a, const Buffers& b, void* workspace, cudaStream_t stream) {
  const Plan pl = plan_of(a);
  const bool fwd = a.dir == Direction::kFwd;
  Status status;
  const bool ok = dispatch_io(a.in, a.out, [&](auto in_tag, auto out_tag) {
    using In = device_t<decltype(in_tag)>;
    using Out = device_t<decltype(out_tag)>;
    if constexpr (std::is_same_v<In, double>) {
      status = Status::Error("conv winograd: float64: use direct");
    } else {
      status = run_typed<In, Out>(pl, fwd ? b.x : b.y, b.w, b.result,
                                  static_cast<float*>(workspace), stream);
    }
  });
  if (!ok)
    return Status::Error(std::string("conv winograd: unsupported dtypes ") + dtype_name(a.in) +
                         " -> " + dtype_name(a.out));
  return status;
}

}  // namespace

const CudaAlgorithm kCudaWinograd = {"winograd", /*deterministic=*/true, /*tensor_cores=*/false,
                                     supports, workspace_bytes, run};

}  // namespace jaxdnn::conv
