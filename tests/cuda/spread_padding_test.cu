// spread_padding (occupancy.h): the dynamic shared memory it returns makes exactly `want`
// blocks of a kernel fit a multiprocessor, as the CUDA occupancy calculator counts them, for
// every count below what fits without it; it returns 0 where no cap is needed (want at or
// above that count) or asked (fewer than at_least fit). spread_shared_bytes, for a kernel that
// takes dynamic shared memory of its own: at least that much, and exactly `want` blocks fit
// with it, or that much unchanged where no more is needed. The kernel: 128 threads, 10 KB of
// static shared memory, so that 16 blocks fit (the warp limit, 64 a multiprocessor) on sm_90.
// Skips without a GPU.
#include <gtest/gtest.h>

#include "backend/cuda/occupancy.h"
#include "cuda_test_support.h"

namespace kiln::cuda::testing {
namespace {

template <int kTag>  // one instance per test: each sets its own attributes
__global__ void ten_kilobytes_kernel(float* out) {
  __shared__ float buffer[2560];
  buffer[threadIdx.x] = float(threadIdx.x);
  __syncthreads();
  if (out) out[threadIdx.x] = buffer[(threadIdx.x + 1) % blockDim.x];
}

int fit(const void* kernel, size_t dynamic_bytes) {
  int n = 0;
  EXPECT_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, 128, dynamic_bytes), cudaSuccess);
  return n;
}

TEST(SpreadPadding, CapsTheBlocksAMultiprocessorAtTheCountAsked) {
  KILN_REQUIRE_GPU();
  const void* kernel = reinterpret_cast<const void*>(ten_kilobytes_kernel<0>);
  const int natural = fit(kernel, 0);
  ASSERT_GE(natural, 4) << "the test kernel should fit several blocks a multiprocessor";
  for (int want = 1; want < natural; ++want) {
    const size_t padding = spread_padding(kernel, 128, want, 0);
    EXPECT_GT(padding, 0u) << "want " << want;
    EXPECT_EQ(fit(kernel, padding), want) << "want " << want << ", padding " << padding;
  }
  EXPECT_EQ(spread_padding(kernel, 128, natural, 0), 0u);
  EXPECT_EQ(spread_padding(kernel, 128, natural + 3, 0), 0u);
  EXPECT_EQ(spread_padding(kernel, 128, 2, natural + 1), 0u) << "fewer than at_least fit: no cap";
  EXPECT_GT(spread_padding(kernel, 128, 2, natural), 0u);
}

TEST(SpreadPadding, CappedKernelRuns) {
  KILN_REQUIRE_GPU();
  const void* kernel = reinterpret_cast<const void*>(ten_kilobytes_kernel<0>);
  const size_t padding = spread_padding(kernel, 128, 1, 0);
  ASSERT_GT(padding, 0u);
  DeviceBuffer out(128 * sizeof(float));
  ASSERT_TRUE(out.ok());
  ten_kilobytes_kernel<0><<<264, 128, padding>>>(out.as<float>());
  KILN_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = to_host<float>(out, 128);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(got[size_t(i)], float((i + 1) % 128)) << i;
}

TEST(SpreadPadding, SharedBytesOnTopOfAKernelsOwn) {
  KILN_REQUIRE_GPU();
  const void* kernel = reinterpret_cast<const void*>(ten_kilobytes_kernel<1>);
  constexpr size_t kMaxDynamic = 200 * 1024;
  KILN_CUDA_OK(cudaFuncSetAttribute(ten_kilobytes_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(kMaxDynamic)));
  for (const size_t own : {size_t(0), size_t(20 * 1024)}) {
    const int natural = fit(kernel, own);
    ASSERT_GE(natural, 4) << "own " << own;
    for (int want = 1; want < natural; ++want) {
      const size_t bytes = spread_shared_bytes(kernel, 128, own, want, kMaxDynamic);
      EXPECT_GT(bytes, own) << "own " << own << ", want " << want;
      EXPECT_LE(bytes, kMaxDynamic) << "own " << own << ", want " << want;
      EXPECT_EQ(fit(kernel, bytes), want) << "own " << own << ", want " << want << ", bytes " << bytes;
    }
    EXPECT_EQ(spread_shared_bytes(kernel, 128, own, natural, kMaxDynamic), own) << "own " << own;
    EXPECT_EQ(spread_shared_bytes(kernel, 128, own, natural + 2, kMaxDynamic), own) << "own " << own;
  }
  // A limit too low to cap at one block: unchanged.
  EXPECT_EQ(spread_shared_bytes(kernel, 128, 0, 1, 16 * 1024), 0u);
  DeviceBuffer out(128 * sizeof(float));
  ASSERT_TRUE(out.ok());
  ten_kilobytes_kernel<1><<<264, 128, spread_shared_bytes(kernel, 128, 0, 1, kMaxDynamic)>>>(out.as<float>());
  KILN_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = to_host<float>(out, 128);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(got[size_t(i)], float((i + 1) % 128)) << i;
}

}  // namespace
}  // namespace kiln::cuda::testing
