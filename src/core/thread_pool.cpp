#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>

namespace kiln {

int default_thread_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_thread_count()) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    pending_.store(n_threads_ - 1);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  fn(0);
  while (pending_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little first: in decode the next job follows within microseconds.
    for (int spin = 0; spin < 20000 && generation_.load(std::memory_order_acquire) == seen; ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      if (stop_) return;
      seen = generation_.load();
      job = job_;
    }
    (*job)(index);
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = std::min<int64_t>(n_threads_, (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  run([&](int t) {
    if (t >= chunks) return;
    const int64_t begin = n * t / chunks, end = n * (t + 1) / chunks;
    if (begin < end) fn(begin, end);
  });
}

}  // namespace kiln
