// winograd_nonfused: Winograd F(4x4,3x3) for 3x3 stride-1 convolutions with the transformed
// operands in the workspace, all three directions (cuda_winograd.cuh has the transforms and
// the bwd_data-as-forward geometry). Per group, with T = N * ceil(P/4) * ceil(Q/4) tiles:
//
// fwd and bwd_data (bwd_data = forward conv of dy with the flipped, channel-swapped filter):
//   1. input_transform_kernel   V[36][G][Tp][Cgp] = B^T d B of each 6x6 input patch
//   2. filter_transform_kernel  U[36][G][Cgp][Kgp] = G f G^T                (in double)
//   3. gemm_kernel              M[xi] (Tp, Kgp) = V[xi] (Tp, Cgp) @ U[xi] (Cgp, Kgp), 36*G GEMMs
//   4. output_transform_kernel  y = A^T M A for each 4x4 output tile, clipped to (P, Q)
// bwd_filter (dW = G^T [sum_tiles V (.) E] G with E = A dy A^T, derivation in the header):
//   1. input_transform_kernel   V[36][G][Tp][Cgp] as above (the forward problem's tiles)
//   2. grad_transform_kernel    E[36][G][Tp][Kgp] = A dy A^T of each 4x4 tile of dy
//   3. gemm_kernel              S[split][xi] (Cgp, Kgp) = V[xi]^T @ E[xi] over the split's
//                               tiles: the reduction over N*P*Q is cut into `splits` slices
//                               so that 36*G*splits GEMMs fill the GPU
//   4. filter_grad_kernel       dw = G^T (sum over splits in a fixed order) G, in double
// Every buffer is zero-padded (tiles to Tp, channels to Cgp / Kgp) to whole GEMM tiles, so the
// GEMM has no bounds checks: fwd Tp = T rounded up to 64, Cgp = Cg to 16, Kgp = Kg to 64;
// bwd_filter Cgp, Kgp to 64 and Tp = splits * (T / splits rounded up to 16).
//
// GEMM: C (64, 64) per 128-thread CTA, k-steps of 16, double-buffered through registers; the
// A tile is stored k-major in smem ((16, 64+4): transposed on the way in when A is row-major,
// as in fwd), B row-major (16, 64+4). Each warp owns a (32, 32) block and each thread an
// (8, 4) micro-tile: per k, 3 LDS.128 (a warp reads 8 distinct float4 of A and 8 of B) and 32
// FFMA. Global traffic per CTA k-step: 2 x 4 KB for 64*64*16 FMAs (16 FMA / byte; V, U, M
// stream through L2).
//
// Work (fwd, per group): 36 * T * Cg * Kg GEMM FMAs (vs 9 * 16 * T * Cg * Kg for direct: 4x
// fewer, less the tile padding) plus transform passes that write and read V and M once each:
// bytes ~ 4 * 36 * T * (2*Cg + 2*Kg) + |x| + |y| (56x56 64->64, N = 64: T = 12544, V = M =
// 116 MB).
// Performance (H200, float32, N=64, pad 1), predicted from the GEMM at ~60% of the 67 TFLOP/s
// FMA peak and ~3.5 TB/s for the transform passes (effective TFLOP/s = 2*N*P*Q*K*C*9 / time):
//   56x56  64->64   GEMM 1.85 G FMA ~92 us + transforms 334 MB ~95 us   ~190 us  ~78 TFLOP/s
//   28x28 128->128  GEMM 1.85 G FMA ~92 us + transforms 167 MB ~48 us   ~140 us ~105
//   14x14 256->256  GEMM 2.42 G FMA ~121 us + 101 MB ~29 us             ~150 us  ~99
//    7x7  512->512  GEMM 2.42 G FMA ~121 us + 50 MB ~14 us              ~135 us ~110
// (the transforms' bytes are x + V read and written once, M + y likewise; at 14x14 and 7x7
// the 4x4 tiles cover 16x16 and 8x8, 31% padding).
// bwd_data is the same; bwd_filter adds the dy transform and, at 56x56, a 24-way split.
// Measured (H200, N=64, float32, TFLOP/s-equivalent): fwd 36 / 57 / 62 / 69 at 56 / 28 / 14 /
// 7, bwd_data 38-64, bwd_filter 25-57 (benchmarks/results/conv_gpu-*): below the prediction
// at 56x56, where the transforms' traffic dominates.
// Numerics: float32 transforms and accumulation (float16/bfloat16 converted on load; filter
// transforms in double); F(4x4) roughly triples float32 error over direct (~3e-6 relative L2
// at C = 512). Deterministic: fixed summation orders, no atomics. The transforms mix a tile's
// values: one inf or NaN operand makes NaN or inf across its tile (conv.h).

