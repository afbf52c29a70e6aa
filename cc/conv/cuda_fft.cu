// fft: FFT convolution with one FFT plane per image (see cuda_fft.cuh for the algorithm, the
// kernels and the direction bookkeeping). Per axis the FFT length is the smallest 2^a 3^b
// covering the whole linear result, L >= extent + taps - 1 (extent = P for fwd and
// bwd_filter, H for bwd_data), so every image is one tile. The plane must fit one block's
// shared memory (Lh * (Lw | 1) * 8 bytes: up to 128 x 128, 162 x 162, 256 x 96); bigger
// images need fft_tiling. The FFTs mix a plane's values: one inf or NaN operand makes NaN
// across its plane (conv.h).
//
// Predicted on H200, N = 64, float32, each direction (GEMM at ~60% of the 67 TFLOP/s FMA peak,
// transforms ~30 us per tensor-sized pass):
//   56x56, 64 -> 64, 7x7, pad 3: L = 64 x 64, F = 2112 frequencies, GEMM 4.4 GFLOP (~110 us),
//     filter/input/output transforms ~25 + 35 + 35 us: ~0.2 ms, i.e. ~400 TFLOP/s counted as
//     2 * macs (80.5 GFLOP), against at most 67 for any float32 FMA GEMM.
//   28x28, 128 -> 128, 7x7, pad 3: L = 36 x 36 (radix 3), F = 684, GEMM 5.7 GFLOP (~140 us),
//     W spectrum 90 MB: ~0.2 ms.
// Accuracy: float32 relative L2 ~1.4e-7 on small problems (CPU emulation of these kernels);
// FFT rounding grows like eps * log(L).
// Measured (H200, N=64, float32, TFLOP/s-equivalent): 7x7 stride 1: 118-124 at 56x56x64,
// 175-191 at 28x28x128; the GPU pytest grid checks float32 at 1e-5 relative L2.

#include "cc/conv/cuda_fft.cuh"

namespace jaxdnn::conv {
namespace {

Support whole_image(int64_t extent, int64_t taps, int64_t* L, int64_t* T) {
  *T = extent;
  *L = fft::smooth_length(extent + taps - 1);
  return Support::Yes();
}

using Fft = fft::Algorithm<whole_image>;

}  // namespace

const CudaAlgorithm kCudaFft = {"fft", /*deterministic=*/true, /*tensor_cores=*/false,
                                Fft::supports, Fft::workspace_bytes, Fft::run};

}  // namespace jaxdnn::conv
