// A pass's uploads and downloads inside its graph (step_io.h): the data each op sees and each
// download returns must be the data of its own pass, in order, whether the download is taken
// at once, after later passes reused its step slot (it then moved to its ticket's buffer),
// or after a synchronous download in between; uploads too large for a slot take the old path.
// Run with the step slots and without (CudaOptions::step_io_in_graph), graphs on. The
// expected values are computed on the host: y = 2 x is exact in f32. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_support.h"

namespace kiln::testing {
namespace {

class StepIoPasses : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPU();
    CudaOptions o;
    o.step_io_in_graph = GetParam();
    gpu_ = std::make_unique<CudaBackend>(o);
  }

  // Buffers x and y of n floats.
  void allocate(int64_t n) {
    x_buf_ = gpu_->allocate(size_t(n) * sizeof(float));
    y_buf_ = gpu_->allocate(size_t(n) * sizeof(float));
    x_ = x_buf_->view(GgmlType::F32, {n});
    y_ = y_buf_->view(GgmlType::F32, {n});
  }
  std::vector<float> random_values(int64_t n) { return cuda::testing::random_floats(rng_, size_t(n), -4.0f, 4.0f); }
  // One pass: upload v to x, y = 2 x.
  void pass(const std::vector<float>& v) {
    gpu_->upload(v.data(), x_, v.size() * sizeof(float));
    gpu_->scale(x_, 2.0f, y_);
  }
  static std::vector<float> doubled(const std::vector<float>& v) {
    std::vector<float> d(v);
    for (float& f : d) f *= 2.0f;
    return d;
  }

  std::mt19937_64 rng_{20261201};
  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<Buffer> x_buf_, y_buf_;
  Tensor x_, y_;
};

TEST_P(StepIoPasses, DownloadsTakenLateReturnTheirOwnPass) {
  const int64_t n = 1000;  // 4,000 bytes: within one async download
  allocate(n);
  // Six passes queued before any is taken: more tickets than step slots.
  for (int round = 0; round < 3; ++round) {
    std::deque<std::pair<uint64_t, std::vector<float>>> pending;
    for (int i = 0; i < 6; ++i) {
      const std::vector<float> v = random_values(n);
      pass(v);
      pending.emplace_back(gpu_->download_async(y_, size_t(n) * sizeof(float)), doubled(v));
    }
    for (int i = 0; !pending.empty(); ++i) {
      std::vector<float> got(size_t(n), -1.0f);
      gpu_->finish_download(pending.front().first, got.data(), got.size() * sizeof(float));
      EXPECT_EQ(got, pending.front().second) << "round " << round << ", pass " << i;
      pending.pop_front();
    }
  }
}

TEST_P(StepIoPasses, OneStepAheadLikeGreedyDecoding) {
  const int64_t n = 37;
  allocate(n);
  std::deque<std::pair<uint64_t, std::vector<float>>> pending;
  for (int i = 0; i < 40; ++i) {
    const std::vector<float> v = random_values(n);
    pass(v);
    pending.emplace_back(gpu_->download_async(y_, size_t(n) * sizeof(float)), doubled(v));
    if (pending.size() > 1) {
      std::vector<float> got(static_cast<size_t>(n));
      gpu_->finish_download(pending.front().first, got.data(), got.size() * sizeof(float));
      EXPECT_EQ(got, pending.front().second) << "pass " << i - 1;
      pending.pop_front();
    }
    if (i % 9 == 4) {  // a synchronous download between two queued passes
      std::vector<float> got(static_cast<size_t>(n));
      gpu_->download(y_, got.data(), got.size() * sizeof(float));
      EXPECT_EQ(got, doubled(v)) << "synchronous download after pass " << i;
    }
  }
  std::vector<float> got(static_cast<size_t>(n));
  gpu_->finish_download(pending.front().first, got.data(), got.size() * sizeof(float));
  EXPECT_EQ(got, pending.front().second) << "last pass";
}

TEST_P(StepIoPasses, LargeUploadsAndSeveralUploadsAPass) {
  const int64_t n = 20000;  // 80,000 bytes: more than a step slot holds
  allocate(n);
  for (int i = 0; i < 4; ++i) {
    const std::vector<float> big = random_values(n);
    pass(big);
    std::vector<float> got(static_cast<size_t>(n));
    gpu_->download(y_, got.data(), got.size() * sizeof(float));
    EXPECT_EQ(got, doubled(big)) << "large upload " << i;
    // Many small uploads into parts of x in one pass, each overwriting the last's first part.
    std::vector<float> expect = big;
    for (int k = 0; k < 24; ++k) {
      const std::vector<float> part = random_values(1 + 97 * k);
      gpu_->upload(part.data(), x_buf_->view(GgmlType::F32, {int64_t(part.size())}), part.size() * sizeof(float));
      std::copy(part.begin(), part.end(), expect.begin());
    }
    gpu_->scale(x_, 2.0f, y_);
    gpu_->download(y_, got.data(), got.size() * sizeof(float));
    EXPECT_EQ(got, doubled(expect)) << "small uploads, round " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, StepIoPasses, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "InGraph" : "OnStream"; });

}  // namespace
}  // namespace kiln::testing
