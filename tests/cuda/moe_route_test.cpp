// The CUDA MoE routing kernel (ops_extra.h's moe_route, moe_route.cu) against a double-
// precision reference written here: softmax / sigmoid / softmax-over-the-chosen gating,
// selection bias, normalization and scale, at model sizes (128 and 256 experts, top 8) and
// awkward ones (5, 33, 300, 1024 experts; top 1 and top 32), T up to 300. Ties and
// near-ties: the reference picks the larger choice, the lower index first among equals; a
// GPU pick that differs from it only between two choices within 1e-5 (float scores against
// double) is accepted and counted, at most one per case. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/cuda/ops_extra.h"
#include "cuda_test_support.h"

namespace kiln::cuda::testing {
namespace {

struct RouteCase {
  int64_t n_expert;
  int n_used, gating;
  bool normalize, bias;
  int64_t T;
};

struct RouteRef {
  std::vector<int32_t> ids;
  std::vector<double> w, choice;  // w [T][n_used]; choice [T][n_expert]
};

RouteRef reference(const RouteCase& c, const std::vector<float>& logits, const std::vector<float>& bias, float scale) {
  RouteRef r;
  r.ids.resize(size_t(c.T * c.n_used)), r.w.resize(r.ids.size()), r.choice.resize(size_t(c.T * c.n_expert));
  std::vector<double> score(size_t(c.n_expert));
  for (int64_t t = 0; t < c.T; ++t) {
    const float* l = logits.data() + t * c.n_expert;
    const double m = *std::max_element(l, l + c.n_expert);
    double sum = 0;
    for (int64_t e = 0; e < c.n_expert; ++e) {
      const double v = l[e];
      score[size_t(e)] = c.gating == 0 ? std::exp(v - m) : c.gating == 1 ? 1.0 / (1.0 + std::exp(-v)) : v;
      sum += score[size_t(e)];
    }
    if (c.gating == 0)
      for (double& s : score) s /= sum;
    double* choice = r.choice.data() + t * c.n_expert;
    for (int64_t e = 0; e < c.n_expert; ++e) choice[e] = score[size_t(e)] + (c.bias ? double(bias[size_t(e)]) : 0.0);
    std::vector<int32_t> order(size_t(c.n_expert));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
    double* w = r.w.data() + t * c.n_used;
    for (int j = 0; j < c.n_used; ++j) r.ids[size_t(t * c.n_used + j)] = order[size_t(j)], w[j] = score[size_t(order[size_t(j)])];
    if (c.gating == 2) {
      double s = 0;
      for (int j = 0; j < c.n_used; ++j) s += (w[j] = std::exp(w[j] - score[size_t(order[0])]));
      for (int j = 0; j < c.n_used; ++j) w[j] /= s;
    }
    if (c.normalize) {
      double s = 0;
      for (int j = 0; j < c.n_used; ++j) s += w[j];
      for (int j = 0; j < c.n_used; ++j) w[j] /= s;
    }
    for (int j = 0; j < c.n_used; ++j) w[j] *= scale;
  }
  return r;
}

TEST(CudaMoeRoute, MatchesDoubleReference) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261130);
  std::vector<RouteCase> cases;
  for (int gating = 0; gating < 3; ++gating)
    for (const auto& [n_expert, n_used] :
         {std::pair<int64_t, int>{5, 2}, {33, 1}, {128, 8}, {256, 8}, {300, 8}, {1024, 32}, {40, 32}})
      for (const int64_t T : {1, 7, 300}) cases.push_back({n_expert, n_used, gating, gating != 2, gating == 1, T});
  for (const RouteCase& c : cases) {
    const std::string what = "moe_route gating " + std::to_string(c.gating) + " experts " + std::to_string(c.n_expert) +
                             " used " + std::to_string(c.n_used) + " T " + std::to_string(c.T);
    const int64_t stride = c.n_expert + 3;  // rows not packed
    std::vector<float> logits_padded(size_t(stride * c.T), std::nanf("")), logits(size_t(c.n_expert * c.T));
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t e = 0; e < c.n_expert; ++e)
        logits_padded[size_t(t * stride + e)] = logits[size_t(t * c.n_expert + e)] = u(rng);
    std::vector<float> bias(size_t(c.n_expert));
    std::uniform_real_distribution<float> ub(-0.2f, 0.2f);
    for (float& b : bias) b = ub(rng);
    const float scale = 2.5f;
    const RouteRef ref = reference(c, logits, bias, scale);

