// Prefill's head norms + rope + KV-cache store in one launch (rope_store.h's
// rope_store_rows) against a double-precision reference written here: Qwen3's shape (32 q
// heads, 4 k heads of 128, neox, q/k norms, f16 cache), head_dim 64 with adjacent pairs and
// partial rotation (n_rot 32) and an f32 cache, head_dim 256 without norms; token counts 37,
// 19 and 11; q rows wider than their heads, v rows padded; positions out of order; one token
// with slot -1 (its cache rows must stay untouched, its q and k still rotated); Llama-3's
// shape with k rows wider than their heads too (the joined prefill layout, where q, k and v
// are column ranges of one buffer) and no norms. Angles come
// from rope_table (checked here too, against double). Cache slots no token owns keep their
// poison. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/cuda/rope_store.h"
#include "cuda_test_support.h"

namespace kiln::cuda::testing {
namespace {

struct RowsCase {
  int64_t T, nq, nk, dim;
  int n_rot;
  bool neox, norms, f16_cache;
  float freq_base, freq_scale;
  int64_t k_pad = 0;  // floats after each token's k heads
};

// Token t's angles as rope_angles() defines them (no YaRN), in double.
void angles_of(const RowsCase& c, int32_t pos, std::vector<double>& cs, std::vector<double>& sn) {
  const int half = c.n_rot / 2;
  cs.resize(size_t(half)), sn.resize(size_t(half));
  for (int i = 0; i < half; ++i) {
    const double theta = double(pos) * std::pow(double(c.freq_base), -2.0 * i / c.n_rot) * c.freq_scale;
    cs[size_t(i)] = std::cos(theta), sn[size_t(i)] = std::sin(theta);
  }
}

// One head in place: normed (double), then rotated; tol per value from the f32 steps.
void reference_head(const RowsCase& c, const float* x, const float* w, const std::vector<double>& cs,
                    const std::vector<double>& sn, double eps, double* out, double* tol) {
  const int64_t D = c.dim;
  std::vector<double> n(static_cast<size_t>(D));
  double ss = 0;
  for (int64_t d = 0; d < D; ++d) ss += double(x[d]) * x[d];
  const double inv = w ? 1.0 / std::sqrt(ss / double(D) + eps) : 1.0;
  for (int64_t d = 0; d < D; ++d) n[size_t(d)] = w ? x[d] * inv * w[d] : x[d];
  const int half = c.n_rot / 2;
  for (int64_t d = 0; d < D; ++d) {
    if (d >= c.n_rot) {
      out[d] = n[size_t(d)], tol[d] = 4e-7 * std::fabs(n[size_t(d)]) + 1e-30;
      continue;
    }
    const bool first = c.neox ? d < half : d % 2 == 0;
    const int64_t i = c.neox ? (first ? d : d - half) : d / 2;
    const int64_t p = c.neox ? (first ? d + half : d - half) : d ^ 1;
    const double a = n[size_t(first ? d : p)], b = n[size_t(first ? p : d)];
    out[d] = first ? a * cs[size_t(i)] - b * sn[size_t(i)] : a * sn[size_t(i)] + b * cs[size_t(i)];
    // rsqrtf (2 ulp), two products and a difference in f32, a float angle.
    tol[d] = 2e-6 * (std::fabs(a) + std::fabs(b)) + 1e-30;
  }
}

TEST(CudaRopeStoreRows, MatchesDoubleReference) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261203);
  const RowsCase cases[] = {{37, 32, 4, 128, 128, true, true, true, 1e6f, 1.0f},
                            {19, 5, 1, 64, 32, false, true, false, 1e4f, 0.5f},
                            {11, 3, 2, 256, 256, true, false, true, 1e4f, 1.0f},
                            {23, 32, 8, 128, 128, false, false, true, 5e5f, 1.0f, 1024 + 12}};
  const float eps = 1e-6f;
  for (const RowsCase& c : cases) {
    const std::string what = "rope_store_rows T " + std::to_string(c.T) + " heads " + std::to_string(c.nq) + "/" +
                             std::to_string(c.nk) + " dim " + std::to_string(c.dim) + " n_rot " +
                             std::to_string(c.n_rot) + (c.neox ? " neox" : " pairs") + (c.norms ? " norms" : "") +
                             (c.f16_cache ? " f16" : " f32") + (c.k_pad ? " k rows padded" : "");
    const int64_t D = c.dim, q_stride = c.nq * D + 8, k_width = c.nk * D, k_stride = k_width + c.k_pad,
                  v_width = c.nk * D, v_stride = v_width + 4;
    const int64_t n_slots = c.T + 5, elem = c.f16_cache ? 2 : 4;
    const std::vector<float> q = random_floats(rng, size_t(c.T * q_stride), -3.0f, 3.0f);
    const std::vector<float> k = random_floats(rng, size_t(c.T * k_stride), -3.0f, 3.0f);
    const std::vector<float> v = random_floats(rng, size_t(c.T * v_stride), -3.0f, 3.0f);
    const std::vector<float> qw = random_floats(rng, size_t(D), 0.5f, 1.5f);
    const std::vector<float> kw = random_floats(rng, size_t(D), 0.5f, 1.5f);
    std::vector<int32_t> pos(size_t(c.T)), slots(size_t(c.T));
    std::uniform_int_distribution<int32_t> pos_dist(0, 40000);
    std::vector<int32_t> all_slots(static_cast<size_t>(n_slots));
    for (int64_t s = 0; s < n_slots; ++s) all_slots[size_t(s)] = int32_t(s);
    std::shuffle(all_slots.begin(), all_slots.end(), rng);  // distinct, out of order
    for (int64_t t = 0; t < c.T; ++t) pos[size_t(t)] = pos_dist(rng), slots[size_t(t)] = all_slots[size_t(t)];
    slots[size_t(c.T / 2)] = -1;  // a token without a slot

    DeviceBuffer d_q = to_device(q), d_k = to_device(k), d_v = to_device(v), d_qw = to_device(qw),
                 d_kw = to_device(kw), d_pos = to_device(pos), d_slots = to_device(slots);
    DeviceBuffer d_cache_k(size_t(n_slots * k_width * elem)), d_cache_v(size_t(n_slots * v_width * elem));
    DeviceBuffer d_table(size_t(c.T * c.n_rot) * 4);
    d_cache_k.poison(), d_cache_v.poison();

    RopeArgs qa;
    qa.x = d_q.as<float>(), qa.token_stride = q_stride, qa.head_stride = D;
    qa.n_tokens = c.T, qa.n_heads = c.nq, qa.head_dim = D;
    qa.positions = d_pos.as<int32_t>(), qa.n_rot = c.n_rot, qa.neox = c.neox;
    qa.freq_base = c.freq_base, qa.freq_scale = c.freq_scale;
    RopeArgs ka = qa;
    ka.x = d_k.as<float>(), ka.token_stride = k_stride, ka.n_heads = c.nk;
    KvStoreArgs st;
    st.k = ka.x, st.k_stride = k_stride, st.k_width = k_width;
    st.v = d_v.as<float>(), st.v_stride = v_stride, st.v_width = v_width;
    st.cache_k = d_cache_k.as(), st.cache_v = d_cache_v.as();
    st.cache_type = c.f16_cache ? GgmlType::F16 : GgmlType::F32;
    st.cache_k_stride = k_width, st.cache_v_stride = v_width, st.n_slots = n_slots;
    st.slots = d_slots.as<int32_t>(), st.n_tokens = c.T;
    HeadNorms norms;
    if (c.norms) norms.q = d_qw.as<float>(), norms.k = d_kw.as<float>(), norms.eps = eps;

    KILN_STATUS_OK(rope_table(qa, d_table.as<float>(), nullptr));
    ASSERT_EQ(rope_store_rows_refusal(qa, ka, st, d_table.as<float>(), norms), "") << what;
    KILN_STATUS_OK(rope_store_rows(qa, ka, st, d_table.as<float>(), norms, nullptr));

    const std::vector<float> table = to_host<float>(d_table, size_t(c.T * c.n_rot));
    const std::vector<float> q_got = to_host<float>(d_q, q.size()), k_got = to_host<float>(d_k, k.size());
    const std::vector<uint8_t> ck = to_host<uint8_t>(d_cache_k, size_t(n_slots * k_width * elem));
    const std::vector<uint8_t> cv = to_host<uint8_t>(d_cache_v, size_t(n_slots * v_width * elem));
    auto cache_value = [&](const std::vector<uint8_t>& cache, int64_t index) {
      if (c.f16_cache) {
        uint16_t h;
        std::memcpy(&h, cache.data() + index * 2, 2);
        return f16_to_f32(h);
      }
      float f;
      std::memcpy(&f, cache.data() + index * 4, 4);
      return f;
    };

    std::vector<float> q_cmp, k_cmp, table_cmp, ck_cmp;
    std::vector<double> q_ref, q_tol, k_ref, k_tol, table_ref, table_tol, ck_ref, ck_tol;
    std::vector<double> cs, sn, out(static_cast<size_t>(D)), tol(static_cast<size_t>(D));
    const int half = c.n_rot / 2;
    for (int64_t t = 0; t < c.T; ++t) {
      angles_of(c, pos[size_t(t)], cs, sn);
      for (int i = 0; i < half; ++i) {
        table_cmp.push_back(table[size_t(t * c.n_rot + i)]), table_ref.push_back(cs[size_t(i)]);
        table_cmp.push_back(table[size_t(t * c.n_rot + half + i)]), table_ref.push_back(sn[size_t(i)]);
        table_tol.push_back(1e-7), table_tol.push_back(1e-7);
      }
      for (int64_t h = 0; h < c.nq; ++h) {
        reference_head(c, q.data() + t * q_stride + h * D, c.norms ? qw.data() : nullptr, cs, sn, eps, out.data(),
                       tol.data());
        for (int64_t d = 0; d < D; ++d)
          q_cmp.push_back(q_got[size_t(t * q_stride + h * D + d)]), q_ref.push_back(out[size_t(d)]),
              q_tol.push_back(tol[size_t(d)]);
      }
      const int64_t slot = slots[size_t(t)];
      for (int64_t h = 0; h < c.nk; ++h) {
        reference_head(c, k.data() + t * k_stride + h * D, c.norms ? kw.data() : nullptr, cs, sn, eps, out.data(),
                       tol.data());
        for (int64_t d = 0; d < D; ++d) {
          k_cmp.push_back(k_got[size_t(t * k_stride + h * D + d)]), k_ref.push_back(out[size_t(d)]);
          k_tol.push_back(tol[size_t(d)]);
          if (slot < 0) continue;
          ck_cmp.push_back(cache_value(ck, slot * k_width + h * D + d)), ck_ref.push_back(out[size_t(d)]);
          ck_tol.push_back(tol[size_t(d)] + (c.f16_cache ? std::ldexp(std::fabs(out[size_t(d)]), -11) + 1e-7 : 0.0));
        }
      }
      // q's and k's padding after their heads is not touched.
      for (int64_t i = c.nq * D; i < q_stride; ++i)
        ASSERT_EQ(std::memcmp(&q_got[size_t(t * q_stride + i)], &q[size_t(t * q_stride + i)], 4), 0)
            << what << ": q padding of token " << t << " written";
      for (int64_t i = k_width; i < k_stride; ++i)
        ASSERT_EQ(std::memcmp(&k_got[size_t(t * k_stride + i)], &k[size_t(t * k_stride + i)], 4), 0)
            << what << ": k padding of token " << t << " written";
      if (slot < 0) continue;
      for (int64_t i = 0; i < v_width; ++i) {
        const float value = v[size_t(t * v_stride + i)];
        const float want = c.f16_cache ? f16_to_f32(f32_to_f16(value)) : value;
        ASSERT_EQ(cache_value(cv, slot * v_width + i), want) << what << ": cache v token " << t << " [" << i << "]";
      }
    }
    EXPECT_TRUE(all_close(table_cmp, table_ref, table_tol, what + " angle table"));
    EXPECT_TRUE(all_close(q_cmp, q_ref, q_tol, what + " q"));
    EXPECT_TRUE(all_close(k_cmp, k_ref, k_tol, what + " k"));
    EXPECT_TRUE(all_close(ck_cmp, ck_ref, ck_tol, what + " cache k"));
    // Slots no token owns (and the slot-less token's) keep their poison.
    for (int64_t s = 0; s < n_slots; ++s) {
      bool owned = false;
      for (int32_t o : slots) owned = owned || o == s;
      if (owned) continue;
      for (int64_t i = 0; i < k_width * elem; ++i)
        ASSERT_EQ(ck[size_t(s * k_width * elem + i)], 0xFF) << what << ": cache k slot " << s << " written";
      for (int64_t i = 0; i < v_width * elem; ++i)
        ASSERT_EQ(cv[size_t(s * v_width * elem + i)], 0xFF) << what << ": cache v slot " << s << " written";
    }
  }
}