#include <algorithm>
#include <type_traits>

#include "cc/conv/cuda_algorithms.h"
#include "cc/conv/cuda_winograd.cuh"

namespace jaxdnn::conv {
namespace {

using cuda::device_t;
using winograd::ceil_div;
using winograd::Geom;
using winograd::round_up;
using W4 = winograd::Winograd<4>;

constexpr int kXi = 36;            // 6x6 transformed positions
constexpr int kThreads = 256;      // elementwise transform kernels
constexpr int kBM = 64, kBN = 64;  // GEMM CTA tile
constexpr int kBK = 16;            // GEMM k-step
constexpr int kGemmThreads = 128;
constexpr int kSRow = 64 + 4;      // padded smem row of a GEMM operand tile
constexpr int64_t kTargetCtas = 8 * 132;   // bwd_filter: GEMM CTAs to aim for (8 per SM)
constexpr int64_t kMinSplitTiles = 512;    // bwd_filter: fewest tiles per split

// ---- workspace plan ------------------------------------------------------------------------

struct Plan {
  Geom g;
  int64_t tp, cgp, kgp;  // padded tiles and channels
  int64_t splits;        // bwd_filter reduction slices (1 otherwise)
  // Buffer sizes in floats; the workspace holds V, then U (fwd, bwd_data) or E (bwd_filter),
  // then M or S.
  int64_t v_floats() const { return kXi * g.G * tp * cgp; }
  int64_t mid_floats(bool filter) const { return kXi * g.G * (filter ? tp : cgp) * kgp; }
  int64_t out_floats(bool filter) const {
    return kXi * g.G * (filter ? splits * cgp : tp) * kgp;
  }
};

Plan plan_of(const Args& a) {
  Plan pl;
  pl.g = winograd::geom_of<4>(a.p, a.dir == Direction::kBwdFilter ? Direction::kFwd : a.dir);
  pl.kgp = round_up(pl.g.Kg, kBN);
  if (a.dir == Direction::kBwdFilter) {
    pl.cgp = round_up(pl.g.Cg, kBM);
    const int64_t t = pl.g.tiles(), ctas = kXi * pl.g.G * (pl.cgp / kBM) * (pl.kgp / kBN);
    int64_t s = std::min(ceil_div(kTargetCtas, ctas), std::max<int64_t>(1, t / kMinSplitTiles));
    s = std::max<int64_t>(1, std::min(s, 65535 / (kXi * pl.g.G)));
    pl.splits = s;
    pl.tp = round_up(ceil_div(t, s), kBK) * s;
  } else {
    pl.cgp = round_up(pl.g.Cg, kBK);
    pl.tp = round_up(pl.g.tiles(), kBM);
    pl.splits = 1;
  }
  return pl;
}

// ---- transform kernels ---------------------------------------------------------------------

// The 36 xi values of one (tile, channel) of a transformed buffer: element xi lives at
// p[xi * plane], one (G, rows, cols) plane per xi.
__device__ __forceinline__ void scatter_xi(float* p, int64_t plane, const float (&r)[6][6]) {
#pragma unroll
  for (int xi = 0; xi < kXi; ++xi) p[xi * plane] = r[xi / 6][xi % 6];
}
template <typename T>
__device__ __forceinline__ void gather_xi(const float* p, int64_t plane, T (&r)[6][6]) {
#pragma unroll
  for (int xi = 0; xi < kXi; ++xi) r[xi / 6][xi % 6] = p[xi * plane];
}

// V[xi][grp][t][c] for t < tp, c < cgp (zero past the tiles and channels); c fastest.
template <typename In>
__global__ void input_transform_kernel(Geom g, const In* __restrict__ in, float* __restrict__ v,
                                       int64_t tp, int64_t cgp) {
  const int64_t total = tp * g.G * cgp;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e % cgp, grp = e / cgp % g.G, t = e / (cgp * g.G);
    float d[6][6], r[6][6];
    winograd::PatchReader<4>(g, t, grp).read(in, c, c < g.Cg, d);
    winograd::sandwich<W4::Bt>(d, r);
    scatter_xi(v + (grp * tp + t) * cgp + c, g.G * tp * cgp, r);
  }
}

// y = A^T M A for tile t < T, channel k < Kg of each group; k fastest.
template <typename Out>
__global__ void output_transform_kernel(Geom g, const float* __restrict__ m, Out* __restrict__ out,
                                        int64_t tp, int64_t kgp) {
  const int64_t total = g.tiles() * g.G * g.Kg;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % g.Kg, grp = e / g.Kg % g.G, t = e / (g.Kg * g.G);
    float s[6][6], y[4][4];
    gather_xi(m + (grp * tp + t) * kgp + k, g.G * tp * kgp, s);
    winograd::sandwich<W4::At>(s, y);
    winograd::write_tile<4>(out, g, t, grp, k, y);
  }
}

