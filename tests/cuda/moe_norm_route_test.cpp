// The fused MoE front (ops_extra.h's moe_norm_route, moe_router.cu: RMS norm, f32 router
// logits, routing in one launch) against a double-precision reference written here, at model
// sizes (2048 wide, 128 experts top 8; 2880 wide, 32 experts top 4 with a router bias) and
// awkward ones (5 and 300 experts, widths 68 and 4100: past the columns the kernel holds in
// registers), 1 to 8 tokens, rows not packed (16-byte aligned). Each case runs four times, twice
// as the kernel chooses (a thread block cluster per token where its blocks fit one: up to 128
// experts) and twice with the per-token tickets forced: the tickets must come back to zero, or
// the next run would route nothing, and both ways give the same bits. Near-ties: a pick
// that differs from the reference only between two choices within 1e-4 (float logits
// against double) is accepted, at most one per case. Where the width is a multiple of 32, the
// second run of each way also writes normed's int8 copy (MoeNormRouteArgs::q8): it must be
// quantize_q8's bytes of the normed row the kernel wrote, and leave every other output as the
// runs without it. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/cuda/ops_extra.h"
#include "cuda_test_support.h"

namespace kiln::cuda::testing {
namespace {

struct FrontCase {
  int64_t n_embd, n_expert;
  int n_used, gating;
  bool normalize, norm_weight, router_bias;
  int64_t T;
};

struct FrontRef {
  std::vector<double> normed, logits, w, choice;  // [T][n_embd], [T][n_expert], [T][n_used], [T][n_expert]
  std::vector<double> logit_scale;                // sum |w x| per logit, for its tolerance
  std::vector<int32_t> ids;
};

FrontRef reference(const FrontCase& c, const std::vector<float>& x, int64_t x_stride, const std::vector<float>& nw,
                   const std::vector<float>& router, int64_t r_stride, const std::vector<float>& rb, float eps,
                   float scale) {
  FrontRef r;
  const int64_t D = c.n_embd, E = c.n_expert, K = c.n_used;
  r.normed.resize(size_t(c.T * D)), r.logits.resize(size_t(c.T * E)), r.logit_scale.resize(r.logits.size());
  r.choice.resize(r.logits.size()), r.w.resize(size_t(c.T * K)), r.ids.resize(r.w.size());
  for (int64_t t = 0; t < c.T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x[size_t(t * x_stride + i)]) * x[size_t(t * x_stride + i)];
    const double inv = 1.0 / std::sqrt(ss / double(D) + double(eps));
    double* n = r.normed.data() + t * D;
    for (int64_t i = 0; i < D; ++i) n[i] = x[size_t(t * x_stride + i)] * inv * (c.norm_weight ? nw[size_t(i)] : 1.0);
    std::vector<double> score(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      double dot = c.router_bias ? double(rb[size_t(e)]) : 0.0, mag = 0;
      for (int64_t i = 0; i < D; ++i) {
        dot += double(router[size_t(e * r_stride + i)]) * n[i];
        mag += std::fabs(double(router[size_t(e * r_stride + i)]) * n[i]);
      }
      r.logits[size_t(t * E + e)] = dot, r.logit_scale[size_t(t * E + e)] = mag;
    }
    const double* l = r.logits.data() + t * E;
    const double m = *std::max_element(l, l + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      score[size_t(e)] = c.gating == 0 ? std::exp(l[e] - m) : c.gating == 1 ? 1.0 / (1.0 + std::exp(-l[e])) : l[e];
      sum += score[size_t(e)];
    }
    if (c.gating == 0)
      for (double& s : score) s /= sum;
    double* choice = r.choice.data() + t * E;
    for (int64_t e = 0; e < E; ++e) choice[e] = score[size_t(e)];
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
    double* w = r.w.data() + t * K;
    for (int j = 0; j < K; ++j) r.ids[size_t(t * K + j)] = order[size_t(j)], w[j] = score[size_t(order[size_t(j)])];
    if (c.gating == 2) {
      double s = 0;
      for (int j = 0; j < K; ++j) s += (w[j] = std::exp(w[j] - score[size_t(order[0])]));
      for (int j = 0; j < K; ++j) w[j] /= s;
    }
    if (c.normalize) {
      double s = 0;
      for (int j = 0; j < K; ++j) s += w[j];
      for (int j = 0; j < K; ++j) w[j] /= s;
    }
    for (int j = 0; j < K; ++j) w[j] *= scale;
  }
  return r;
}

TEST(CudaMoeNormRoute, MatchesDoubleReference) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261201);
  std::vector<FrontCase> cases;
  for (const int64_t T : {1, 3, 8}) {
    cases.push_back({2048, 128, 8, 0, true, true, false, T});   // qwen3-moe
    cases.push_back({2880, 32, 4, 2, false, true, true, T});    // gpt-oss
    cases.push_back({4096, 8, 2, 0, false, true, false, T});    // mixtral
    cases.push_back({68, 5, 2, 1, true, false, true, T});
    cases.push_back({4100, 300, 8, 0, true, true, true, T});
  }
  const float eps = 1e-6f, scale = 1.5f;
  for (const FrontCase& c : cases) {
    const std::string what = "moe_norm_route embd " + std::to_string(c.n_embd) + " experts " +
                             std::to_string(c.n_expert) + " used " + std::to_string(c.n_used) + " gating " +
                             std::to_string(c.gating) + " T " + std::to_string(c.T);
    const int64_t D = c.n_embd, E = c.n_expert, K = c.n_used;
    // Rows not packed (the kernel takes rows of 16-byte aligned starts).
    const int64_t x_stride = D + 4, normed_stride = D + 8, r_stride = D + 4, logits_stride = E + 1;
    const std::vector<float> x = random_floats(rng, size_t(c.T * x_stride), -2.0f, 2.0f);
    const std::vector<float> nw = random_floats(rng, size_t(D), 0.5f, 1.5f);
    const std::vector<float> router = random_floats(rng, size_t(E * r_stride), -0.1f, 0.1f);
    const std::vector<float> rb = random_floats(rng, size_t(E), -0.5f, 0.5f);
    const FrontRef ref = reference(c, x, x_stride, nw, router, r_stride, rb, eps, scale);

    DeviceBuffer d_x = to_device(x), d_nw = to_device(nw), d_router = to_device(router), d_rb = to_device(rb);
    DeviceBuffer d_normed(size_t(c.T * normed_stride) * 4), d_logits(size_t(c.T * logits_stride) * 4);
    DeviceBuffer d_ids(size_t(c.T * K) * 4), d_w(size_t(c.T * K) * 4), d_tickets(size_t(c.T) * 4);
    const bool takes_q8 = D % 32 == 0;
    const int64_t q8_row = q8_row_bytes(D);
    DeviceBuffer d_q8(size_t(c.T * q8_row));
    KILN_CUDA_OK(cudaMemset(d_tickets.as(), 0, size_t(c.T) * 4));
    MoeNormRouteArgs a;
    a.x = d_x.as<float>(), a.x_stride = x_stride, a.n_embd = D;
    a.norm_weight = c.norm_weight ? d_nw.as<float>() : nullptr, a.eps = eps;
    a.normed = d_normed.as<float>(), a.normed_stride = normed_stride;
    a.router = d_router.as<float>(), a.router_stride = r_stride;
    a.router_bias = c.router_bias ? d_rb.as<float>() : nullptr;
    a.logits = d_logits.as<float>();
    a.route.logits = a.logits, a.route.logits_stride = logits_stride;
    a.route.n_expert = E, a.route.n_tokens = c.T, a.route.n_used = K, a.route.gating = c.gating;
    a.route.normalize = c.normalize, a.route.scale = scale;
    a.route.ids = d_ids.as<int32_t>(), a.route.ids_stride = K;
    a.route.weights = d_w.as<float>(), a.route.weights_stride = K;
    a.tickets = d_tickets.as<unsigned>();
    ASSERT_TRUE(moe_norm_route_fits(a)) << what;

    std::vector<float> first_normed, first_logits, first_w;
    std::vector<int32_t> first_ids;
    for (int run = 0; run < 4; ++run) {
      a.tickets_only = run >= 2;
      const bool q8 = takes_q8 && run % 2 == 1;
      a.q8 = q8 ? d_q8.as<uint8_t>() : nullptr, a.q8_row_bytes = q8 ? q8_row : 0;
      const std::string run_what = what + " run " + std::to_string(run) + (a.tickets_only ? " (tickets)" : "") +
                                   (q8 ? " (int8 copy)" : "");
      d_normed.poison(), d_logits.poison(), d_ids.poison(), d_w.poison(), d_q8.poison();
      ASSERT_TRUE(moe_norm_route_fits(a)) << run_what;
      KILN_STATUS_OK(moe_norm_route(a, nullptr));
      const std::vector<float> normed_all = to_host<float>(d_normed, size_t(c.T * normed_stride));
      if (q8) {
        const std::vector<uint8_t> q8_all = to_host<uint8_t>(d_q8, size_t(c.T * q8_row));
        for (int64_t t = 0; t < c.T; ++t)
          expect_q8_copy_of(&normed_all[size_t(t * normed_stride)], D, &q8_all[size_t(t * q8_row)],
                            run_what + " token " + std::to_string(t));
      }
      const std::vector<float> logits_all = to_host<float>(d_logits, size_t(c.T * logits_stride));
      const std::vector<int32_t> ids = to_host<int32_t>(d_ids, size_t(c.T * K));
      const std::vector<float> w = to_host<float>(d_w, size_t(c.T * K));
      if (run == 0) {
        first_normed = normed_all, first_logits = logits_all, first_ids = ids, first_w = w;
      } else {
        EXPECT_TRUE(all_equal_bits(normed_all, first_normed, run_what + ": normed vs run 0"));
        EXPECT_TRUE(all_equal_bits(logits_all, first_logits, run_what + ": logits vs run 0"));
        EXPECT_EQ(ids, first_ids) << run_what << ": ids vs run 0";
        EXPECT_TRUE(all_equal_bits(w, first_w, run_what + ": weights vs run 0"));
      }
      const std::vector<uint32_t> tickets = to_host<uint32_t>(d_tickets, size_t(c.T));
      for (int64_t t = 0; t < c.T; ++t) EXPECT_EQ(tickets[size_t(t)], 0u) << run_what << ": ticket of token " << t;

      std::vector<float> normed, logits;
      for (int64_t t = 0; t < c.T; ++t) {
        normed.insert(normed.end(), normed_all.begin() + t * normed_stride, normed_all.begin() + t * normed_stride + D);
        logits.insert(logits.end(), logits_all.begin() + t * logits_stride, logits_all.begin() + t * logits_stride + E);
      }
      // normed: a few f32 roundings of each value; logits: f32 sums of D products.
      EXPECT_TRUE(all_close(normed, ref.normed, 1e-5, 1e-7, run_what + " normed"));
      std::vector<double> logit_tol(ref.logits.size());
      for (size_t i = 0; i < logit_tol.size(); ++i) logit_tol[i] = 1e-5 * ref.logit_scale[i] + 1e-6;
      EXPECT_TRUE(all_close(logits, ref.logits, logit_tol, run_what + " logits"));

      int near_ties = 0;
      std::vector<float> got;
      std::vector<double> want;
      for (int64_t t = 0; t < c.T; ++t) {
        bool tie = false;
        for (int j = 0; j < K; ++j) {
          const int32_t want_id = ref.ids[size_t(t * K + j)], got_id = ids[size_t(t * K + j)];
          if (want_id == got_id) continue;
          const double* choice = ref.choice.data() + t * E;
          const bool close = got_id >= 0 && got_id < E &&
                             std::fabs(choice[want_id] - choice[got_id]) <= 1e-4 * std::fabs(choice[want_id]);
          EXPECT_TRUE(close) << run_what << ": token " << t << " slot " << j << " expert " << got_id << ", want "
                             << want_id;
          tie = true;
        }
        near_ties += tie;
        if (tie) continue;
        got.insert(got.end(), w.begin() + t * K, w.begin() + (t + 1) * K);
        want.insert(want.end(), ref.w.begin() + t * K, ref.w.begin() + (t + 1) * K);
      }
      EXPECT_LE(near_ties, 1) << run_what;
      // Weights from logits within ~1e-5 relative: softmax and sigmoid pass that on.
      EXPECT_TRUE(all_close(got, want, 1e-4, 1e-6, run_what + " weights"));
    }
  }
}

