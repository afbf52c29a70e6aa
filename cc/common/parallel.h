// Parallel loops for CPU kernels without tying the kernel layer to XLA.
//
// A kernel receives a `const Parallel&` and calls `for_each(n, fn)`, which runs fn(i) once for
// every i in [0, n) on the available threads and returns when all are done. The FFI layer
// implements it on XLA's intra-op thread pool (cc/ffi/cpu_parallel.h); standalone drivers use
// SerialParallel or ThreadParallel below.
#pragma once

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace jaxdnn {

// A per-thread buffer of at least n values of A, kept from call to call (it holds whatever the
// thread left in it). Kernels take their task scratch from it rather than a heap block per
// task, which the allocator hands back as fresh pages on XLA's intra-op threads: the CPU
// batch_norm forward (98 blocks of 24 KB per call) went from 4.4x the page faults of XLA's own
// path in the benchmark's loop to none per blocking call (XLA's: 24-39; docs/perf/cpu.md).
template <typename A>
A* thread_scratch(int64_t n) {
  thread_local std::vector<A> buf;
  if (int64_t(buf.size()) < n) buf.resize(size_t(n));
  return buf.data();
}

class Parallel {
 public:
  virtual ~Parallel() = default;
  virtual int num_threads() const = 0;
  virtual void for_each(int64_t n, const std::function<void(int64_t)>& fn) const = 0;
};

class SerialParallel final : public Parallel {
 public:
  int num_threads() const override { return 1; }
  void for_each(int64_t n, const std::function<void(int64_t)>& fn) const override {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
};

// std::thread based, for benchmarks and drivers outside XLA. Task i goes to thread i % T.
class ThreadParallel final : public Parallel {
 public:
  explicit ThreadParallel(int threads) : threads_(threads < 1 ? 1 : threads) {}
  int num_threads() const override { return threads_; }
  void for_each(int64_t n, const std::function<void(int64_t)>& fn) const override {
    if (n <= 1 || threads_ == 1) { for (int64_t i = 0; i < n; ++i) fn(i); return; }
    std::vector<std::thread> pool;
    int t_used = int(n < threads_ ? n : threads_);
    for (int t = 1; t < t_used; ++t)
      pool.emplace_back([&, t] { for (int64_t i = t; i < n; i += t_used) fn(i); });
    for (int64_t i = 0; i < n; i += t_used) fn(i);
    for (auto& th : pool) th.join();
  }

 private:
  int threads_;
};

}  // namespace jaxdnn
