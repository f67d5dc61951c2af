// The CUDA backend holding a one-token decode norm_rope_kv_store (Qwen3's q/k head norms,
// rope, cache store) back for the decode attention right after it, which then does that work
// in its own kernel (DecodeNewToken), vs the same two ops with a synchronize() between them
// (the held op then runs as its own rope_store launch first). Same kernels' arithmetic on
// both sides: the outputs and both caches agree bit for bit; recorded_ops() says whether
// the attention took the op in (one op instead of two; two with KILN_CUDA_ATTN_HEAD_NORM=0).
// Planned contexts 100, 700 and 3000 take one range in blocks of 512 threads, ranges merged
// in a cluster (sm_90) and ranges merged by the second kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "fused_ops_fixture.h"

namespace kiln::testing {
namespace {

TEST_F(FusedOps, AttentionTakesHeadNormsRopeAndStore) {
  const int n_head = 16, n_kv = 2, head_dim = 128, block = 16;
  const int64_t q_width = int64_t(n_head) * head_dim, kv_width = int64_t(n_kv) * head_dim;
  const char* sw = std::getenv("KILN_CUDA_ATTN_HEAD_NORM");
  const bool switched_on = !(sw && std::string(sw) == "0");
  RopeParams rope;
  rope.n_rot = head_dim;
  rope.style = RopeStyle::Neox;
  rope.freq_base = 1000000.0f;
  AttentionParams p;
  p.n_head = n_head, p.n_head_kv = n_kv, p.head_dim_k = head_dim, p.head_dim_v = head_dim;
  p.scale = 1.0f / std::sqrt(float(head_dim));
  for (const int32_t pos : {99, 699, 2999}) {
    const int max_blocks = pos / block + 1;
    const int64_t n_slots = int64_t(max_blocks + 1) * block;
    std::vector<int32_t> table(static_cast<size_t>(max_blocks + 1));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng_);  // scattered; the first max_blocks are the sequence's
    table.pop_back();
    const int32_t slot = table[size_t(pos / block)] * block + pos % block;
    const std::vector<float> q_host = random_floats(rng_, size_t(q_width), -2.0f, 2.0f);
    const std::vector<float> k_host = random_floats(rng_, size_t(kv_width), -2.0f, 2.0f);
    const std::vector<float> v_host = random_floats(rng_, size_t(kv_width), -2.0f, 2.0f);
    const Tensor qn = random({head_dim}), kn = random({head_dim});
    const Tensor cache_k_values = random({kv_width, n_slots}), cache_v_values = random({kv_width, n_slots});
    std::vector<int32_t> every_slot(static_cast<size_t>(n_slots));
    for (int64_t i = 0; i < n_slots; ++i) every_slot[size_t(i)] = int32_t(i);
    const Tensor all_slots = ints(every_slot);
    for (GgmlType cache_type : {GgmlType::F16, GgmlType::F32}) {
      SCOPED_TRACE(std::string(type_name(cache_type)) + " cache, position " + std::to_string(pos));
      std::vector<float> out[2];
      std::vector<uint8_t> caches[2][2];
      int64_t ops[2] = {0, 0};
      for (int side = 0; side < 2; ++side) {  // 0: back to back; 1: a synchronize() between
        KvLayer cache;
        cache.block_size = block;
        cache.k = nan_cache(cache_type, kv_width, n_slots), cache.v = nan_cache(cache_type, kv_width, n_slots);
        gpu_->kv_store(cache_k_values, cache_v_values, cache, all_slots);
        Tensor q = floats({q_width, 1}, q_host), k = floats({kv_width, 1}, k_host), v = floats({kv_width, 1}, v_host);
        BatchIndex batch{ints({pos}), ints({0}), ints({slot}), Tensor{}, pos};
        buffers_.push_back(gpu_->allocate(table.size() * 4));
        batch.block_tables = buffers_.back()->view(GgmlType::I32, {max_blocks, 1});
        gpu_->upload(table.data(), batch.block_tables, table.size() * 4);
        Tensor attn = poisoned(q_width, 1);
        Tensor qh = q.reshape({head_dim, n_head, 1}), kh = k.reshape({head_dim, n_kv, 1});
        const int64_t before = gpu_->recorded_ops();
        gpu_->norm_rope_kv_store(qh, kh, v, qn, kn, 1e-6f, batch.positions, rope, cache, batch.slots);
        if (side == 1) gpu_->synchronize();
        gpu_->attention(q, cache, batch, p, attn);
        ops[side] = gpu_->recorded_ops() - before;
        out[side] = host(attn);
        for (int which = 0; which < 2; ++which) {
          const Tensor& c = which ? cache.v : cache.k;
          caches[side][which].resize(c.bytes());
          gpu_->download(c, caches[side][which].data(), c.bytes());
        }
      }
      EXPECT_EQ(ops[0], switched_on ? 1 : 2) << "ops recorded for norm_rope_kv_store + attention back to back";
      EXPECT_EQ(ops[1], 2) << "ops recorded with a synchronize() between";
      for (float x : out[1]) ASSERT_TRUE(std::isfinite(x)) << "the output apart is not finite";
      EXPECT_TRUE(all_equal_bits(out[0], out[1], "attention output"));
      for (int which = 0; which < 2; ++which) {
        size_t differ = 0;
        for (size_t i = 0; i < caches[0][which].size(); ++i) differ += caches[0][which][i] != caches[1][which][i];
        EXPECT_EQ(differ, 0u) << (which ? "value" : "key") << " cache: " << differ << " bytes differ";
      }
    }
  }
}

}  // namespace
}  // namespace kiln::testing
