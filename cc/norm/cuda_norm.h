// The CUDA norm registry and entry points (cc/norm/norm.h describes the problem, buffers and
// passes). Each entry point only enqueues kernels (and memsets) on `stream`: no allocation, no
// synchronisation, so a caller can capture it in a CUDA graph. Results are deterministic.
//
// Algorithms (cuda_norm.cu lists what each runs):
//   training forward  row; column_two_call_flat, column_two_call, column_single_pass,
//                     column_three_pass_flat, column_three_pass; segment_split_two_call,
//                     segment_split, segment_single_pass, segment_two_call, segment_three_pass
//   inference         row, column_flat, column, segment
//   backward          row, column, segment
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "cc/common/status.h"
#include "cc/norm/norm.h"

namespace jaxdnn::norm {

// Every CUDA algorithm of `pass`, in the heuristic's preference order for `p`.
std::vector<const Algorithm*> cuda_algorithms(Pass pass, const Problem& p);

// `algo` is an algorithm of the matching pass that supports p (the handlers check). A two-call
// training forward runs one half per call: the statistics (mean, var, and the workspace the
// apply reads; b.y unused), then y from them (b.mean, b.var, b.ws as written).
Status cuda_forward(const Algorithm& algo, const Problem& p, const FwdBuffers& b, Half half,
                    cudaStream_t stream);
Status cuda_inference(const Algorithm& algo, const Problem& p, const FwdBuffers& b,
                      cudaStream_t stream);
Status cuda_backward(const Algorithm& algo, const Problem& p, const BwdBuffers& b,
                     cudaStream_t stream);

}  // namespace jaxdnn::norm
