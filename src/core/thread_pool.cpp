#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>

namespace kiln {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Spins before a worker sleeps: a few hundred microseconds, longer than the gaps between
// the matmuls of a decode step, far shorter than a pause between requests.
constexpr int kSpinsBeforeSleep = 20000;

}  // namespace

int default_thread_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_thread_count()) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  job_.store(&fn, std::memory_order_relaxed);
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1);  // seq_cst: publishes job_ and pending_, ordered before the read below
  if (sleepers_.load() > 0) {
    // A worker that counted itself asleep either sees the new generation under the lock,
    // or is inside wait() and gets this notification.
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  fn(0);
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    cpu_relax();
    if (spin > kSpinsBeforeSleep) std::this_thread::yield();  // a worker was descheduled
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spin = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spin < kSpinsBeforeSleep) {
      cpu_relax();
      ++spin;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1);  // seq_cst, before re-reading the generation
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      sleepers_.fetch_sub(1);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    (*job_.load(std::memory_order_relaxed))(index);
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
  struct Split {
    int64_t n, chunks;
    const std::function<void(int64_t, int64_t)>* fn;
  } split{n, chunks, &fn};
  run([s = &split](int t) {  // one pointer: fits std::function's inline storage
    if (t >= s->chunks) return;
    const int64_t begin = s->n * t / s->chunks, end = s->n * (t + 1) / s->chunks;
    if (begin < end) (*s->fn)(begin, end);
  });
}

}  // namespace kiln
