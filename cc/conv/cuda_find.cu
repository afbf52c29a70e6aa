// Timing one CUDA conv algorithm for "find" (jaxdnn.find_conv_algorithms, benchmark mode), the
// way cuDNN's cudnnFind* does: on buffers of its own (filled with pseudo-random values, so no
// data-dependent fast path is timed), on a stream of its own, between CUDA events, so the
// numbers are device time with no host dispatch in them. Correctness is checked separately
// (Python runs each algorithm through XLA against the direct oracle).

#include <algorithm>
#include <string>
#include <type_traits>

#include "cc/common/cuda_util.h"
#include "cc/conv/cuda_algorithms.h"

namespace jaxdnn::conv {
namespace {

// Uniform values from a hash of the index: in [-1, 1) for floats, any value for integers.
template <typename T>
__global__ void fill_kernel(T* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    if constexpr (std::is_integral_v<T>)
      p[i] = T(h);
    else
      p[i] = cuda::from_acc<T>(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

Status fill(DType t, void* p, int64_t n, uint32_t seed, cudaStream_t s) {
  Status st;
  auto launch = [&](auto tag, auto) {
    using T = cuda::device_t<decltype(tag)>;
    fill_kernel<T><<<cuda::grid_for(n, 256), 256, 0, s>>>(static_cast<T*>(p), n, seed);
    st = cuda::check_launch("conv find fill_kernel");
  };
  if (!dispatch_io(t, t, launch) && !dispatch_int_io(t, t, launch))
    return Status::Error(std::string("conv find: unsupported dtype ") + dtype_name(t));
  return st;
}

// Frees what it owns on every path out.
struct Scratch {
  std::vector<void*> bufs;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Scratch() {
    for (void* b : bufs) cudaFree(b);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
  }
  void* alloc(int64_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, size_t(std::max<int64_t>(bytes, 1))) != cudaSuccess) return nullptr;
    bufs.push_back(p);
    return p;
  }
};

int64_t bytes_of(DType t, int64_t n) { return n * dtype_bytes(t); }

}  // namespace

Status time_cuda_algorithm(const CudaAlgorithm& alg, const Args& a, int repeats,
                           std::vector<float>* ms) {
  const Problem& p = a.p;
  Scratch s;
  const int64_t x = p.x_elems(), w = p.w_elems(), y = p.y_elems();
  // Operands by role (cc/conv/conv.h Buffers); the result gets the output dtype.
  const bool fwd = a.dir == Direction::kFwd, bwd_data = a.dir == Direction::kBwdData;
  Buffers b;
  void* xb = s.alloc(bytes_of(fwd || !bwd_data ? a.in : a.out, x));
  void* wb = s.alloc(bytes_of(a.dir == Direction::kBwdFilter ? a.out : a.in, w));
  void* yb = s.alloc(bytes_of(fwd ? a.out : a.in, y));
  void* ws = s.alloc(alg.workspace_bytes(a));
  if (!xb || !wb || !yb || !ws) {
    cudaGetLastError();  // clear the allocation error
    return Status::Error("conv find: not enough free GPU memory to time " +
                         std::string(alg.name));
  }
  if (cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreate(&s.start) != cudaSuccess || cudaEventCreate(&s.stop) != cudaSuccess)
    return cuda::check_launch("conv find stream/event creation");
  b.x = xb; b.w = wb; b.y = yb;
  b.result = fwd ? yb : (bwd_data ? xb : wb);
  const struct { void* buf; int64_t n; } operands[] = {{xb, x}, {wb, w}, {yb, y}};
  uint32_t seed = 1;
  for (const auto& o : operands)
    if (o.buf != b.result)
      if (Status st = fill(a.in, o.buf, o.n, seed++, s.stream); !st.ok()) return st;
  if (Status st = alg.run(a, b, ws, s.stream); !st.ok()) return st;  // warm-up
  ms->clear();
  for (int i = 0; i < repeats; ++i) {
    cudaEventRecord(s.start, s.stream);
    if (Status st = alg.run(a, b, ws, s.stream); !st.ok()) return st;
    cudaEventRecord(s.stop, s.stream);
    if (cudaEventSynchronize(s.stop) != cudaSuccess) return cuda::check_launch(alg.name);
    float t = 0.f;
    cudaEventElapsedTime(&t, s.start, s.stop);
    ms->push_back(t);
  }
  return cuda::check_launch(alg.name);
}

}  // namespace jaxdnn::conv
