// Rotary position embedding, and attention over the paged KV cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "backend/cpu/f16_rows.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/ops.h"
#include "backend/op_checks.h"
#include "core/half.h"

namespace kiln::cpu {

namespace rope_math {

// YaRN's blend between interpolated and extrapolated angles, ggml's formulation: dims
// below corr_low keep their original (extrapolated) frequency, those above corr_high are
// interpolated, with a linear ramp between.
float ramp(float low, float high, int i0) {
  const float y = (float(i0 / 2) - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

// The dimension whose wavelength fits `n_rotations` times into the original context.
float correction_dim(int n_rot, int n_ctx_orig, float n_rotations, float base) {
  return float(n_rot) * std::log(float(n_ctx_orig) / (n_rotations * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

}  // namespace rope_math

namespace attention_math {

// Query-key dot product without SIMD (CPUs without AVX2).
float dot_plain(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace attention_math

using attention_math::dot_plain;

void rope(Tensor& x, const Tensor& positions, const RopeParams& p, ThreadPool& pool) {
  require_f32_rows(x, "rope", "x");
  const int64_t head_dim = x.ne[0], n_heads = x.ne[1], n_tokens = x.ne[2];
  KILN_CHECK(x.ne[3] == 1, "rope: x {} {} must be {{head_dim, heads, tokens}}", x.name, x.describe());
  KILN_CHECK(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= head_dim, "rope: n_rot {} for heads of {}", p.n_rot,
             head_dim);
  KILN_CHECK(positions.dtype == GgmlType::I32 && positions.elements() == n_tokens,
             "rope: {} positions for {} tokens", positions.elements(), n_tokens);
  const int half = p.n_rot / 2;
  const float* factors = nullptr;
  if (p.freq_factors) {
    require_f32_rows(*p.freq_factors, "rope", "freq_factors");
    KILN_CHECK(p.freq_factors->elements() >= half, "rope: freq_factors {} has {} elements, {} needed",
               p.freq_factors->name, p.freq_factors->elements(), half);
    factors = p.freq_factors->as<float>();
  }
  float corr_low = 0, corr_high = 0;
  if (p.yarn.ext_factor != 0.0f) {
    KILN_CHECK(p.yarn.n_ctx_orig > 0, "rope: YaRN needs the original context length");
    const float low = rope_math::correction_dim(p.n_rot, p.yarn.n_ctx_orig, p.yarn.beta_fast, p.freq_base);
    const float high = rope_math::correction_dim(p.n_rot, p.yarn.n_ctx_orig, p.yarn.beta_slow, p.freq_base);
    corr_low = std::max(0.0f, p.yarn.truncate ? std::floor(low) : low);
    corr_high = std::min(float(p.n_rot - 1), p.yarn.truncate ? std::ceil(high) : high);
  }
  const int32_t* pos = positions.as<int32_t>();
  parallel_items(pool, n_tokens, int64_t(half) * 40 + n_heads * p.n_rot * 4, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t t = begin; t < end; ++t) {
      for (int i = 0; i < half; ++i) {
        // Angles in double: positions times small frequencies lose digits in f32.
        double theta_extrap = double(pos[t]) * std::pow(double(p.freq_base), -2.0 * i / p.n_rot);
        if (factors) theta_extrap /= double(factors[i]);
        double theta = theta_extrap * p.freq_scale;
        float mscale = p.yarn.attn_factor;
        if (p.yarn.ext_factor != 0.0f) {
          const double mix = double(rope_math::ramp(corr_low, corr_high, 2 * i)) * p.yarn.ext_factor;
          theta = theta * (1.0 - mix) + theta_extrap * mix;
          mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
        }
        cos_v[i] = float(std::cos(theta)) * mscale;
        sin_v[i] = float(std::sin(theta)) * mscale;
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = reinterpret_cast<float*>(x.row_ptr(h, t));
        for (int i = 0; i < half; ++i) {
          // Normal: neighbours rotate together; Neox: element i with element i + half.
          const int a = p.style == RopeStyle::Normal ? 2 * i : i;
          const int b = p.style == RopeStyle::Normal ? 2 * i + 1 : i + half;
          const float x0 = v[a], x1 = v[b];
          v[a] = x0 * cos_v[i] - x1 * sin_v[i];
          v[b] = x0 * sin_v[i] + x1 * cos_v[i];
        }
      }
    }
  });
}

namespace {

// A KV cache holds f32 or f16 rows; k and v share the type.
void require_cache_rows(const KvLayer& cache, const char* op) {
  for (const Tensor* t : {&cache.k, &cache.v}) {
    KILN_CHECK(!t->empty() && t->device == Device::Cpu, "{}: cache {} is missing or not in CPU memory", op, t->name);
    KILN_CHECK((t->dtype == GgmlType::F32 || t->dtype == GgmlType::F16) && t->nb[0] == traits(t->dtype).type_size,
               "{}: cache {} ({}) must be f32 or f16 with packed rows", op, t->name, t->describe());
  }
  KILN_CHECK(cache.k.dtype == cache.v.dtype, "{}: cache k is {}, cache v {}", op, type_name(cache.k.dtype),
             type_name(cache.v.dtype));
}

}  // namespace

void kv_store(const Tensor& k, const Tensor& v, KvLayer& cache, const Tensor& slots) {
  require_f32_rows(k, "kv_store", "k");
  require_f32_rows(v, "kv_store", "v");
  require_cache_rows(cache, "kv_store");
  KILN_CHECK(k.ne[0] == cache.k.ne[0] && v.ne[0] == cache.v.ne[0],
             "kv_store: k {} / v {} rows do not match the cache's {} / {}", k.describe(), v.describe(),
             cache.k.ne[0], cache.v.ne[0]);
  KILN_CHECK(slots.dtype == GgmlType::I32 && slots.elements() == k.ne[1] && v.ne[1] == k.ne[1],
             "kv_store: {} slots for {} tokens", slots.elements(), k.ne[1]);
  const int32_t* slot = slots.as<int32_t>();
  const bool f16 = cache.k.dtype == GgmlType::F16;
  const F16RowKernels h = f16_row_kernels();
  for (int64_t t = 0; t < k.ne[1]; ++t) {
    KILN_CHECK(slot[t] >= 0 && slot[t] < cache.k.ne[1], "kv_store: slot {} of token {} outside the cache ({} slots)",
               slot[t], t, cache.k.ne[1]);
    if (f16) {
      h.narrow(k.f32_row(t), reinterpret_cast<uint16_t*>(cache.k.row_ptr(slot[t])), k.ne[0]);
      h.narrow(v.f32_row(t), reinterpret_cast<uint16_t*>(cache.v.row_ptr(slot[t])), v.ne[0]);
    } else {
      std::memcpy(cache.k.f32_row(slot[t]), k.f32_row(t), size_t(k.ne[0]) * sizeof(float));
      std::memcpy(cache.v.f32_row(slot[t]), v.f32_row(t), size_t(v.ne[0]) * sizeof(float));
    }
  }
}

namespace {

// How one (token, head) reads the cache. An f32 cache is used as it is. An f16 cache is
// read as llama.cpp's CPU flash attention reads it: the query is rounded to f16 too (the
// products of two halves are exact in f32, their sums are f32), and value rows are widened
// to f32 and summed in f32.
struct F32Rows {
  using Dot = float (*)(const float*, const float*, int64_t);
  Dot dot;
  const float* query(const float* q, float*, int) const { return q; }
  float score(const float* q, const uint8_t* k_row, int n) const {
    return dot(q, reinterpret_cast<const float*>(k_row), n);
  }
  const float* values(const uint8_t* v_row, float*, int) const { return reinterpret_cast<const float*>(v_row); }
};

struct F16Rows {
  F16RowKernels h;
  const float* query(const float* q, float* buf, int n) const {
    for (int i = 0; i < n; ++i) buf[i] = f16_to_f32(f32_to_f16(q[i]));
    return buf;
  }
  float score(const float* q, const uint8_t* k_row, int n) const {
    return h.dot(reinterpret_cast<const uint16_t*>(k_row), q, n);
  }
  const float* values(const uint8_t* v_row, float* buf, int n) const {
    h.widen(reinterpret_cast<const uint16_t*>(v_row), buf, n);
    return buf;
  }
};

template <typename Rows>
void attend(const Rows& rows, const Tensor& q, const KvLayer& cache, const BatchIndex& batch, const AttentionParams& p,
            const float* sinks, Tensor& out, ThreadPool& pool) {
  const int64_t n_tokens = q.ne[1];
  const int32_t* pos = batch.positions.as<int32_t>();
  const int32_t* seq_row = batch.seq_rows.as<int32_t>();
  const int bs = cache.block_size;
  const int group = p.n_head / p.n_head_kv;
  const int dk = p.head_dim_k, dv = p.head_dim_v;
  const size_t k_head_bytes = size_t(dk) * cache.k.nb[0], v_head_bytes = size_t(dv) * cache.v.nb[0];
  const int64_t keys = std::min<int64_t>(batch.max_position + 1,
                                        p.sliding_window > 0 ? p.sliding_window : batch.max_position + 1);
  parallel_items(pool, n_tokens * p.n_head, keys * (dk + dv) * 2, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(static_cast<size_t>(dv)), q_buf(static_cast<size_t>(dk)),
        v_buf(static_cast<size_t>(dv));
    for (int64_t job = begin; job < end; ++job) {
      const int64_t t = job / p.n_head;
      const int h = int(job % p.n_head), kv_head = h / group;
      const float* qv = rows.query(q.f32_row(t) + int64_t(h) * dk, q_buf.data(), dk);
      const int64_t last = pos[t];
      const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, last - p.sliding_window + 1) : 0;
      const int32_t* table = reinterpret_cast<const int32_t*>(batch.block_tables.row_ptr(seq_row[t]));
      auto slot_of = [&](int64_t position) { return int64_t(table[position / bs]) * bs + position % bs; };

      scores.resize(size_t(last - first + 1));
      float max_score = sinks ? sinks[h] : -std::numeric_limits<float>::infinity();
      for (int64_t j = first; j <= last; ++j) {
        float s = rows.score(qv, cache.k.row_ptr(slot_of(j)) + kv_head * k_head_bytes, dk) * p.scale;
        if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
        scores[size_t(j - first)] = s;
        max_score = std::max(max_score, s);
      }
      double denom = sinks ? std::exp(double(sinks[h]) - max_score) : 0.0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      float* a = acc.data();
      for (int64_t j = first; j <= last; ++j) {
        const float w = std::exp(scores[size_t(j - first)] - max_score);
        denom += w;
        const float* vv = rows.values(cache.v.row_ptr(slot_of(j)) + kv_head * v_head_bytes, v_buf.data(), dv);
        for (int d = 0; d < dv; ++d) a[d] += w * vv[d];
      }
      float* o = out.f32_row(t) + int64_t(h) * dv;
      const float inv = float(1.0 / denom);
      for (int d = 0; d < dv; ++d) o[d] = a[d] * inv;
    }
  });
}

}  // namespace

void attention(const Tensor& q, const KvLayer& cache, const BatchIndex& batch, const AttentionParams& p, Tensor& out,
               ThreadPool& pool) {
  require_f32_rows(q, "attention", "q");
  require_f32_rows(out, "attention", "out");
  require_cache_rows(cache, "attention");
  check_attention_shapes("attention", q, cache, batch, p, out);
  const float* sinks = nullptr;
  if (p.sinks) {
    require_f32_rows(*p.sinks, "attention", "sinks");
    sinks = p.sinks->as<float>();
  }
  const int32_t* pos = batch.positions.as<int32_t>();
  const int32_t* seq_row = batch.seq_rows.as<int32_t>();
  const int64_t max_blocks = batch.block_tables.ne[0];
  // Checked here, not in the workers: an exception must not leave a worker thread.
  for (int64_t t = 0; t < q.ne[1]; ++t)
    KILN_CHECK(pos[t] >= 0 && pos[t] / cache.block_size < max_blocks && seq_row[t] >= 0 &&
                   seq_row[t] < batch.block_tables.ne[1],
               "attention: token {} (position {}, sequence row {}) lies outside the block tables", t, pos[t],
               seq_row[t]);

  // Dot products with SIMD, f32 accumulation of the values (plain loops the compiler
  // vectorizes): the scalar version with double sums took 9% of a 64-token prompt.
  if (cache.k.dtype == GgmlType::F16) return attend(F16Rows{f16_row_kernels()}, q, cache, batch, p, sinks, out, pool);
  const SimdLevel level = best_simd_level();
  const F32Rows::Dot dot =
      level == SimdLevel::Avx512 ? avx512::dot_f32 : level == SimdLevel::Avx2 ? avx2::dot_f32 : dot_plain;
  attend(F32Rows{dot}, q, cache, batch, p, sinks, out, pool);
}

}  // namespace kiln::cpu
