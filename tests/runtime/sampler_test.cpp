// The sampler on distributions small enough to check by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "runtime/sampler.h"

namespace kiln {
namespace {

// Logits whose softmax is exactly `probs` (up to float rounding).
std::vector<Candidate> candidates_of(const std::vector<double>& probs) {
  std::vector<Candidate> c;
  for (size_t i = 0; i < probs.size(); ++i) c.push_back({int32_t(i), float(std::log(probs[i])), 0.0f});
  return c;
}

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

std::vector<int32_t> ids(const std::vector<Candidate>& c) {
  std::vector<int32_t> out;
  for (const Candidate& x : c) out.push_back(x.id);
  return out;
}

SamplerParams plain(float temperature = 1.0f) {
  SamplerParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

TEST(Sampler, TopPKeepsTheTokenThatCrossesP) {
  // Masses 0.3, 0.6, 0.8, 1.0 after one, two, three, four tokens.
  auto c = candidates_of({0.2, 0.3, 0.2, 0.3});
  Sampler::apply_top_p(c, 0.5f);
  EXPECT_EQ(ids(c), (std::vector<int32_t>{1, 3}));  // 0.3 < 0.5, 0.6 >= 0.5
  c = candidates_of({0.2, 0.3, 0.2, 0.3});
  Sampler::apply_top_p(c, 0.25f);
  EXPECT_EQ(c.size(), 1u);
  c = candidates_of({0.2, 0.3, 0.2, 0.3});
  Sampler::apply_top_p(c, 0.65f);
  EXPECT_EQ(c.size(), 3u);
  c = candidates_of({0.2, 0.3, 0.2, 0.3});
  Sampler::apply_top_p(c, 1.0f);  // off
  EXPECT_EQ(c.size(), 4u);
}

TEST(Sampler, MinPThresholdIsRelativeToTheMostLikely) {
  // Largest 0.5: min-p 0.25 keeps p >= 0.125 (three tokens), 0.35 keeps p >= 0.175 (two).
  auto c = candidates_of({0.1, 0.5, 0.15, 0.25});
  Sampler::apply_min_p(c, 0.25f);
  EXPECT_EQ(c.size(), 3u);
  for (const Candidate& x : c) EXPECT_NE(x.id, 0) << "p = 0.1 is below 0.125";
  c = candidates_of({0.1, 0.5, 0.15, 0.25});
  Sampler::apply_min_p(c, 0.35f);
  std::vector<int32_t> kept = ids(c);
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<int32_t>{1, 3}));
}

TEST(Sampler, TopKKeepsTheLargest) {
  auto c = candidates_of({0.1, 0.4, 0.2, 0.3});
  Sampler::apply_top_k(c, 2);
  EXPECT_EQ(ids(c), (std::vector<int32_t>{1, 3}));
  c = candidates_of({0.1, 0.4, 0.2, 0.3});
  Sampler::apply_top_k(c, 0);  // off
  EXPECT_EQ(c.size(), 4u);
}

TEST(Sampler, TemperatureScalesLogits) {
  // logits (ln 4, 0) at T = 2 become (ln 2, 0): probabilities 2/3 and 1/3.
  std::vector<Candidate> c = {{0, std::log(4.0f), 0}, {1, 0.0f, 0}};
  Sampler::apply_temperature(c, 2.0f);
  Sampler::softmax(c);
  EXPECT_NEAR(c[0].p, 2.0 / 3.0, 1e-6);
  EXPECT_NEAR(c[1].p, 1.0 / 3.0, 1e-6);
}

TEST(Sampler, PenaltiesOnKnownCounts) {
  SamplerParams p = plain();
  p.repeat_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  Sampler s(p);
  for (int32_t t : {0, 0, 1}) s.accept(t);
  std::vector<Candidate> c = {{0, 2.0f, 0}, {1, -2.0f, 0}, {2, 1.0f, 0}, {3, 0.5f, 0}};
  s.apply_penalties(c);
  EXPECT_FLOAT_EQ(c[0].logit, 2.0f / 2 - 2 * 0.5f - 0.25f);  // positive: divided; seen twice
  EXPECT_FLOAT_EQ(c[1].logit, -2.0f * 2 - 1 * 0.5f - 0.25f); // negative: multiplied; seen once
  EXPECT_FLOAT_EQ(c[2].logit, 1.0f);
  EXPECT_FLOAT_EQ(c[3].logit, 0.5f);
}

TEST(Sampler, PenaltyWindowForgetsOldTokens) {
  SamplerParams p = plain();
  p.presence_penalty = 1.0f;
  p.penalty_last_n = 2;
  Sampler s(p);
  for (int32_t t : {0, 1, 2}) s.accept(t);  // the window holds 1, 2
  std::vector<Candidate> c = {{0, 0.0f, 0}, {1, 0.0f, 0}, {2, 0.0f, 0}};
  s.apply_penalties(c);
  EXPECT_FLOAT_EQ(c[0].logit, 0.0f);
  EXPECT_FLOAT_EQ(c[1].logit, -1.0f);
  EXPECT_FLOAT_EQ(c[2].logit, -1.0f);
}

TEST(Sampler, TemperatureZeroIsArgmax) {
  SamplerParams p;  // default top-k/top-p/min-p stay on: they must not matter
  p.temperature = 0.0f;
  Sampler s(p);
  const std::vector<float> logits = {0.5f, 3.0f, 2.9f, -1.0f, 3.0f};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits), 1);  // first of the ties
  EXPECT_EQ(argmax(logits), 1);
}