// E[xi][grp][t][k] = (A dy A^T)[xi] for t < tp, k < kgp (zero past the tiles and channels),
// dy the 4x4 output-gradient tile clipped to (P, Q); k fastest.
template <typename In>
__global__ void grad_transform_kernel(Geom g, const In* __restrict__ dy, float* __restrict__ e_ws,
                                      int64_t tp, int64_t kgp) {
  const int64_t total = tp * g.G * kgp, per_image = g.TP * g.TQ;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % kgp, grp = e / kgp % g.G, t = e / (kgp * g.G);
    const bool valid = t < g.tiles() && k < g.Kg;
    const int64_t n = t / per_image, p0 = t % per_image / g.TQ * 4, q0 = t % g.TQ * 4;
    float d[4][4], r[6][6];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        d[i][j] = valid && p0 + i < g.P && q0 + j < g.Q
                      ? cuda::to_acc(dy[((n * g.P + p0 + i) * g.Q + q0 + j) * g.Cout() +
                                        grp * g.Kg + k])
                      : 0.f;
    winograd::sandwich<winograd::Transposed<W4::At>>(d, r);
    scatter_xi(e_ws + (grp * tp + t) * kgp + k, g.G * tp * kgp, r);
  }
}

// dw[r][s][c][grp*Kg + k] = (G^T (sum_split S[split][xi][grp][c][k]) G)[r][s] for c < Cg,
// k < Kg; k fastest. The split sum and the transform run in double.
template <typename Out>
__global__ void filter_grad_kernel(Geom g, const float* __restrict__ s_ws, Out* __restrict__ dw,
                                   int64_t splits, int64_t cgp, int64_t kgp) {
  const int64_t total = g.G * g.Cg * g.Kg, split_stride = kXi * g.G * cgp * kgp;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % g.Kg, c = e / g.Kg % g.Cg, grp = e / (g.Kg * g.Cg);
    const float* src = s_ws + (grp * cgp + c) * kgp + k;
    double s[6][6] = {}, part[6][6], f[3][3];
    for (int64_t sp = 0; sp < splits; ++sp) {
      gather_xi(src + sp * split_stride, g.G * cgp * kgp, part);
#pragma unroll
      for (int i = 0; i < 6; ++i)
#pragma unroll
        for (int j = 0; j < 6; ++j) s[i][j] += part[i][j];
    }
    winograd::sandwich<winograd::Transposed<W4::G>>(s, f);
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
      for (int q = 0; q < 3; ++q)
        dw[((r * 3 + q) * g.Cg + c) * g.Cout() + grp * g.Kg + k] = cuda::from_acc<Out>(f[r][q]);
  }
}

// ---- batched GEMM --------------------------------------------------------------------------

// C[z] (M, N) = A[z] (M, Kd) @ B[z] (Kd, N) for z = split * batches + batch: batch `batch`
// of the operands, reduction slice [split * k_len, (split + 1) * k_len). A is row-major
// (A(m, k) = a[m * lda + k]) or, with kAT, stored transposed (A(m, k) = a[k * lda + m]); B and
// C are row-major. M, N are multiples of 64 and k_len of 16 (the workspace is padded).
struct GemmArgs {
  const float* a;
  const float* b;
  float* c;
  int64_t lda, ldb, ldc;
  int64_t a_batch, b_batch, c_batch;  // strides between batches (c: between z)
  int64_t batches, k_len;
};

