#pragma once
// The attention op's definition, in double precision, for the CPU backend's tests: per
// (token, query head), softmax over the keys of the same sequence at positions <= the
// token's (and within the sliding window), of scale * q.k (soft-capped), with an optional
// sink logit per head in the denominator, times the values. Grouped-query heads: query head
// h reads kv head h / (n_head / n_kv). Every q, k and v element first goes through
// `round_input` (identity for an f32 cache, f16 rounding for an f16 one).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace kiln::testing {

struct DenseAttentionShape {
  int n_head = 0, n_kv = 0, dk = 0, dv = 0;
  double scale = 1.0;
  float softcap = 0.0f;  // 0: off
  int window = 0;        // 0: off
};

struct DenseAttention {
  std::vector<double> out;        // [T][n_head][dv]
  std::vector<double> magnitude;  // same layout: sum_j p_j |v_j|, to scale tolerances
};

// q [T][n_head][dk], k [T][n_kv][dk], v [T][n_kv][dv]; pos and seq [T]; sinks [n_head] or null.
inline DenseAttention dense_attention(const std::vector<float>& q, const std::vector<float>& k,
                                      const std::vector<float>& v, const std::vector<int32_t>& pos,
                                      const std::vector<int32_t>& seq, const DenseAttentionShape& s,
                                      const float* sinks, const std::function<float(float)>& round_input) {
  const int64_t T = int64_t(pos.size());
  const int group = s.n_head / s.n_kv;
  DenseAttention r;
  r.out.assign(size_t(T * s.n_head * s.dv), 0.0);
  r.magnitude.assign(r.out.size(), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < s.n_head; ++h) {
      const int kvh = h / group;
      std::vector<double> w;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j < T; ++j) {
        if (seq[size_t(j)] != seq[size_t(t)] || pos[size_t(j)] > pos[size_t(t)]) continue;
        if (s.window > 0 && pos[size_t(t)] - pos[size_t(j)] >= s.window) continue;
        double dot = 0;
        for (int d = 0; d < s.dk; ++d)
          dot += double(round_input(q[size_t((t * s.n_head + h) * s.dk + d)])) *
                 round_input(k[size_t((j * s.n_kv + kvh) * s.dk + d)]);
        dot *= s.scale;
        if (s.softcap > 0) dot = s.softcap * std::tanh(dot / s.softcap);
        w.push_back(dot);
        keys.push_back(j);
      }
      double m = sinks ? sinks[h] : -1e300;
      for (double x : w) m = std::max(m, x);
      double sum = sinks ? std::exp(sinks[h] - m) : 0;
      for (double& x : w) sum += (x = std::exp(x - m));
      for (int d = 0; d < s.dv; ++d) {
        double acc = 0, mag = 0;
        for (size_t i = 0; i < keys.size(); ++i) {
          const double value = round_input(v[size_t((keys[i] * s.n_kv + kvh) * s.dv + d)]);
          acc += w[i] * value;
          mag += w[i] * std::abs(value);
        }
        r.out[size_t((t * s.n_head + h) * s.dv + d)] = acc / sum;
        r.magnitude[size_t((t * s.n_head + h) * s.dv + d)] = mag / sum;
      }
    }
  return r;
}

}  // namespace kiln::testing
