// CPU entry points of the norm kernels (cc/norm/norm.h describes the problem and buffers).
// Each runs on the given thread pool, writes every output element, and is deterministic: the
// reduction order depends only on the shape, never on the thread count or timing.
#pragma once

#include <vector>

#include "cc/common/parallel.h"
#include "cc/common/status.h"
#include "cc/norm/norm.h"

namespace jaxdnn::norm {

// The CPU registry: one algorithm per path ("row", "column", "segment": the path's kernels) for
// every pass; only the problem's path supports it.
std::vector<const Algorithm*> cpu_algorithms(Pass pass, const Problem& p);

// Training forward: statistics of x, then y. Writes y, mean, var (and uses the workspace).
Status cpu_forward(const Problem& p, const FwdBuffers& b, const Parallel& par);
// Inference forward: y from the given mean and var.
Status cpu_inference(const Problem& p, const FwdBuffers& b, const Parallel& par);
// Backward (training or inference, per b.training).
Status cpu_backward(const Problem& p, const BwdBuffers& b, const Parallel& par);

}  // namespace jaxdnn::norm
