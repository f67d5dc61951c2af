#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kiln {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

bool by_logit_desc(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// The candidate holding `id`: at index id while candidates are still in vocabulary order
// (the common case), else found by search; nullptr when it was filtered out.
Candidate* find_candidate(std::vector<Candidate>& c, int32_t id) {
  if (size_t(id) < c.size() && c[size_t(id)].id == id) return &c[size_t(id)];
  for (Candidate& x : c)
    if (x.id == id) return &x;
  return nullptr;
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  KILN_CHECK(!logits.empty(), "argmax of an empty row");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

Sampler::Sampler(const SamplerParams& params) : params_(params) {
  uint64_t s = params.seed;
  for (uint64_t& word : rng_state_) word = splitmix64(s);
}

double Sampler::next_uniform() {
  // xoshiro256**: fast, well distributed, and the same on every platform.
  uint64_t* s = rng_state_;
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return double(result >> 11) * 0x1.0p-53;
}

void Sampler::accept(int32_t token) {
  if (params_.penalty_last_n == 0) return;
  recent_.push_back(token);
  ++counts_[token];
  if (params_.penalty_last_n > 0 && recent_.size() > size_t(params_.penalty_last_n)) {
    const int32_t old = recent_.front();
    recent_.pop_front();
    if (--counts_[old] == 0) counts_.erase(old);
  }
}

void Sampler::reset_history() {
  recent_.clear();
  counts_.clear();
}

void Sampler::apply_penalties(std::vector<Candidate>& candidates) const {
  const SamplerParams& p = params_;
  if (p.repeat_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f) return;
  for (const auto& [token, count] : counts_) {
    Candidate* c = find_candidate(candidates, token);
    if (!c || count <= 0) continue;
    // Dividing a positive logit and multiplying a negative one both make the token less
    // likely (llama.cpp's rule; the CTRL paper only divides).
    c->logit = c->logit > 0 ? c->logit / p.repeat_penalty : c->logit * p.repeat_penalty;
    c->logit -= float(count) * p.frequency_penalty + p.presence_penalty;
  }
}

void Sampler::softmax(std::vector<Candidate>& c) {
  if (c.empty()) return;
  std::sort(c.begin(), c.end(), by_logit_desc);
  const float max_logit = c.front().logit;
  double sum = 0;
  for (Candidate& x : c) {
    x.p = std::exp(x.logit - max_logit);
    sum += x.p;
  }
  for (Candidate& x : c) x.p = float(x.p / sum);
}

void Sampler::apply_top_k(std::vector<Candidate>& c, int k) {
  if (k <= 0 || size_t(k) >= c.size()) return;
  std::partial_sort(c.begin(), c.begin() + k, c.end(), by_logit_desc);
  c.resize(size_t(k));
}

void Sampler::apply_top_p(std::vector<Candidate>& c, float p) {
  if (p >= 1.0f || c.empty()) return;
  softmax(c);
  double mass = 0;
  size_t keep = c.size();
  for (size_t i = 0; i < c.size(); ++i) {
    mass += c[i].p;
    if (mass >= p) {  // this token crosses p: it stays, the rest go
      keep = i + 1;
      break;
    }
  }
  c.resize(keep);
}

void Sampler::apply_min_p(std::vector<Candidate>& c, float min_p) {
  if (min_p <= 0.0f || c.empty()) return;
  // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p): no softmax needed.
  float max_logit = c.front().logit;
  for (const Candidate& x : c) max_logit = std::max(max_logit, x.logit);
  const float threshold = max_logit + std::log(min_p);
  std::erase_if(c, [&](const Candidate& x) { return x.logit < threshold; });
}

void Sampler::apply_temperature(std::vector<Candidate>& c, float temperature) {
  KILN_CHECK(temperature > 0, "sampler: temperature {} (use greedy selection for <= 0)", temperature);
  for (Candidate& x : c) x.logit /= temperature;
}

int32_t Sampler::sample(std::span<const float> logits) {
  KILN_CHECK(!logits.empty(), "sampler: empty logits");
  const SamplerParams& p = params_;
  const bool penalties = !counts_.empty() &&
                         (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f);
  if (p.temperature <= 0 && !penalties) return argmax(logits);

  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) candidates_[i] = {int32_t(i), logits[i], 0.0f};
  apply_penalties(candidates_);
  if (p.temperature <= 0) {
    size_t best = 0;
    for (size_t i = 1; i < candidates_.size(); ++i)
      if (candidates_[i].logit > candidates_[best].logit) best = i;
    return candidates_[best].id;
  }
  apply_top_k(candidates_, p.top_k);
  apply_top_p(candidates_, p.top_p);
  apply_min_p(candidates_, p.min_p);
  apply_temperature(candidates_, p.temperature);
  softmax(candidates_);

  // One draw: walk the cumulative distribution (largest first).
  const double u = next_uniform();
  double mass = 0;
  for (const Candidate& x : candidates_) {
    mass += x.p;
    if (u < mass) return x.id;
  }
  return candidates_.back().id;  // u within rounding of 1
}

}  // namespace kiln
