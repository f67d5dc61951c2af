#pragma once
// A fixed pool of worker threads for data-parallel loops. The calling thread takes part,
// so a pool of N threads runs N-1 workers. Jobs are short and frequent (decode runs about
// a hundred matmuls per token), so hand-off is lock-free: the caller publishes the job by
// bumping a generation counter that spinning workers watch; a worker sleeps on a condition
// variable only after spinning a while with nothing to do, and the caller takes the lock
// to wake it only when some worker is asleep.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  // n_threads <= 0 picks the number of physical cores the process may use.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index) once on each of the size() threads and waits for all.
  void run(const std::function<void(int thread_index)>& fn);

  // Splits [0, n) into contiguous chunks of at least `grain` items, one per thread, and
  // runs fn(begin, end) on each.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;  // guards sleeping only
  std::condition_variable wake_;
  std::atomic<const std::function<void(int)>*> job_{nullptr};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// Threads to use by default: the cores this process may run on.
int default_thread_count();

}  // namespace kiln