TEST(Sampler, GreedyHonoursPenalties) {
  SamplerParams p;
  p.temperature = 0.0f;
  p.repeat_penalty = 4.0f;
  Sampler s(p);
  s.accept(0);
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.0f}), 1);  // 2 / 4 < 1
}

TEST(Sampler, SameSeedSameTokens) {
  SamplerParams p = plain(1.0f);
  p.seed = 1234;
  const std::vector<float> logits = logits_of({0.1, 0.2, 0.3, 0.15, 0.25});
  Sampler a(p), b(p);
  p.seed = 1235;
  Sampler c(p);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 200; ++i) {
    ta.push_back(a.sample(logits));
    tb.push_back(b.sample(logits));
    tc.push_back(c.sample(logits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, DrawsFollowTheDistribution) {
  SamplerParams p = plain(1.0f);
  p.seed = 7;
  Sampler s(p);
  const std::vector<double> probs = {0.5, 0.3, 0.2};
  const std::vector<float> logits = logits_of(probs);
  constexpr int kDraws = 20000;
  std::map<int32_t, int> counts;
  for (int i = 0; i < kDraws; ++i) ++counts[s.sample(logits)];
  for (int32_t t = 0; t < 3; ++t)  // 4 standard deviations of a binomial: about 0.014
    EXPECT_NEAR(double(counts[t]) / kDraws, probs[size_t(t)], 0.015) << "token " << t;
}

TEST(Sampler, TopPJudgesTheDistributionBeforeTemperature) {
  // llama.cpp's order: top-p at temperature 1 keeps tokens 1 and 3 (0.6 of the mass); a very
  // high temperature afterwards flattens the two survivors but cannot revive the others.
  SamplerParams p = plain(100.0f);
  p.top_p = 0.5f;
  p.seed = 3;
  Sampler s(p);
  const std::vector<float> logits = logits_of({0.2, 0.3, 0.2, 0.3});
  std::map<int32_t, int> counts;
  for (int i = 0; i < 2000; ++i) ++counts[s.sample(logits)];
  EXPECT_EQ(counts[0] + counts[2], 0);
  EXPECT_GT(counts[1], 800);
  EXPECT_GT(counts[3], 800);
}

TEST(Sampler, DefaultChainOnALargeVocabulary) {
  // Top-k 40 of 1000 tokens, then top-p and min-p: only high-logit tokens come out.
  SamplerParams p;
  p.seed = 11;
  Sampler s(p);
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(i % 100) * 0.1f;  // 10 copies of each level
  for (int i = 0; i < 500; ++i) {
    const int32_t t = s.sample(logits);
    ASSERT_GE(t % 100, 96) << "draw " << i << " gave token " << t << " (logit " << logits[size_t(t)] << ")";
  }
}

}  // namespace
}  // namespace kiln
