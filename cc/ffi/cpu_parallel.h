// Parallel (cc/common/parallel.h) on XLA:CPU's intra-op thread pool.
//
// The calling thread takes part: tasks are claimed from a shared counter by the caller and by
// up to num_threads-1 scheduled helpers, and the caller returns once every task has finished
// (polling for the helpers' last tasks for up to kPoll before it blocks on a condition variable).
// A helper that starts late finds no task left and returns without touching `fn`; the counters
// it reads live in a shared_ptr, so they outlive the call.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "cc/common/parallel.h"
#include "xla/ffi/api/ffi.h"

namespace jaxdnn::ffi_util {

class FfiParallel final : public Parallel {
 public:
  explicit FfiParallel(xla::ffi::ThreadPool pool) : pool_(pool) {}

  int num_threads() const override {
    return int(std::max<int64_t>(1, pool_.num_threads()));
  }

  // How long the caller polls for the helpers' last tasks, yielding its core between polls,
  // before it blocks. A helper that has claimed a task finishes it within one task's time, and
  // a blocked caller's wake-up (futex) cost 5-25 us an op on the 2-core VM; yielding rather
  // than spinning with pause leaves the core to whichever thread XLA runs beside the caller.
  // relu float32 256x1024 49.8 -> 35.5 us, 1024x4096 1195 -> 905, gelu bfloat16 256x1024 151 ->
  // 134, maxpool 3x3/2 bfloat16 forward 864 -> 830 (a pause spin: 955); docs/perf/cpu.md.
  static constexpr std::chrono::microseconds kPoll{200};

  void for_each(int64_t n, const std::function<void(int64_t)>& fn) const override {
    const int helpers = int(std::min<int64_t>(n, num_threads())) - 1;
    if (helpers <= 0) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    struct Shared {
      std::atomic<int64_t> next{0};
      std::atomic<int64_t> finished{0};
      std::mutex mu;
      std::condition_variable cv;
    };
    auto shared = std::make_shared<Shared>();
    const std::function<void(int64_t)>* f = &fn;
    auto work = [shared, f, n] {
      int64_t mine = 0;
      for (int64_t i; (i = shared->next.fetch_add(1)) < n; ++mine) (*f)(i);
      if (mine == 0 || shared->finished.fetch_add(mine) + mine != n) return;
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->cv.notify_all();
    };
    for (int h = 0; h < helpers; ++h) {
      auto task = work;  // Schedule takes ownership of a copy
      pool_.Schedule(std::move(task));
    }
    work();
    const auto until = std::chrono::steady_clock::now() + kPoll;
    while (shared->finished.load() != n && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    std::unique_lock<std::mutex> lock(shared->mu);
    shared->cv.wait(lock, [&] { return shared->finished.load() == n; });
  }

 private:
  mutable xla::ffi::ThreadPool pool_;
};

}  // namespace jaxdnn::ffi_util