    DeviceBuffer d_logits = to_device(logits_padded), d_bias = to_device(bias);
    DeviceBuffer d_ids(size_t(c.T * c.n_used) * 4), d_w(size_t(c.T * c.n_used) * 4);
    d_ids.poison(), d_w.poison();
    MoeRouteArgs a;
    a.logits = d_logits.as<float>(), a.logits_stride = stride, a.n_expert = c.n_expert, a.n_tokens = c.T;
    a.n_used = c.n_used, a.gating = c.gating, a.normalize = c.normalize, a.scale = scale;
    a.selection_bias = c.bias ? d_bias.as<float>() : nullptr;
    a.ids = d_ids.as<int32_t>(), a.ids_stride = c.n_used, a.weights = d_w.as<float>(), a.weights_stride = c.n_used;
    KILN_STATUS_OK(moe_route(a, nullptr));
    const std::vector<int32_t> ids = to_host<int32_t>(d_ids, size_t(c.T * c.n_used));
    const std::vector<float> w = to_host<float>(d_w, size_t(c.T * c.n_used));

    int near_ties = 0;
    std::vector<float> got;
    std::vector<double> want;
    for (int64_t t = 0; t < c.T; ++t) {
      bool tie = false;
      for (int j = 0; j < c.n_used; ++j) {
        const int32_t want_id = ref.ids[size_t(t * c.n_used + j)], got_id = ids[size_t(t * c.n_used + j)];
        if (want_id == got_id) continue;
        const double* choice = ref.choice.data() + t * c.n_expert;
        const bool close = got_id >= 0 && got_id < c.n_expert &&
                           std::fabs(choice[want_id] - choice[got_id]) <= 1e-5 * std::fabs(choice[want_id]);
        EXPECT_TRUE(close) << what << ": token " << t << " slot " << j << " expert " << got_id << ", want " << want_id;
        tie = true;
      }
      near_ties += tie;
      if (tie) continue;
      got.insert(got.end(), w.begin() + t * c.n_used, w.begin() + (t + 1) * c.n_used);
      want.insert(want.end(), ref.w.begin() + t * c.n_used, ref.w.begin() + (t + 1) * c.n_used);
    }
    EXPECT_LE(near_ties, 1) << what;
    EXPECT_TRUE(all_close(got, want, 1e-5, 1e-7, what));
  }
}

// Exact ties (equal logits): the lower expert index comes first, as the CPU's stable sort.
TEST(CudaMoeRoute, TiesKeepTheLowerIndexFirst) {
  KILN_REQUIRE_GPU();
  const int64_t n_expert = 128, T = 3;
  const int n_used = 8;
  std::vector<float> logits(size_t(n_expert * T), 0.5f);
  logits[size_t(1 * n_expert + 100)] = 2.0f;  // token 1: expert 100 first, then 0..6
  for (int64_t e = 64; e < n_expert; ++e) logits[size_t(2 * n_expert + e)] = 1.0f;  // token 2: 64..71
  DeviceBuffer d_logits = to_device(logits), d_ids(size_t(T * n_used) * 4), d_w(size_t(T * n_used) * 4);
  MoeRouteArgs a;
  a.logits = d_logits.as<float>(), a.logits_stride = n_expert, a.n_expert = n_expert, a.n_tokens = T;
  a.n_used = n_used, a.gating = 0, a.normalize = true;
  a.ids = d_ids.as<int32_t>(), a.ids_stride = n_used, a.weights = d_w.as<float>(), a.weights_stride = n_used;
  KILN_STATUS_OK(moe_route(a, nullptr));
  const std::vector<int32_t> ids = to_host<int32_t>(d_ids, size_t(T * n_used));
  const std::vector<int32_t> want = {0, 1, 2, 3, 4, 5, 6, 7, 100, 0, 1, 2, 3, 4, 5, 6, 64, 65, 66, 67, 68, 69, 70, 71};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(ids[i], want[i]) << "token " << i / n_used << " slot " << i % n_used;
}

TEST(CudaMoeRoute, RefusesWhatItCannotRoute) {
  KILN_REQUIRE_GPU();
  MoeRouteArgs a;
  a.n_expert = 2048, a.n_used = 8, a.n_tokens = 1;
  EXPECT_FALSE(moe_route(a, nullptr).ok()) << "2048 experts";
  a.n_expert = 128, a.n_used = 33;
  EXPECT_FALSE(moe_route(a, nullptr).ok()) << "33 used";
  a.n_used = 0;
  EXPECT_FALSE(moe_route(a, nullptr).ok()) << "0 used";
}

}  // namespace
}  // namespace kiln::cuda::testing
