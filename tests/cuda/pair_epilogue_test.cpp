// The q/k/v products taking rope_kv_store into their epilogue (PairEpilogue), through the
// CUDA backend, against the same ops recorded apart (a synchronize() between them records
// the held products on their own), bit for bit: q, k, v, the normed input and both cache
// slots; and the pass's table of rope angles followed when the positions change. Cases the
// epilogue cannot take (NeoX rope, int8 rows wider than 16 groups, f16 q/k with a bf16 v)
// must give the same values through the unfused ops. f16 / bf16 weights fuse through the
// 16-bit kernel's pair launch at any width. recorded_ops() says whether the fusion ran. Q4_K_M's mix (q4_K
// q/k, q6_K v) fuses through the two-format launch after rmsnorm (rmsnorm_matmul_parts) and
// stays one launch per type after matmul_parts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "fused_ops_fixture.h"

namespace kiln::testing {
namespace {

class PairEpilogues : public FusedOps {
 protected:
  std::vector<uint8_t> raw(const Tensor& t) {
    std::vector<uint8_t> v(t.bytes());
    gpu_->download(t, v.data(), v.size());
    return v;
  }
};

struct QkvCase {
  GgmlType type, v_type;
  int64_t K;
  int head_dim, n_rot, n_head, n_kv, tokens;
  RopeStyle style;
  bool norm;   // rmsnorm_matmul_parts (else matmul_parts)
  bool fuses;  // the epilogue takes it
};

TEST_F(PairEpilogues, QkvProductsThenRopeKvStoreMatchTheOpsApart) {
  const QkvCase cases[] = {
      {GgmlType::Q4_0, GgmlType::Q4_0, 4096, 128, 128, 8, 2, 1, RopeStyle::Normal, true, true},
      {GgmlType::Q8_0, GgmlType::Q8_0, 512, 64, 32, 6, 2, 3, RopeStyle::Normal, true, true},
      {GgmlType::Q4_K, GgmlType::Q4_K, 1024, 64, 64, 4, 4, 2, RopeStyle::Normal, false, true},
      {GgmlType::Q4_0, GgmlType::Q4_0, 2048, 128, 128, 4, 1, 1, RopeStyle::Neox, true, false},  // pairs 64 apart
      {GgmlType::Q4_0, GgmlType::Q4_0, 4096 + 256, 128, 128, 4, 2, 1, RopeStyle::Normal, true, false},  // 17 grp
      // Q4_K_M: q4_K q/k with a q6_K v.
      {GgmlType::Q4_K, GgmlType::Q6_K, 4096, 128, 128, 8, 2, 1, RopeStyle::Normal, true, true},
      {GgmlType::Q4_K, GgmlType::Q6_K, 2048, 64, 32, 8, 4, 8, RopeStyle::Normal, true, true},
      {GgmlType::Q4_K, GgmlType::Q6_K, 2048, 64, 64, 4, 2, 2, RopeStyle::Normal, false, false},  // per type
      {GgmlType::Q4_K, GgmlType::Q6_K, 6144, 128, 128, 4, 2, 1, RopeStyle::Normal, true, false},  // 24 groups
      // f16 / bf16 weights: the 16-bit kernel's pairs, any width (CudaOptions::half_epilogues).
      {GgmlType::F16, GgmlType::F16, 4096, 128, 128, 8, 2, 1, RopeStyle::Normal, true, true},
      {GgmlType::BF16, GgmlType::BF16, 6144 + 8, 64, 32, 4, 2, 3, RopeStyle::Normal, false, true},
      {GgmlType::F16, GgmlType::F16, 2048, 128, 128, 4, 1, 1, RopeStyle::Neox, true, false},
      {GgmlType::F16, GgmlType::BF16, 1024, 64, 64, 4, 2, 1, RopeStyle::Normal, true, false},  // two launches
  };
  const int64_t n_slots = 40;
  for (GgmlType cache_type : {GgmlType::F32, GgmlType::F16}) {
    for (const QkvCase& c : cases) {
      SCOPED_TRACE(std::string(type_name(c.type)) + "/" + std::string(type_name(c.v_type)) + " K " +
                   std::to_string(c.K) + " head_dim " +
                   std::to_string(c.head_dim) + " n_rot " + std::to_string(c.n_rot) + " heads " +
                   std::to_string(c.n_head) + "/" + std::to_string(c.n_kv) + " T " + std::to_string(c.tokens) +
                   (c.style == RopeStyle::Neox ? " neox" : "") + " cache " + std::string(type_name(cache_type)));
      const int64_t T = c.tokens, K = c.K;
      const int64_t q_width = int64_t(c.n_head) * c.head_dim, kv_width = int64_t(c.n_kv) * c.head_dim;
      const Tensor x = random({K, T}), norm_w = random({K});
      const Tensor wq = weight(c.type, K, q_width), wk = weight(c.type, K, kv_width);
      const Tensor wv = weight(c.v_type, K, kv_width);
      const Tensor bq = random({q_width}), none;
      RopeParams rope;
      rope.style = c.style;
      rope.n_rot = c.n_rot;
      rope.freq_base = 500000.0f;
      std::vector<int32_t> positions, slots;
      for (int64_t t = 0; t < T; ++t) positions.push_back(int32_t(700 * t + 13)), slots.push_back(int32_t(31 - 7 * t));
      const Tensor pos = ints(positions), slot = ints(slots);

      struct Side {
        Tensor normed, q, k, v;
        KvLayer cache;
      } side[2];
      for (int s = 0; s < 2; ++s) {
        Side& d = side[s];
        d.normed = poisoned(K, T), d.q = poisoned(q_width, T), d.k = poisoned(kv_width, T), d.v = poisoned(kv_width, T);
        d.cache.k = nan_cache(cache_type, kv_width, n_slots), d.cache.v = nan_cache(cache_type, kv_width, n_slots);
        d.cache.block_size = 8;
        gpu_->synchronize();
        const int64_t before = gpu_->recorded_ops();
        const Backend::MatmulPart parts[] = {{&wq, &bq, &d.q}, {&wk, &none, &d.k}, {&wv, nullptr, &d.v}};
        if (c.norm) gpu_->rmsnorm_matmul_parts(x, norm_w, 1e-5f, d.normed, parts);
        else gpu_->matmul_parts(x, parts);
        if (s == 1) gpu_->synchronize();  // the products recorded on their own
        Tensor q_heads = d.q.reshape({c.head_dim, c.n_head, T}), k_heads = d.k.reshape({c.head_dim, c.n_kv, T});
        gpu_->rope_kv_store(q_heads, k_heads, d.v, pos, rope, d.cache, slot);
        gpu_->synchronize();
        const int64_t ops = gpu_->recorded_ops() - before;
        if (s == 0) EXPECT_EQ(ops, c.fuses ? 1 : 2) << "ops recorded for the products and rope_kv_store";
      }
      EXPECT_TRUE(all_equal_bits(host(side[0].q), host(side[1].q), "q"));
      EXPECT_TRUE(all_equal_bits(host(side[0].k), host(side[1].k), "k"));
      EXPECT_TRUE(all_equal_bits(host(side[0].v), host(side[1].v), "v"));
      if (c.norm) EXPECT_TRUE(all_equal_bits(host(side[0].normed), host(side[1].normed), "normed"));
      for (int which = 0; which < 2; ++which) {
        const std::vector<uint8_t> got = raw(which ? side[0].cache.v : side[0].cache.k);
        const std::vector<uint8_t> want = raw(which ? side[1].cache.v : side[1].cache.k);
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
        EXPECT_EQ(differ, 0u) << (which ? "value" : "key") << " cache: " << differ << " bytes differ";
      }
    }
  }
}

// Two passes of two layers each over the same positions tensor, the positions uploaded anew
// for the second pass: every fused rotation must use its own pass's angles.
TEST_F(PairEpilogues, RopeAnglesFollowThePositionsOfEachPass) {
  const int64_t K = 512, T = 2, head_dim = 64, n_head = 4, n_kv = 2, n_slots = 16;
  const int64_t q_width = n_head * head_dim, kv_width = n_kv * head_dim;
  const Tensor x = random({K, T}), norm_w = random({K}), none;
  const Tensor wq = weight(GgmlType::Q4_0, K, q_width), wk = weight(GgmlType::Q4_0, K, kv_width),
               wv = weight(GgmlType::Q4_0, K, kv_width);
  RopeParams rope;
  rope.n_rot = int(head_dim);
  rope.freq_base = 10000.0f;
  const Tensor pos = ints({0, 0}), slot = ints({3, 9});
  const std::vector<int32_t> pass_positions[2] = {{5, 6}, {4000, 123}};
  for (int pass = 0; pass < 2; ++pass) {
    gpu_->upload(pass_positions[pass].data(), pos, 2 * sizeof(int32_t));
    for (int layer = 0; layer < 2; ++layer) {
      SCOPED_TRACE("pass " + std::to_string(pass) + " layer " + std::to_string(layer));
      std::vector<float> q[2], k[2];
      std::vector<uint8_t> cache[2];
      for (int s = 0; s < 2; ++s) {
        Tensor normed = poisoned(K, T), qo = poisoned(q_width, T), ko = poisoned(kv_width, T), vo = poisoned(kv_width, T);
        KvLayer c;
        c.k = nan_cache(GgmlType::F16, kv_width, n_slots), c.v = nan_cache(GgmlType::F16, kv_width, n_slots);
        c.block_size = 8;
        // The fused side records nothing else between its two layers: no upload, no sync.
        if (s == 1) gpu_->synchronize();
        const Backend::MatmulPart parts[] = {{&wq, &none, &qo}, {&wk, &none, &ko}, {&wv, &none, &vo}};
        gpu_->rmsnorm_matmul_parts(x, norm_w, 1e-5f, normed, parts);
        if (s == 1) gpu_->synchronize();
        Tensor q_heads = qo.reshape({head_dim, n_head, T}), k_heads = ko.reshape({head_dim, n_kv, T});
        gpu_->rope_kv_store(q_heads, k_heads, vo, pos, rope, c, slot);
        q[s] = host(qo), k[s] = host(ko), cache[s] = raw(c.k);
      }
      EXPECT_TRUE(all_equal_bits(q[0], q[1], "q"));
      EXPECT_TRUE(all_equal_bits(k[0], k[1], "k"));
      EXPECT_TRUE(cache[0] == cache[1]) << "key cache differs";
    }
  }
}

}  // namespace
}  // namespace kiln::testing
