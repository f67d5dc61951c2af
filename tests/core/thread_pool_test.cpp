// ThreadPool: every index runs exactly once per job, across many back-to-back jobs (the
// spinning hand-off) and after the workers have fallen asleep (the condition-variable path).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace kiln {
namespace {

TEST(ThreadPool, RunCallsEveryIndexOnce) {
  for (int n : {1, 2, 3}) {
    ThreadPool pool(n);
    std::vector<std::atomic<int>> calls(n);
    for (int job = 0; job < 1000; ++job) pool.run([&](int i) { calls[i].fetch_add(1); });
    for (int i = 0; i < n; ++i) EXPECT_EQ(calls[i].load(), 1000) << "threads=" << n << " index " << i;
  }
}

TEST(ThreadPool, ParallelForCoversRangeOnce) {
  ThreadPool pool(2);
  for (int64_t n : {1, 2, 7, 33, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " item " << i;
  }
}

TEST(ThreadPool, WakesSleepingWorkers) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  for (int job = 0; job < 5; ++job) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // longer than the spin
    pool.run([&](int) { total.fetch_add(1); });
  }
  EXPECT_EQ(total.load(), 10);
}

}  // namespace
}  // namespace kiln
