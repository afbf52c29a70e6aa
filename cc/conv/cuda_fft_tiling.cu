// fft_tiling: FFT convolution over overlap-save tiles (see cuda_fft.cuh for the algorithm, the
// kernels and the direction bookkeeping). The FFT size does not grow with the image: per axis
// the length L = 2^a 3^b in [taps, 64] minimising tiles * L, tiles = ceil(extent / T) with
// T = L - taps + 1 output rows per tile (ties to the smaller L). Planes are (image, tile), so
// the per-frequency GEMMs get N * tiles rows, and the x/dy/y/dx spectra are processed in
// batches of planes (cuda_fft.cuh: kBatchBytes) so the workspace stays bounded for any image.
// Filters longer than 64 taps are unsupported.
//
// Predicted on H200, N = 64, float32: 56x56, 64 -> 64, 7x7 picks one 64 x 64 tile (as fft);
// 224x224, 64 -> 64, 7x7 picks L = 64, T = 58, 4 x 4 tiles: 1024 planes, F = 2112, GEMM
// 35 GFLOP vs 1.26 TFLOP direct, spectra in 5 batches: ~2.5 ms. 3x3 filters pick small
// tiles (L = 16, T = 14 for 56x56): GEMM 4 * 8 * (16 * 9) / (14 * 14) ~ 1.5x the direct flops
// per output, so fft_tiling only pays for filters of 5x5 and up.
// Measured: see dev/drivers/fft_check.cu (not yet run on a GPU).

#include "cc/conv/cuda_fft.cuh"

namespace jaxdnn::conv {
namespace {

constexpr int64_t kMaxTile = 64;

bool best_tile(int64_t extent, int64_t taps, int64_t* L, int64_t* T) {
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
  return best >= 0;
}

using FftTiling = fft::Algorithm<best_tile>;

}  // namespace

const CudaAlgorithm kCudaFftTiling = {"fft_tiling", /*deterministic=*/true,
                                      /*tensor_cores=*/false, FftTiling::supports,
                                      FftTiling::workspace_bytes, FftTiling::run};

}  // namespace jaxdnn::conv