TEST(CudaMoeNormRoute, RefusesWhatItCannotTake) {
  KILN_REQUIRE_GPU();
  MoeNormRouteArgs a;
  a.n_embd = 2048, a.router_stride = 2048;
  a.router = reinterpret_cast<const float*>(uintptr_t(256));
  a.route.n_expert = 128, a.route.n_used = 8, a.route.n_tokens = 1;
  a.tickets = reinterpret_cast<unsigned*>(uintptr_t(256));
  a.logits = reinterpret_cast<float*>(uintptr_t(512)), a.route.logits = a.logits;
  EXPECT_TRUE(moe_norm_route_fits(a));
  a.n_embd = 2050;  // not a multiple of 4
  EXPECT_FALSE(moe_norm_route_fits(a));
  EXPECT_FALSE(moe_norm_route(a, nullptr).ok());
  a.n_embd = 2048, a.route.n_used = 33;
  EXPECT_FALSE(moe_norm_route(a, nullptr).ok()) << "33 used";
  a.route.n_used = 8, a.router_stride = 2050;  // rows not 16-byte aligned
  EXPECT_FALSE(moe_norm_route(a, nullptr).ok()) << "router stride";
  a.router_stride = 2048, a.x_stride = 2049;
  EXPECT_FALSE(moe_norm_route(a, nullptr).ok()) << "x stride";
}

}  // namespace
}  // namespace kiln::cuda::testing
