#pragma once
// A fixed pool of worker threads for data-parallel loops. The calling thread takes part,
// so a pool of N threads runs N-1 workers.
//
// A job is a number of tasks that the caller and the workers claim one at a time from a
// shared counter. The caller never waits for a worker to show up: a worker that is
// descheduled (the machine is shared) or asleep when a job is posted just claims nothing,
// and the caller runs the tasks itself; it waits only for tasks a worker has claimed and not
// yet finished. (A pool whose jobs end at a barrier of all threads runs at the speed of its
// slowest thread: on 2 busy cores that made decode 4x slower than one thread.)
//
// Jobs are short and frequent (decode runs about a hundred matmuls per token), so hand-off
// is lock-free: the caller publishes a job by writing a new generation into the claim word
// that spinning workers watch; a worker sleeps on a condition variable only after spinning
// a while with nothing to do, and the caller takes the lock to wake it only when some worker
// is asleep.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  // n_threads <= 0 picks the number of cores the process may use.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // The most tasks one job may have.
  static constexpr int64_t kMaxTasks = (int64_t(1) << 20) - 1;

  // Runs fn(task) once for every task in [0, n_tasks), spread over the caller and the
  // workers, and returns when all have finished. Tasks run in no particular order and
  // several may run on the same thread, one after another. An exception from fn on the
  // calling thread stops the job (tasks not yet claimed do not run) and is rethrown once
  // the claimed tasks have finished; fn must not throw on a worker.
  template <typename Fn>
  void run_tasks(int64_t n_tasks, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run_job(n_tasks, [](void* f, int64_t task) { (*static_cast<F*>(f))(task); },
            const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Runs fn(index) once for each index in [0, size()).
  template <typename Fn>
  void run(Fn&& fn) {
    run_tasks(n_threads_, [&fn](int64_t task) { fn(int(task)); });
  }

  // Splits [0, n) into contiguous chunks of at least `grain` items and runs fn(begin, end)
  // on each: a few chunks per thread, so that a thread slowed down by the OS or by other
  // work on the machine takes fewer of them instead of holding everyone up.
  template <typename Fn>
  void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    const int64_t chunk = chunk_size(n, grain);
    if (chunk >= n) {
      fn(int64_t(0), n);
      return;
    }
    run_tasks((n + chunk - 1) / chunk, [&](int64_t task) {
      const int64_t begin = task * chunk;
      fn(begin, std::min(n, begin + chunk));
    });
  }

  // The chunk parallel_for uses: about n / (4 * size()) items, at least `grain`.
  int64_t chunk_size(int64_t n, int64_t grain) const;

 private:
  using TaskFn = void (*)(void* context, int64_t task);
  void run_job(int64_t n_tasks, TaskFn fn, void* context);
  // Claims and runs tasks of job `generation` while there are any; returns how many ran.
  int64_t work_on(uint32_t generation);
  void worker_loop();

  int n_threads_;
  std::vector<std::thread> workers_;

  // The claim word: generation (24 bits) | number of tasks (20 bits) | next task (20 bits).
  // Packing them in one word lets a worker check, in the same compare-and-swap that claims
  // a task, that the task belongs to the job it read.
  std::atomic<uint64_t> claim_{0};
  // The current job; written before its generation is published, read after a claim.
  std::atomic<TaskFn> fn_{nullptr};
  std::atomic<void*> context_{nullptr};
  std::atomic<int64_t> done_{0};  // tasks of the current job finished (or given up)

  std::mutex mutex_;  // guards sleeping only
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// Threads to use by default: the cores this process may run on.
int default_thread_count();

}  // namespace kiln
