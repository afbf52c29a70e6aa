// fft: FFT convolution with one FFT plane per image (see cuda_fft.cuh for the algorithm, the
// kernels and the direction bookkeeping). Per axis the FFT length is the smallest 2^a 3^b
// covering the whole linear result, L >= extent + taps - 1 (extent = P for fwd and
// bwd_filter, H for bwd_data), so every image is one tile. The plane must fit one block's
// shared memory (L_h * (L_w | 1) * 8 bytes: up to 128 x 128, 162 x 162, 256 x 96); bigger
// images need fft_tiling.
//
// Predicted on H200, N = 64, float32 (FFT work vs the 2 * macs of a direct convolution):
//   56x56, 64 -> 64, 7x7, pad 3: L = 64 x 64, F = 2112 frequencies; GEMM 4.4 GFLOP (vs 80.5);
//     spectra 3 x 69 MB written + read, x/y 51 MB each: ~0.45 GB of traffic (~0.1 ms) and
//     ~0.13 ms of GEMM at ~35 TFLOP/s: ~0.3 ms, i.e. ~250 "effective" TFLOP/s.
//   28x28, 128 -> 128, 7x7, pad 3: L = 36 x 36 (radix 3), F = 684; GEMM 5.7 GFLOP (vs 80.5);
//     W spectrum 90 MB, X/Y 45 MB: ~0.3 ms.
// Measured: see dev/drivers/fft_check.cu (not yet run on a GPU).

#include "cc/conv/cuda_fft.cuh"

namespace jaxdnn::conv {
namespace {

bool whole_image(int64_t extent, int64_t taps, int64_t* L, int64_t* T) {
  *T = extent;
  *L = fft::smooth_length(extent + taps - 1);
  return true;
}

using Fft = fft::Algorithm<whole_image>;

}  // namespace

const CudaAlgorithm kCudaFft = {"fft", /*deterministic=*/true, /*tensor_cores=*/false,
                                Fft::supports, Fft::workspace_bytes, Fft::run};

}  // namespace jaxdnn::conv
