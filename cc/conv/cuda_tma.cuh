// Hopper's tensor memory accelerator (TMA) for the GEMM operands that are plain row-major
// matrices or boxes of an NHWC tensor (the halo path, cuda_halo_wgmma.cuh), and the
// shared-memory barriers (mbarrier) its copies complete on.
//
// One thread issues a cp.async.bulk.tensor copy of a whole box (here 64 rows x 128 bytes, with
// the 128-byte swizzle that the GEMM's shared tiles already use) and the copy engine moves it
// while the threads go on: no per-thread address arithmetic, no per-chunk cp.async. The copy
// signals its bytes on an mbarrier; the consumers wait for the barrier's phase. Boxes reaching
// past the matrix's edge are zero-filled by the hardware, as the cp.async loaders do.
// The tensor map (CUtensorMap) is encoded on the host through the driver entry point the
// runtime hands out, so nothing links against libcuda.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cc/common/status.h"

namespace jaxdnn::conv::gemm {

// A driver entry point (PFN: its cudaTypedefs.h type), looked up through the runtime once per
// call site; null if the driver lacks it.
template <typename PFN>
PFN driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<PFN>(fn);
}

inline Status encode_status(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  return Status::Error(std::string("conv gemm: ") + what + " failed (" + std::to_string(int(r)) +
                       ")");
}