template <bool kAT>
__global__ void __launch_bounds__(kGemmThreads) gemm_kernel(GemmArgs g) {
  __shared__ __align__(16) float as[2][kBK][kSRow];  // (buf, BK, BM): A^T
  __shared__ __align__(16) float bs[2][kBK][kSRow];  // (buf, BK, BN)
  const int tid = threadIdx.x;
  const int64_t z = blockIdx.z, batch = z % g.batches, split = z / g.batches;
  const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;
  const int64_t k_begin = split * g.k_len;
  const float* a = g.a + batch * g.a_batch + (kAT ? k_begin * g.lda + m0 : m0 * g.lda + k_begin);
  const float* b = g.b + batch * g.b_batch + k_begin * g.ldb + n0;
  float* c = g.c + z * g.c_batch + m0 * g.ldc + n0;

  // Staging: thread tid moves float4 number j = tid + 128 * i (i < 2) of each operand tile.
  float4 ra[2], rb[2];
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int j = tid + kGemmThreads * i;
      ra[i] = kAT ? *reinterpret_cast<const float4*>(a + (k0 + j / 16) * g.lda + j % 16 * 4)
                  : *reinterpret_cast<const float4*>(a + (j / 4) * g.lda + k0 + j % 4 * 4);
      rb[i] = *reinterpret_cast<const float4*>(b + (k0 + j / 16) * g.ldb + j % 16 * 4);
    }
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int j = tid + kGemmThreads * i;
      if constexpr (kAT) {
        *reinterpret_cast<float4*>(&as[buf][j / 16][j % 16 * 4]) = ra[i];
      } else {
        const int m = j / 4, k = j % 4 * 4;
        as[buf][k][m] = ra[i].x, as[buf][k + 1][m] = ra[i].y;
        as[buf][k + 2][m] = ra[i].z, as[buf][k + 3][m] = ra[i].w;
      }
      *reinterpret_cast<float4*>(&bs[buf][j / 16][j % 16 * 4]) = rb[i];
    }
  };

  // Warp (2 x 2 grid) owns a (32, 32) block; lane (4 x 8 grid) rows row0 + [0, 8), cols
  // col0 + [0, 4).
  const int warp = tid / 32, lane = tid % 32;
  const int row0 = warp / 2 * 32 + lane / 8 * 8, col0 = warp % 2 * 32 + lane % 8 * 4;
  float acc[8][4] = {};
  const int64_t steps = g.k_len / kBK;
  if (steps > 0) {
    load(0);
    store(0);
  }
  __syncthreads();
  for (int64_t s = 0; s < steps; ++s) {
    // The next step's operands are loaded during this step's products (on the last step, the
    // last k-slice again, into the idle buffer: branch-free, so the loads are issued early).
    const int buf = int(s & 1);
    load((s + 1 < steps ? s + 1 : s) * kBK);
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      float av[8], bv[4];
      *reinterpret_cast<float4*>(&av[0]) = *reinterpret_cast<const float4*>(&as[buf][k][row0]);
      *reinterpret_cast<float4*>(&av[4]) =
          *reinterpret_cast<const float4*>(&as[buf][k][row0 + 4]);
      *reinterpret_cast<float4*>(&bv[0]) = *reinterpret_cast<const float4*>(&bs[buf][k][col0]);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) acc[i][jj] = fmaf(av[i], bv[jj], acc[i][jj]);
    }
    store(buf ^ 1);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
    *reinterpret_cast<float4*>(c + (row0 + i) * g.ldc + col0) =
        make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
}

// ---- host side -----------------------------------------------------------------------------

Support supports(const Args& a) {
  Support s = winograd::support_3x3(a);
  if (!s.ok) return s;
  const Plan pl = plan_of(a);
  if (kXi * pl.g.G * pl.splits > 65535) return Support::No("too many groups");
  return Support::Yes();
}

int64_t workspace_bytes(const Args& a) {
  const Plan pl = plan_of(a);
  const bool filter = a.dir == Direction::kBwdFilter;
  return (pl.v_floats() + pl.mid_floats(filter) + pl.out_floats(filter)) *
         int64_t(sizeof(float));
}

template <typename Kernel, typename... Params>
Status launch_elementwise(Kernel kernel, int64_t n, cudaStream_t stream, const char* name,
                          Params... params) {
  if (n == 0) return Status::Ok();
  kernel<<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(params...);
  return cuda::check_launch(name);
}