TEST(CudaRopeStoreRows, RefusesWhatItCannotTake) {
  // The refusal reads no memory: host pointers of the right alignment stand in.
  alignas(16) static float buf[4096];
  alignas(16) static int32_t ints[64];
  RopeArgs q;
  q.x = buf, q.token_stride = 4 * 128, q.head_stride = 128, q.n_tokens = 16, q.n_heads = 4, q.head_dim = 128;
  q.positions = ints, q.n_rot = 128, q.neox = true;
  RopeArgs k = q;
  k.n_heads = 1, k.token_stride = 128;
  KvStoreArgs st;
  st.k = k.x, st.k_stride = 128, st.k_width = 128, st.v = buf, st.v_stride = 128, st.v_width = 128;
  st.cache_k = buf, st.cache_v = buf, st.cache_type = GgmlType::F16, st.cache_k_stride = 128, st.cache_v_stride = 128;
  st.n_slots = 16, st.slots = ints, st.n_tokens = 16;
  EXPECT_EQ(rope_store_rows_refusal(q, k, st, buf, {}), "");
  EXPECT_NE(rope_store_rows_refusal(q, k, st, nullptr, {}), "");  // no angle table
  RopeArgs q96 = q;
  q96.head_dim = q96.head_stride = 96, q96.n_rot = 96;
  EXPECT_NE(rope_store_rows_refusal(q96, k, st, buf, {}), "");
  RopeArgs q_shifted = q;
  q_shifted.x = buf + 2;
  EXPECT_NE(rope_store_rows_refusal(q_shifted, k, st, buf, {}), "");
  RopeArgs k_other = k;
  k_other.freq_base = 500000.0f;
  EXPECT_NE(rope_store_rows_refusal(q, k_other, st, buf, {}), "");
  EXPECT_FALSE(rope_store_rows(q, k, st, nullptr, {}, nullptr).ok());
}

}  // namespace
}  // namespace kiln::cuda::testing