// The tensor-map element type of T: bfloat16, float16, or float32 (which wgmma reads as TF32).
template <typename T>
constexpr CUtensorMapDataType tma_type() {
  if constexpr (std::is_same_v<T, float>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  else if constexpr (std::is_same_v<T, __half>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  else return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// Elements of T per 128-byte box row (the 128-byte swizzle's row).
template <typename T>
constexpr uint32_t kBoxRow = uint32_t(128 / sizeof(T));

// A tensor of T as a tensor map of `rank` dimensions (innermost first; dims[0] contiguous,
// strides[i] = bytes between consecutive indices of dimension i + 1), read in boxes of
// box[0..rank) elements with the 128-byte swizzle (box[0] = kBoxRow<T>: one 128-byte row).
template <typename T>
Status encode_tma(CUtensorMap* map, const T* base, int rank, const cuuint64_t* dims,
                  const cuuint64_t* strides, const cuuint32_t* box) {
  static const auto encode =
      driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled");
  if (encode == nullptr) return Status::Error("conv gemm: cuTensorMapEncodeTiled unavailable");
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  return encode_status(
      encode(map, tma_type<T>(), cuuint32_t(rank), const_cast<T*>(base), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
      "cuTensorMapEncodeTiled");
}

// An (N, H, W, C) tensor of T, C contiguous, as tensor-map dimensions (innermost first: c, w,
// h, n) and the byte strides of the outer three.
template <typename T>
struct NhwcDims {
  cuuint64_t dims[4], strides[3];
  NhwcDims(int64_t n, int64_t h, int64_t w, int64_t c)
      : dims{cuuint64_t(c), cuuint64_t(w), cuuint64_t(h), cuuint64_t(n)},
        strides{cuuint64_t(c) * sizeof(T), cuuint64_t(w * c) * sizeof(T),
                cuuint64_t(h * w * c) * sizeof(T)} {}
};

// t (N, H, W, C) read in boxes of one 128-byte row of channels x box_w x box_h pixels of one
// image (outside the tensor: zeros).
template <typename T>
Status encode_nhwc(CUtensorMap* map, const T* t, int64_t n, int64_t h, int64_t w, int64_t c,
                   uint32_t box_w, uint32_t box_h) {
  const NhwcDims<T> d(n, h, w, c);
  const cuuint32_t box[4] = {kBoxRow<T>, box_w, box_h, 1};
  return encode_tma(map, t, 4, d.dims, d.strides, box);
}

// A rows x cols row-major matrix (row stride `ld` elements) in boxes of box_rows x 128 bytes.
template <typename T>
Status encode_tma_2d(CUtensorMap* map, const T* base, uint64_t rows, uint64_t cols, uint64_t ld,
                     uint32_t box_rows) {
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {ld * sizeof(T)};
  const cuuint32_t box[2] = {kBoxRow<T>, box_rows};
  return encode_tma(map, base, 2, dims, strides, box);
}

// x (N, H, W, C; C contiguous) as an im2col tensor map: a copy at base pixel (n, h, w) and
// filter offset (r', s') loads `pixels` consecutive base pixels (w fastest, then h, then n;
// stepping by the strides inside the window that starts at `lower` (h, w) and holds `out`
// (h, w) positions per image) x 128 bytes of channels, each pixel read at (h + r', w + s');
// pixels outside x are zero-filled. Box rows are 128 bytes with the 128-byte swizzle: a
// k-major operand tile.
template <typename T>
Status encode_tma_im2col(CUtensorMap* map, const T* base, int64_t n, int64_t h, int64_t w,
                         int64_t c, const int (&lower)[2], const int (&out)[2],
                         const int (&stride)[2], uint32_t pixels) {
  static const auto encode =
      driver_entry<PFN_cuTensorMapEncodeIm2col_v12000>("cuTensorMapEncodeIm2col");
  if (encode == nullptr) return Status::Error("conv gemm: cuTensorMapEncodeIm2col unavailable");
  // The window of base pixels along an axis is [lower, size + upper): (out - 1) * stride + 1
  // positions (lo, up innermost first: w, h).
  const NhwcDims<T> d(n, h, w, c);
  const int lo[2] = {lower[1], lower[0]};
  const int up[2] = {lower[1] + (out[1] - 1) * stride[1] + 1 - int(w),
                     lower[0] + (out[0] - 1) * stride[0] + 1 - int(h)};
  const cuuint32_t elem_strides[4] = {1, cuuint32_t(stride[1]), cuuint32_t(stride[0]), 1};
  return encode_status(
      encode(map, tma_type<T>(), 4, const_cast<T*>(base), d.dims, d.strides, lo, up,
             kBoxRow<T>, pixels, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
      "cuTensorMapEncodeIm2col");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes the barriers' initialisation visible to the copy engine.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The calling thread's arrival, announcing `bytes` that copies will complete on the barrier.
__device__ __forceinline__ void mbar_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Announces `bytes` more that copies will complete on the barrier, without an arrival (a copy
// that rides on another one's mbar_expect_bytes: issued before it, so that the phase cannot
// complete in between).
__device__ __forceinline__ void mbar_expect_more(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits for the barrier's phase `parity` to complete (try_wait itself suspends the thread for
// a while between polls). Unbounded, as in CUTLASS: a bounded loop ending in __trap() made
// ptxas inject warpgroup waits into the wgmma kernel (C7517), serialising its MMAs.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// One arrival (of the count given to mbar_init), no bytes announced.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Copies the box at (column c0, row r0) of `map` into shared memory at `dst` (1024-aligned),
// completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int r0,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(r0), "r"(bar)
      : "memory");
}

// The 4-D box at (c0, c1, c2, c3) of `map` (coordinates may lie outside the tensor: those
// elements are zero-filled), as tma_load_2d.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// The im2col box of `map` (encode_tma_im2col) whose first base pixel is (n, h, w), channels
// from c0, read at filter offset (r', s') = (off_h, off_w), as tma_load_2d.
__device__ __forceinline__ void tma_load_im2col(uint32_t dst, const CUtensorMap* map, int c0,
                                                int w, int h, int n, uint16_t off_w,
                                                uint16_t off_h, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4, %5}], [%6], {%7, %8};\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(w), "r"(h), "r"(n), "r"(bar),
      "h"(off_w), "h"(off_h)
      : "memory");
}

}  // namespace jaxdnn::conv::gemm