// Launches the batches * splits GEMMs of shape (m, n) (nothing when that is empty).
template <bool kAT>
Status launch_gemm(const GemmArgs& ga, int64_t m, int64_t n, int64_t splits,
                   cudaStream_t stream) {
  if (m == 0 || n == 0) return Status::Ok();
  const dim3 grid(unsigned(m / kBM), unsigned(n / kBN), unsigned(ga.batches * splits));
  gemm_kernel<kAT><<<grid, kGemmThreads, 0, stream>>>(ga);
  return cuda::check_launch("conv winograd_nonfused gemm_kernel");
}

template <typename In, typename Out>
Status run_typed(const Args& a, const Plan& pl, const Buffers& b, float* ws,
                 cudaStream_t stream) {
  const Geom& g = pl.g;
  const bool filter = a.dir == Direction::kBwdFilter;
  const In* in = static_cast<const In*>(a.dir == Direction::kBwdData ? b.y : b.x);
  float* v = ws;
  float* mid = v + pl.v_floats();
  float* prod = mid + pl.mid_floats(filter);
  const int64_t batches = kXi * g.G;

  Status st = launch_elementwise(input_transform_kernel<In>, pl.tp * g.G * pl.cgp, stream,
                                 "conv winograd_nonfused input_transform_kernel", g, in, v,
                                 pl.tp, pl.cgp);
  if (!st.ok()) return st;
  GemmArgs ga{};
  ga.a = v;
  ga.b = mid;
  ga.c = prod;
  ga.batches = batches;
  ga.ldb = ga.ldc = pl.kgp;
  if (filter) {
    st = launch_elementwise(grad_transform_kernel<In>, pl.tp * g.G * pl.kgp, stream,
                            "conv winograd_nonfused grad_transform_kernel", g,
                            static_cast<const In*>(b.y), mid, pl.tp, pl.kgp);
    if (!st.ok()) return st;
    ga.lda = pl.cgp;
    ga.a_batch = pl.tp * pl.cgp, ga.b_batch = pl.tp * pl.kgp, ga.c_batch = pl.cgp * pl.kgp;
    ga.k_len = pl.tp / pl.splits;
    if (!(st = launch_gemm<true>(ga, pl.cgp, pl.kgp, pl.splits, stream)).ok()) return st;
    return launch_elementwise(filter_grad_kernel<Out>, g.G * g.Cg * g.Kg, stream,
                              "conv winograd_nonfused filter_grad_kernel", g, prod,
                              static_cast<Out*>(b.result), pl.splits, pl.cgp, pl.kgp);
  }
  st = winograd::transform_filter<4, In>(g, b.w, mid, pl.cgp, pl.kgp, stream,
                                         "conv winograd_nonfused filter_transform_kernel");
  if (!st.ok()) return st;
  ga.lda = pl.cgp;
  ga.a_batch = pl.tp * pl.cgp, ga.b_batch = pl.cgp * pl.kgp, ga.c_batch = pl.tp * pl.kgp;
  ga.k_len = pl.cgp;
  if (!(st = launch_gemm<false>(ga, pl.tp, pl.kgp, 1, stream)).ok()) return st;
  return launch_elementwise(output_transform_kernel<Out>, g.tiles() * g.G * g.Kg, stream,
                            "conv winograd_nonfused output_transform_kernel", g, prod,
                            static_cast<Out*>(b.result), pl.tp, pl.kgp);
}

Status run(const Args& a, const Buffers& b, void* workspace, cudaStream_t stream) {
  const Plan pl = plan_of(a);
  Status status;
  const bool ok = dispatch_io(a.in, a.out, [&](auto in_tag, auto out_tag) {
    using In = device_t<decltype(in_tag)>;
    using Out = device_t<decltype(out_tag)>;
    if constexpr (std::is_same_v<In, double>) {
      status = Status::Error("conv winograd_nonfused: float64: use direct");
    } else {
      status = run_typed<In, Out>(a, pl, b, static_cast<float*>(workspace), stream);
    }
  });
  if (!ok)
    return Status::Error(std::string("conv winograd_nonfused: unsupported dtypes ") +
                         dtype_name(a.in) + " -> " + dtype_name(a.out));
  return status;
}

}  // namespace

const CudaAlgorithm kCudaWinogradNonfused = {"winograd_nonfused", /*deterministic=*/true,
                                             /*tensor_cores=*/false, supports, workspace_bytes,
                                             run};

}  // namespace jaxdnn::conv
