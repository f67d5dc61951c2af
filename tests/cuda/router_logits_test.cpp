// The prefill router product (router_logits.h) against a double-precision reference written
// here: the model's shape (512 tokens x 2048 by 128 experts), gpt-oss's (2880 wide, 32
// experts, bias) and awkward ones (5 and 300 experts, k 36, 68 and 4100, token counts off
// the 64-token tiles), rows not packed. Bound: each output is f32 sums of at most `chunk`
// products per block, then the blocks' shares added: |err| <= (chunk + blocks + 2) * 2^-24 *
// sum_k |x w| (first order). The padding after each logits row must stay untouched, and runs
// with each block placement must give the same bits. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cuda/router_logits.h"
#include "cuda_test_support.h"

namespace kiln::cuda::testing {
namespace {

struct RouterCase {
  int64_t T, E, K;
  bool bias;
};

TEST(CudaRouterLogits, MatchesDoubleReference) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261202);
  const RouterCase cases[] = {{512, 128, 2048, false}, {77, 32, 2880, true}, {9, 5, 68, true},
                              {130, 300, 4100, false}, {64, 64, 256, false}, {200, 128, 36, true}};
  for (const RouterCase& c : cases) {
    const std::string what = "router_logits T " + std::to_string(c.T) + " E " + std::to_string(c.E) + " K " +
                             std::to_string(c.K) + (c.bias ? " bias" : "");
    const int64_t x_stride = c.K + 4, r_stride = c.K + 8, l_stride = c.E + 3;
    const std::vector<float> x = random_floats(rng, size_t(c.T * x_stride), -2.0f, 2.0f);
    const std::vector<float> router = random_floats(rng, size_t(c.E * r_stride), -0.1f, 0.1f);
    const std::vector<float> bias = random_floats(rng, size_t(c.E), -0.5f, 0.5f);
    const RouterSplit split = router_logits_split(c.K);
    ASSERT_GE(split.blocks, 1) << what;
    ASSERT_GE(int64_t(split.blocks) * split.chunk, c.K) << what;

    std::vector<double> ref(size_t(c.T * c.E)), tol(ref.size());
    const double unit = std::ldexp(1.0, -24) * double(split.chunk + split.blocks + 2);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t e = 0; e < c.E; ++e) {
        double dot = 0, mag = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = double(x[size_t(t * x_stride + k)]) * router[size_t(e * r_stride + k)];
          dot += p, mag += std::fabs(p);
        }
        if (c.bias) dot += bias[size_t(e)], mag += std::fabs(bias[size_t(e)]);
        ref[size_t(t * c.E + e)] = dot, tol[size_t(t * c.E + e)] = unit * mag + 1e-30;
      }

    DeviceBuffer d_x = to_device(x), d_router = to_device(router), d_bias = to_device(bias);
    DeviceBuffer d_logits(size_t(c.T * l_stride) * 4);
    RouterLogitsArgs a;
    a.x = d_x.as<float>(), a.x_stride = x_stride;
    a.router = d_router.as<float>(), a.router_stride = r_stride;
    a.bias = c.bias ? d_bias.as<float>() : nullptr;
    a.logits = d_logits.as<float>(), a.logits_stride = l_stride;
    a.n_tokens = c.T, a.n_expert = c.E, a.k = c.K;
    ASSERT_EQ(router_logits_refusal(a), "") << what;

    // Every placement (where the blocks run, not what they add): the same bits each run.
    std::vector<float> first;
    for (int run = 0; run < 3; ++run) {
      a.placement = run == 0   ? RouterPlacement::OnePerSm
                    : run == 1 ? RouterPlacement::Spread
                               : RouterPlacement::Default;
      d_logits.poison();
      KILN_STATUS_OK(router_logits(a, nullptr));
      const std::vector<float> all = to_host<float>(d_logits, size_t(c.T * l_stride));
      std::vector<float> got;
      for (int64_t t = 0; t < c.T; ++t) {
        got.insert(got.end(), all.begin() + t * l_stride, all.begin() + t * l_stride + c.E);
        for (int64_t e = c.E; e < l_stride; ++e) {
          uint32_t bits;
          std::memcpy(&bits, &all[size_t(t * l_stride + e)], 4);
          ASSERT_EQ(bits, 0xFFFFFFFFu) << what << ": padding of row " << t << " column " << e << " was written";
        }
      }
      EXPECT_TRUE(all_close(got, ref, tol, what + " run " + std::to_string(run)));
      if (run == 0) {
        first = got;
      } else {
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(std::memcmp(&got[i], &first[i], 4), 0)
              << what << ": run " << run << " differs at [" << i << "]: " << got[i] << " vs " << first[i];
      }
    }
  }
}

TEST(CudaRouterLogits, RefusesWhatItCannotTake) {
  // The refusal reads no memory: host pointers of the right alignment stand in.
  alignas(16) static float buf[1024];
  RouterLogitsArgs a;
  a.x = buf, a.x_stride = 64, a.router = buf, a.router_stride = 64;
  a.logits = buf, a.logits_stride = 8, a.n_tokens = 4, a.n_expert = 8, a.k = 64;
  EXPECT_EQ(router_logits_refusal(a), "");
  RouterLogitsArgs odd_k = a;
  odd_k.k = 62;
  EXPECT_NE(router_logits_refusal(odd_k), "");
  RouterLogitsArgs unaligned = a;
  unaligned.x = buf + 1;
  EXPECT_NE(router_logits_refusal(unaligned), "");
  RouterLogitsArgs short_stride = a;
  short_stride.router_stride = 60;
  EXPECT_NE(router_logits_refusal(short_stride), "");
  EXPECT_FALSE(router_logits(odd_k, nullptr).ok());
}

}  // namespace
}  // namespace kiln::cuda::testing
