// CUDA global pooling: max_fwd, max_fwd_index and avg_fwd when one window covers the whole
// input (Problem::global(), e.g. the final 7x7 pool of a ResNet or jaxdnn.global_avg_pool).
//
// One output per (n, channel) gives too little parallelism (64x64 outputs for N=64, C=64),
// so the window is split. A cluster of S blocks (Hopper thread-block clusters, S <= 8)
// reduces one (n, chunk of channel vectors). Block (lanes, rows): lanes over channel vectors
// (<= 32, each a 16-byte vector when C allows), rows over slices of positions; thread
// (lane, row) of block `rank` reduces the contiguous positions of slice rank*rows + row. The
// rows of a block merge through shared memory, then block 0 merges its peers' results read
// from their shared memory (distributed shared memory), in slice order: the result is
// deterministic and needs neither atomics nor workspace.
// Traffic: x read once (N*D*H*W*C elements), y (and idx) written once (N*C).

#include <cooperative_groups.h>

#include <type_traits>

#include "cc/pool/cuda_common.cuh"

namespace jaxdnn::pool::gpu {
namespace {

namespace cg = cooperative_groups;

constexpr int32_t kMaxCluster = 8;      // the portable cluster size limit
constexpr int32_t kMinPerThread = 16;   // positions a thread reduces before the split grows

template <typename T, int V, Reduce R, typename Idx>
__global__ void __launch_bounds__(kThreads)
global_fwd_kernel(Geom g, const T* __restrict__ x, T* __restrict__ y, Idx* __restrict__ idx,
                  int32_t chunks) {
  using A = dev_acc_t<T>;
  using State = WindowState<A, V, R>;
  __shared__ State part[kThreads];  // (rows, lanes)
  cuda::await_prior_grids();
  cg::cluster_group cluster = cg::this_cluster();
  const int32_t S = int32_t(cluster.num_blocks()), rank = int32_t(cluster.block_rank());
  const int32_t group = blockIdx.x / S;  // (n, chunk) reduced by this cluster
  const int32_t n = group / chunks, chunk = group % chunks;
  const int32_t lanes = blockDim.x, rows = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int32_t cv = chunk * lanes + tx;
  const bool active = cv * V < g.C;
  const int32_t positions = g.in_spatial(), slices = S * rows;
  const int32_t per = (positions + slices - 1) / slices;
  const int32_t begin = min(positions, (rank * rows + ty) * per);
  const int32_t end = min(positions, begin + per);

  State st;
  st.init();
  if (active) {
    const T* px = x + n * positions * g.C + cv * V;
#pragma unroll 4
    for (int32_t j = begin; j < end; ++j) {  // a global window's tap index is the position
      A v[V];
      load_channels<T, V>(px + j * g.C, v);
#pragma unroll
      for (int i = 0; i < V; ++i) st.add(i, v[i], j);
    }
  }
  part[ty * lanes + tx] = st;
  __syncthreads();
  if (ty == 0) {
    for (int32_t r = 1; r < rows; ++r) st.merge(part[r * lanes + tx]);
    part[tx] = st;
  }
  cluster.sync();
  if (rank == 0 && ty == 0 && active) {
    for (int32_t b = 1; b < S; ++b) st.merge(*cluster.map_shared_rank(&part[tx], b));
    const int32_t o = n * g.C + cv * V;
    st.template store<T, V, Idx>(0, y + o, R == Reduce::kMaxIndex ? idx + o : nullptr,
                                 A(1) / A(positions), /*first_on_input=*/true);
  }
  cluster.sync();  // peers keep their shared memory until block 0 has read it
}

template <typename T, typename Idx, int V>
Status launch_global(const Args& a, const Buffers& b, cudaStream_t stream) {
  const Problem& p = a.p;
  const int64_t vectors = p.C / V;
  const int32_t lanes = int32_t(std::min<int64_t>(vectors, 32)), rows = kThreads / lanes;
  const int32_t chunks = int32_t((vectors + lanes - 1) / lanes);
  const int64_t want = (p.in_spatial() + int64_t(rows) * kMinPerThread - 1) /
                       (int64_t(rows) * kMinPerThread);
  const int32_t S = int32_t(std::max<int64_t>(1, std::min<int64_t>(kMaxCluster, want)));
  const T* x = static_cast<const T*>(b.a);
  T* y = static_cast<T*>(b.result);
  Idx* idx = static_cast<Idx*>(b.index_out);
  return over_batch_slices(p, lanes, [&](const Geom& g, int64_t n0) {
    const T* xs = x + n0 * p.in_spatial() * p.C;
    T* ys = y + n0 * p.C;
    Idx* is = idx == nullptr ? nullptr : idx + n0 * p.C;
    const dim3 grid{unsigned(int64_t(g.N) * chunks * S)}, block{unsigned(lanes), unsigned(rows)};
    auto run = [&](auto kernel, auto* index) {
      return cuda::launch_clusters("pool global_fwd_kernel", unsigned(S), kernel, grid, block, 0,
                                   stream, g, xs, ys, index, chunks);
    };
    switch (a.op) {
      case Op::kMaxFwd:
        return run(global_fwd_kernel<T, V, Reduce::kMax, uint8_t>, static_cast<uint8_t*>(nullptr));
      case Op::kMaxFwdIndex:
        return run(global_fwd_kernel<T, V, Reduce::kMaxIndex, Idx>, is);
      case Op::kAvgFwd:
        return run(global_fwd_kernel<T, V, Reduce::kAvg, uint8_t>, static_cast<uint8_t*>(nullptr));
      default:
        return Status::Error("pool global: not a forward op");
    }
  });
}

template <typename T, typename Idx>
Status global_typed(const Args& a, const Buffers& b, cudaStream_t stream) {
  constexpr int kN = cuda::Vec<T>::kN;
  if (a.p.C % kN == 0 && aligned(b.a, cuda::kVecBytes) && aligned(b.result, cuda::kVecBytes) &&
      aligned(b.index_out, alignof(IdxVec<Idx, kN>)))
    return launch_global<T, Idx, kN>(a, b, stream);
  return launch_global<T, Idx, 1>(a, b, stream);
}

}  // namespace

Status global_fwd(const Args& a, const Buffers& b, cudaStream_t stream) {
  Status s;
  const bool ok = dispatch_io(a.dtype, a.dtype, [&](auto tag, auto) {
    using T = device_t<decltype(tag)>;
    s = a.index == IndexType::kU8 ? global_typed<T, uint8_t>(a, b, stream)
                                  : global_typed<T, int32_t>(a, b, stream);
  });
  if (!ok) return Status::Error(std::string("pool: unsupported dtype ") + dtype_name(a.dtype));
  return s;
}

}  // namespace jaxdnn::pool::gpu
