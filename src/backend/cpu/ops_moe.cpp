// Mixture of experts: choosing the experts of each token, and running them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/ops.h"

namespace kiln::cpu {

void moe_route(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights) {
  require_f32_rows(logits, "moe_route", "logits");
  require_f32_rows(weights, "moe_route", "weights");
  const int64_t n_expert = logits.ne[0], n_tokens = logits.rows();
  KILN_CHECK(p.n_used > 0 && p.n_used <= n_expert, "moe_route: {} experts used of {}", p.n_used, n_expert);
  KILN_CHECK(ids.dtype == GgmlType::I32 && ids.ne[0] == p.n_used && ids.rows() == n_tokens && weights.ne[0] == p.n_used &&
                 weights.rows() == n_tokens,
             "moe_route: ids {} / weights {} are not [{}, {}]", ids.describe(), weights.describe(), p.n_used, n_tokens);
  const float* bias = nullptr;
  if (p.selection_bias) {
    require_f32_rows(*p.selection_bias, "moe_route", "selection_bias");
    KILN_CHECK(p.selection_bias->elements() == n_expert, "moe_route: selection bias of {} for {} experts",
               p.selection_bias->elements(), n_expert);
    bias = p.selection_bias->as<float>();
  }
  std::vector<float> score(static_cast<size_t>(n_expert)), choose(static_cast<size_t>(n_expert));
  std::vector<int32_t> order(static_cast<size_t>(n_expert));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits.f32_row(t);
    if (p.gating == MoeGating::Softmax) {
      const float m = *std::max_element(l, l + n_expert);
      double sum = 0;
      for (int64_t e = 0; e < n_expert; ++e) sum += (score[e] = std::exp(l[e] - m));
      for (int64_t e = 0; e < n_expert; ++e) score[e] = float(score[e] / sum);
    } else if (p.gating == MoeGating::Sigmoid) {
      for (int64_t e = 0; e < n_expert; ++e) score[e] = 1.0f / (1.0f + std::exp(-l[e]));
    } else {
      std::copy(l, l + n_expert, score.begin());
    }
    for (int64_t e = 0; e < n_expert; ++e) choose[e] = score[e] + (bias ? bias[e] : 0.0f);
    // The k best, larger first; equal scores keep the lower expert index first.
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return choose[a] > choose[b]; });
    int32_t* id = reinterpret_cast<int32_t*>(ids.row_ptr(t));
    float* w = weights.f32_row(t);
    for (int j = 0; j < p.n_used; ++j) {
      id[j] = order[j];
      w[j] = score[order[j]];
    }
    if (p.gating == MoeGating::SoftmaxTopK) {
      const float m = w[0];
      double sum = 0;
      for (int j = 0; j < p.n_used; ++j) sum += (w[j] = std::exp(w[j] - m));
      for (int j = 0; j < p.n_used; ++j) w[j] = float(w[j] / sum);
    }
    if (p.normalize) {
      double sum = 0;
      for (int j = 0; j < p.n_used; ++j) sum += w[j];
      for (int j = 0; j < p.n_used; ++j) w[j] = float(w[j] / sum);
    }
    for (int j = 0; j < p.n_used; ++j) w[j] *= p.scale;
  }
}

namespace moe_detail {

Tensor scratch_rows(std::vector<float>& storage, int64_t width, int64_t rows, const char* name) {
  if (storage.size() < size_t(width * rows)) storage.resize(size_t(width * rows));
  return Tensor::contiguous(GgmlType::F32, {width, rows}, storage.data(), Device::Cpu, name);
}

Tensor bias_of(const Tensor& stacked, int64_t expert) {
  if (stacked.empty()) return {};
  return Tensor::contiguous(GgmlType::F32, {stacked.ne[0]}, stacked.row_ptr(expert), Device::Cpu, stacked.name);
}

}  // namespace moe_detail

void moe_ffn(const Tensor& x, const ExpertWeights& ex, const Tensor& ids, const Tensor& weights, const GluParams& act,
             Tensor& out, MoeScratch& s, ThreadPool& pool) {
  require_f32_rows(x, "moe_ffn", "x");
  require_f32_rows(out, "moe_ffn", "out");
  KILN_CHECK(x.data != out.data, "moe_ffn: out must not alias x");
  const int64_t n_embd = x.ne[0], n_tokens = x.rows(), n_used = ids.ne[0];
  const int64_t n_expert = ex.gate.ne[2], n_ff = ex.gate.ne[1];
  KILN_CHECK(ex.gate.ne[0] == n_embd && ex.up.ne[0] == n_embd && ex.up.ne[1] == n_ff && ex.up.ne[2] == n_expert &&
                 ex.down.ne[0] == n_ff && ex.down.ne[1] == n_embd && ex.down.ne[2] == n_expert,
             "moe_ffn: experts gate {} up {} down {} do not fit rows of {}", ex.gate.describe(), ex.up.describe(),
             ex.down.describe(), n_embd);
  KILN_CHECK(ids.dtype == GgmlType::I32 && ids.rows() == n_tokens && weights.ne[0] == n_used &&
                 weights.rows() == n_tokens && out.ne[0] == n_embd && out.rows() == n_tokens,
             "moe_ffn: ids {} / weights {} / out {} do not fit {} tokens", ids.describe(), weights.describe(),
             out.describe(), n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t j = 0; j < n_used; ++j) {
      const int32_t id = reinterpret_cast<const int32_t*>(ids.row_ptr(t))[j];
      KILN_CHECK(id >= 0 && id < n_expert, "moe_ffn: token {} routed to expert {} of {}", t, id, n_expert);
    }
  for (int64_t t = 0; t < n_tokens; ++t) std::memset(out.f32_row(t), 0, size_t(n_embd) * sizeof(float));

  // Experts in order; each gathers the tokens routed to it and runs as three matmuls.
  for (int64_t e = 0; e < n_expert; ++e) {
    s.rows.clear();
    for (int64_t t = 0; t < n_tokens; ++t) {
      const int32_t* id = reinterpret_cast<const int32_t*>(ids.row_ptr(t));
      for (int64_t j = 0; j < n_used; ++j)
        if (id[j] == e) s.rows.push_back(int32_t(t * n_used + j));
    }
    if (s.rows.empty()) continue;
    const int64_t n = int64_t(s.rows.size());
    Tensor xe = moe_detail::scratch_rows(s.x, n_embd, n, "moe_x");
    Tensor ge = moe_detail::scratch_rows(s.gate, n_ff, n, "moe_gate");
    Tensor ue = moe_detail::scratch_rows(s.up, n_ff, n, "moe_up");
    Tensor ye = moe_detail::scratch_rows(s.y, n_embd, n, "moe_y");
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(xe.f32_row(r), x.f32_row(s.rows[r] / n_used), size_t(n_embd) * sizeof(float));
    linear(xe, ex.gate.matrix(e), moe_detail::bias_of(ex.gate_bias, e), ge, pool);
    linear(xe, ex.up.matrix(e), moe_detail::bias_of(ex.up_bias, e), ue, pool);
    glu(ge, ue, act, ge, pool);
    linear(ge, ex.down.matrix(e), moe_detail::bias_of(ex.down_bias, e), ye, pool);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = s.rows[r] / n_used, j = s.rows[r] % n_used;
      const float w = weights.f32_row(t)[j];
      float* o = out.f32_row(t);
      const float* y = ye.f32_row(r);
      for (int64_t i = 0; i < n_embd; ++i) o[i] += w * y[i];
    }
  }
}

}  // namespace kiln::cpu
