#include "core/thread_pool.h"

#include <sched.h>

#include <exception>

#include "core/error.h"

namespace kiln {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Spins before a worker sleeps: about a millisecond (a pause is ~140 cycles on recent
// Xeons), longer than the gaps between the matmuls of a decode step, far shorter than a
// pause between requests.
constexpr int kSpinsBeforeSleep = 20000;

// The claim word's fields.
constexpr int kNextBits = 20, kCountBits = 20;
constexpr uint64_t kFieldMask = (uint64_t(1) << kNextBits) - 1;
inline uint32_t generation_of(uint64_t w) { return uint32_t(w >> (kNextBits + kCountBits)); }
inline int64_t count_of(uint64_t w) { return int64_t((w >> kNextBits) & kFieldMask); }
inline int64_t next_of(uint64_t w) { return int64_t(w & kFieldMask); }
inline uint64_t claim_word(uint32_t generation, int64_t count) {
  return (uint64_t(generation & 0xFFFFFF) << (kNextBits + kCountBits)) | (uint64_t(count) << kNextBits);
}

}  // namespace

int default_thread_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_thread_count()) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  claim_.fetch_add(claim_word(1, 0));  // a new generation with no tasks wakes the spinners
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  for (auto& t : workers_) t.join();
}

int64_t ThreadPool::chunk_size(int64_t n, int64_t grain) const {
  const int64_t per_thread = 4 * int64_t(n_threads_);
  const int64_t chunk = std::max<int64_t>(std::max<int64_t>(grain, 1), (n + per_thread - 1) / per_thread);
  return std::max(chunk, (n + kMaxTasks - 1) / kMaxTasks);
}

int64_t ThreadPool::work_on(uint32_t generation) {
  int64_t ran = 0;
  uint64_t w = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (generation_of(w) != (generation & 0xFFFFFF) || next_of(w) >= count_of(w)) return ran;
    // Success means the word still names this job, so its function and context (written
    // before the job was published) stay valid until this task is counted done.
    if (!claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    fn_.load(std::memory_order_relaxed)(context_.load(std::memory_order_relaxed), next_of(w));
    done_.fetch_add(1, std::memory_order_release);
    ++ran;
    w = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::run_job(int64_t n_tasks, TaskFn fn, void* context) {
  if (n_tasks <= 0) return;
  if (n_tasks > kMaxTasks) fail("thread pool: {} tasks in one job (at most {})", n_tasks, kMaxTasks);
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(context, t);
    return;
  }
  // No task of the previous job is claimed or running: it finished before run_job returned.
  const uint32_t generation = generation_of(claim_.load(std::memory_order_relaxed)) + 1;
  fn_.store(fn, std::memory_order_relaxed);
  context_.store(context, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  claim_.store(claim_word(generation, n_tasks), std::memory_order_seq_cst);  // publishes the stores above
  if (sleepers_.load() > 0) {
    // A worker that counted itself asleep either sees the new generation under the lock,
    // or is inside wait() and gets this notification.
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  uint64_t w = claim_.load(std::memory_order_acquire);
  try {
    for (;;) {
      if (next_of(w) >= n_tasks) break;
      if (!claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      fn(context, next_of(w));
      done_.fetch_add(1, std::memory_order_relaxed);
      w = claim_.load(std::memory_order_acquire);
    }
  } catch (...) {
    // Close the job: tasks nobody claimed will not run; count them, and the failed one, done.
    const uint64_t before = claim_.exchange(claim_word(generation, n_tasks) | uint64_t(n_tasks));
    done_.fetch_add(n_tasks - std::min(n_tasks, next_of(before)) + 1);
    while (done_.load(std::memory_order_acquire) < n_tasks) cpu_relax();
    throw;
  }
  // Wait for the tasks the workers claimed; a worker descheduled in the middle of one is the
  // only thing that can hold the caller here, so after a while give up the core to it.
  for (int spin = 0; done_.load(std::memory_order_acquire) < n_tasks; ++spin) {
    cpu_relax();
    if (spin > kSpinsBeforeSleep) std::this_thread::yield();
  }
}

void ThreadPool::worker_loop() {
  // Not the current generation: a worker may start running only after many jobs (the caller
  // does not wait for it), even after the destructor has bumped the generation.
  uint32_t seen = 0;  // the constructor's
  for (;;) {
    int spin = 0;
    while (generation_of(claim_.load(std::memory_order_acquire)) == seen && spin < kSpinsBeforeSleep) {
      cpu_relax();
      ++spin;
    }
    if (generation_of(claim_.load(std::memory_order_acquire)) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1);  // seq_cst, before re-reading the generation
      wake_.wait(lock, [&] { return generation_of(claim_.load()) != seen; });
      sleepers_.fetch_sub(1);
    }
    // The generation before the stop flag: the destructor sets the flag before it bumps the
    // generation, so a worker that reads the destructor's generation also sees the flag.
    seen = generation_of(claim_.load(std::memory_order_acquire));
    if (stop_.load()) return;
    work_on(seen);
  }
}

}  // namespace kiln
