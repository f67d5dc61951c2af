// ThreadPool: every index runs exactly once per job, across many back-to-back jobs (the
// spinning hand-off) and after the workers have fallen asleep (the condition-variable path).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
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

TEST(ThreadPool, RunTasksRunsEachTaskOnce) {
  for (int n : {1, 2, 3}) {
    ThreadPool pool(n);
    for (int64_t tasks : {int64_t(1), int64_t(2), int64_t(5), int64_t(1000)}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(tasks));
      for (int job = 0; job < 50; ++job) pool.run_tasks(tasks, [&](int64_t t) { hits[size_t(t)].fetch_add(1); });
      for (int64_t t = 0; t < tasks; ++t)
        ASSERT_EQ(hits[size_t(t)].load(), 50) << "threads=" << n << " tasks=" << tasks << " task " << t;
    }
  }
}

TEST(ThreadPool, ManyShortPoolsShutDown) {
  // Workers may first run after the caller has finished every job and the destructor has
  // started; they must still see the stop.
  for (int i = 0; i < 200; ++i) {
    ThreadPool pool(3);
    std::atomic<int> total{0};
    for (int job = 0; job < 20; ++job) pool.run([&](int) { total.fetch_add(1); });
    ASSERT_EQ(total.load(), 60) << "pool " << i;
  }
}

TEST(ThreadPool, ExceptionOnCallerStopsJobAndIsRethrown) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  // The first task the calling thread runs throws (workers take 1 ms a task, so the caller
  // gets some task); exceptions must not happen on workers.
  const std::thread::id caller = std::this_thread::get_id();
  EXPECT_THROW(pool.run_tasks(100,
                              [&](int64_t) {
                                if (std::this_thread::get_id() == caller) throw std::runtime_error("caller's task");
                                std::this_thread::sleep_for(std::chrono::milliseconds(1));
                                ran.fetch_add(1);
                              }),
               std::runtime_error);
  EXPECT_LT(ran.load(), 100);
  std::atomic<int> after{0};
  pool.run_tasks(10, [&](int64_t) { after.fetch_add(1); });  // the pool still works
  EXPECT_EQ(after.load(), 10);
}

}  // namespace
}  // namespace kiln
