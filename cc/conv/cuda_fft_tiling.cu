// fft_tiling: FFT convolution over overlap-save tiles (see cuda_fft.cuh for the algorithm, the
// kernels and the direction bookkeeping). The FFT size does not grow with the image: per axis
// the length L = 2^a 3^b in [taps, 64] minimising tiles * L, tiles = ceil(extent / T) with
// T = L - taps + 1 output rows per tile (ties to the smaller L). Planes are (image, tile), so
// the per-frequency GEMMs get N * tiles rows, and the x/dy/y/dx spectra go through the
// workspace in batches of planes (cuda_fft.cuh: kBatchBytes), so the workspace is bounded for
// any image size. Filters longer than 64 taps are unsupported. The FFTs mix a tile's values:
// one inf or NaN operand makes NaN across its tile (conv.h).
//
// Predicted on H200, float32: 56x56 and 28x28 7x7 layers pick a single 64 x 64 / 36 x 36 tile,
// the same plan as fft (~0.2 ms at N = 64). 224x224, 64 -> 64, 7x7, N = 8: L = 64, T = 58,
// 4 x 4 tiles = 128 planes in 2 batches, F = 2112: GEMM 8.9 GFLOP against 161 GFLOP direct,
// ~0.4 ms. 3x3 filters get small tiles (56x56: L = 16, T = 14): fewer flops than direct, but
// the transforms make it slower than a good GEMM there.
// Measured (H200, N=64, float32, TFLOP/s-equivalent): 7x7 stride 1: 120-123 at 56x56x64,
// 171-186 at 28x28x128 (cuDNN exact float32: 56-113); 3x3: 23-45.

#include "cc/conv/cuda_fft.cuh"

namespace jaxdnn::conv {
namespace {

constexpr int64_t kMaxTile = 64;

Support best_tile(int64_t extent, int64_t taps, int64_t* L, int64_t* T) {
  if (taps > kMaxTile)
    return Support::No("filter of " + std::to_string(taps) + " taps is longer than the " +
                       std::to_string(kMaxTile) + "-point FFT tile");
  int64_t best = -1;
  for (int64_t l = taps; l <= kMaxTile; ++l) {
    if (fft::smooth_length(l) != l) continue;
    const int64_t t = l - taps + 1, cost = (extent + t - 1) / t * l;
    if (best < 0 || cost < best) {
      best = cost;
      *L = l;
      *T = t;
    }
  }
  return Support::Yes();
}

using FftTiling = fft::Algorithm<best_tile>;

}  // namespace

const CudaAlgorithm kCudaFftTiling = {"fft_tiling", /*deterministic=*/true,
                                      /*tensor_cores=*/false, FftTiling::supports,
                                      FftTiling::workspace_bytes, FftTiling::run};

}  // namespace jaxdnn::conv
