// Decode attention that takes its token's q/k head norms, rope and cache store in
// (DecodeNewToken, attention.h) against the two launches it replaces: rope_store() with the
// same norms and rope_table angles, then decode_attention() over the cache that wrote.
// Both sides use the same norm, rotation and rounding arithmetic (rope_math.cuh) and the
// same key loop, so the outputs and the whole caches (the token's slot, and every other slot
// untouched) must agree bit for bit. Every plan kind: one range in blocks of 512 threads,
// one range in blocks of 128, ranges merged in a cluster, ranges merged by the second
// kernel; the token at the first position, at the ends and starts of ranges and at the last
// planned position; f16 and f32 caches; head sizes 64, 128, 256; 1, 4 and 8 query heads per
// kv head; a slot of -1 (no cache write, the same output).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cuda/attention.h"
#include "backend/cuda/rope_store.h"
#include "cuda_test_support.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

struct HeadShape {
  int head_dim, n_head, n_head_kv;
  GgmlType cache;
  int n_rot;
  bool neox = true;
  bool q_norm = true, k_norm = true;
};

DecodeAttentionPlan plan_of(int heads_per_block, int n_splits, int keys_per_split, bool cluster, bool wide = false) {
  DecodeAttentionPlan p;
  p.heads_per_block = heads_per_block, p.n_splits = n_splits, p.keys_per_split = keys_per_split;
  p.cluster = cluster, p.wide = wide;
  return p;
}

std::string describe(const DecodeAttentionPlan& p) {
  return std::to_string(p.heads_per_block) + " heads per block, " + std::to_string(p.n_splits) + " ranges of " +
         std::to_string(p.keys_per_split) + (p.cluster ? " keys, cluster" : p.wide ? " keys, 512 threads" : " keys");
}

// Cache contents as bytes of the cache's type (f16 or f32) from random values.
std::vector<uint8_t> cache_bytes(const std::vector<float>& values, GgmlType type) {
  const size_t elem = type == GgmlType::F16 ? 2 : 4;
  std::vector<uint8_t> bytes(values.size() * elem);
  for (size_t i = 0; i < values.size(); ++i) {
    if (elem == 4) {
      std::memcpy(&bytes[4 * i], &values[i], 4);
    } else {
      const uint16_t h = f32_to_f16(values[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  return bytes;
}

size_t differing_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// One token at position `pos` of one sequence, planned context max_context, under `plan`.
// no_slot: the fused side gets slot -1 (it must write nothing; the side apart writes the
// real slot so that its output is the reference).
void run_case(const HeadShape& c, const DecodeAttentionPlan& plan, int max_context, int pos, bool no_slot,
              uint64_t seed) {
  SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " heads " + std::to_string(c.n_head) + "/" +
               std::to_string(c.n_head_kv) + " " + std::string(type_name(c.cache)) + " n_rot " +
               std::to_string(c.n_rot) + (c.neox ? " neox" : " normal") + (c.q_norm ? " q norm" : "") +
               (c.k_norm ? " k norm" : "") + ", context " + std::to_string(max_context) + ", position " +
               std::to_string(pos) + (no_slot ? ", slot -1" : "") + ": " + describe(plan));
  std::mt19937_64 rng(seed);
  const int D = c.head_dim, block_size = 16;
  const int max_blocks = (max_context + block_size - 1) / block_size, n_blocks = max_blocks + 2;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);  // the first max_blocks are the sequence's
  const int64_t n_slots = int64_t(n_blocks) * block_size;
  const int64_t row = int64_t(c.n_head_kv) * D, slot_stride = row + 8;
  const int32_t slot = table[size_t(pos / block_size)] * block_size + pos % block_size;

  const std::vector<uint8_t> k_init = cache_bytes(random_floats(rng, size_t(n_slots * slot_stride)), c.cache);
  const std::vector<uint8_t> v_init = cache_bytes(random_floats(rng, size_t(n_slots * slot_stride)), c.cache);
  const std::vector<float> q_raw = random_floats(rng, size_t(c.n_head) * D, -2.0f, 2.0f);
  const std::vector<float> k_raw = random_floats(rng, size_t(row), -2.0f, 2.0f);
  const std::vector<float> v_raw = random_floats(rng, size_t(row), -2.0f, 2.0f);
  const std::vector<float> q_norm = random_floats(rng, size_t(D), 0.5f, 1.5f);
  const std::vector<float> k_norm = random_floats(rng, size_t(D), 0.5f, 1.5f);
  const std::vector<int32_t> positions = {pos};
  const DeviceBuffer table_d = to_device(table), pos_d = to_device(positions), v_d = to_device(v_raw);
  const DeviceBuffer qn_d = to_device(q_norm), kn_d = to_device(k_norm);
  const DeviceBuffer slot_d = to_device(std::vector<int32_t>{slot}), no_slot_d = to_device(std::vector<int32_t>{-1});

  // The token's angles, as a pass's table.
  RopeArgs rope;
  rope.positions = pos_d.as<int32_t>();
  rope.n_tokens = 1, rope.n_heads = c.n_head, rope.head_dim = D, rope.token_stride = c.n_head * D, rope.head_stride = D;
  rope.n_rot = c.n_rot, rope.neox = c.neox, rope.freq_base = 1000000.0f;
  const DeviceBuffer angles_d(size_t(c.n_rot) * 4);
  rope.x = reinterpret_cast<float*>(angles_d.as());  // not read by rope_table
  KILN_STATUS_OK(rope_table(rope, angles_d.as<float>(), nullptr));

  struct Side {
    DeviceBuffer k_cache, v_cache, q, k, out;
  };
  const size_t n_out = size_t(c.n_head) * D;
  auto make_side = [&] {
    return Side{to_device(k_init), to_device(v_init), to_device(q_raw), to_device(k_raw), DeviceBuffer(n_out * 4)};
  };
  Side side[2] = {make_side(), make_side()};  // 0: rope_store then attention; 1: the attention taking the token in
  side[0].out.poison();
  side[1].out.poison();
  auto attention_args = [&](const Side& s) {
    DecodeAttentionArgs a;
    a.q = s.q.as<float>(), a.q_stride = int64_t(c.n_head) * D;
    a.k_cache = s.k_cache.as(), a.v_cache = s.v_cache.as();
    a.k_slot_stride = a.v_slot_stride = slot_stride;
    a.cache_type = c.cache;
    a.block_tables = table_d.as<int32_t>(), a.block_table_stride = n_blocks, a.block_size = block_size;
    a.positions = pos_d.as<int32_t>();
    a.n_seq = 1, a.n_head = c.n_head, a.n_head_kv = c.n_head_kv, a.head_dim = D;
    a.max_context = max_context;
    a.scale = 1.0f / std::sqrt(float(D));
    a.out = s.out.as<float>(), a.out_stride = int64_t(c.n_head) * D;
    return a;
  };
  const HeadNorms norms{c.q_norm ? qn_d.as<float>() : nullptr, c.k_norm ? kn_d.as<float>() : nullptr, 1e-6f};

  // Apart: rope_store writes the normed, rotated q and k in place and the cache slot.
  RopeArgs q_rope = rope, k_rope = rope;
  q_rope.x = side[0].q.as<float>();
  k_rope.x = side[0].k.as<float>(), k_rope.n_heads = c.n_head_kv, k_rope.token_stride = row;
  KvStoreArgs st;
  st.k = side[0].k.as<float>(), st.k_stride = row, st.k_width = row;
  st.v = v_d.as<float>(), st.v_stride = row, st.v_width = row;
  st.cache_k = side[0].k_cache.as(), st.cache_v = side[0].v_cache.as(), st.cache_type = c.cache;
  st.cache_k_stride = st.cache_v_stride = slot_stride, st.n_slots = n_slots;
  st.slots = slot_d.as<int32_t>(), st.n_tokens = 1;
  KILN_STATUS_OK(rope_store(q_rope, k_rope, st, nullptr, angles_d.as<float>(), norms));
  const DecodeAttentionArgs apart = attention_args(side[0]);
  const DeviceBuffer apart_scratch(std::max<size_t>(16, decode_attention_scratch_bytes(apart, plan)));
  KILN_STATUS_OK(decode_attention(apart, plan, apart_scratch.as(), apart_scratch.bytes(), nullptr));

  // Fused: the raw q, k and v.
  DecodeAttentionArgs fused = attention_args(side[1]);
  DecodeNewToken& t = fused.new_token;
  t.k = side[1].k.as<float>(), t.v = v_d.as<float>();
  t.q_norm = norms.q, t.k_norm = norms.k, t.eps = norms.eps;
  t.angles = angles_d.as<float>(), t.n_rot = c.n_rot, t.neox = c.neox;
  t.slot = no_slot ? no_slot_d.as<int32_t>() : slot_d.as<int32_t>(), t.n_slots = n_slots;
  t.k_cache = side[1].k_cache.as(), t.v_cache = side[1].v_cache.as();
  ASSERT_EQ(decode_new_token_refusal(fused), "");
  const DeviceBuffer fused_scratch(std::max<size_t>(16, decode_attention_scratch_bytes(fused, plan)));
  fused_scratch.poison();
  KILN_STATUS_OK(decode_attention(fused, plan, fused_scratch.as(), fused_scratch.bytes(), nullptr));

  const std::vector<float> want = to_host<float>(side[0].out, n_out), got = to_host<float>(side[1].out, n_out);
  ASSERT_TRUE(std::all_of(want.begin(), want.end(), [](float v) { return std::isfinite(v); }))
      << "the reference output is not finite";
  EXPECT_TRUE(all_equal_bits(got, want, "attention output"));
  for (int which = 0; which < 2; ++which) {
    const DeviceBuffer& mine = which ? side[1].v_cache : side[1].k_cache;
    const DeviceBuffer& theirs = which ? side[0].v_cache : side[0].k_cache;
    const std::vector<uint8_t>& init = which ? v_init : k_init;
    const std::vector<uint8_t> got_cache = to_host<uint8_t>(mine, init.size());
    const std::vector<uint8_t> want_cache = no_slot ? init : to_host<uint8_t>(theirs, init.size());
    EXPECT_EQ(differing_bytes(got_cache, want_cache), 0u)
        << (which ? "value" : "key") << " cache differs from " << (no_slot ? "its first contents" : "rope_store's");
  }
  // The raw inputs stay raw.
  EXPECT_TRUE(all_equal_bits(to_host<float>(side[1].q, q_raw.size()), q_raw, "q after"));
  EXPECT_TRUE(all_equal_bits(to_host<float>(side[1].k, k_raw.size()), k_raw, "k after"));
}

// Positions that put the token first, at the last and first key of neighbouring ranges, and
// at the end of the planned span.
std::vector<int> positions_for(const DecodeAttentionPlan& plan, int max_context) {
  std::vector<int> p = {0, max_context / 2, max_context - 1};
  const int k = plan.keys_per_split;
  if (k < max_context) p.push_back(k - 1), p.push_back(k);
  if (2 * k + 3 < max_context) p.push_back(2 * k + 3);
  return p;
}

void run_plans(const HeadShape& c, const std::vector<std::pair<DecodeAttentionPlan, int>>& plans, uint64_t seed) {
  for (const auto& [plan, context] : plans) {
    if (plan.cluster && !decode_attention_clusters_available()) continue;  // sm_90 only
    for (int pos : positions_for(plan, context)) run_case(c, plan, context, pos, false, seed++);
  }
}

// Qwen3-30B-A3B's attention: 32 query heads over 4 kv heads of 128 (8 per kv head).
TEST(CudaDecodeNewToken, HeadDim128EightQueryHeadsPerKvHead) {
  KILN_REQUIRE_GPU();
  for (GgmlType cache : {GgmlType::F16, GgmlType::F32}) {
    const HeadShape c{128, 32, 4, cache, 128};
    run_plans(c,
              {{plan_of(1, 1, 256, false, true), 256},
               {plan_of(2, 1, 160, false, true), 150},
               {plan_of(8, 1, 96, false), 96},
               {plan_of(8, 16, 64, true), 1024},
               {plan_of(4, 9, 32, true), 280},
               {plan_of(8, 5, 64, false), 300},
               {plan_of(2, 8, 32, false), 256}},
              100 + int(cache));
  }
}

// One query head per kv head, head size 64; rotation of the first half of each head only,
// neighbouring pairs (normal style).
TEST(CudaDecodeNewToken, HeadDim64OneQueryHeadPerKvHead) {
  KILN_REQUIRE_GPU();
  for (GgmlType cache : {GgmlType::F32, GgmlType::F16}) {
    HeadShape c{64, 8, 8, cache, 32};
    c.neox = false;
    run_plans(c,
              {{plan_of(1, 1, 100, false, true), 100},
               {plan_of(1, 4, 32, true), 128},
               {plan_of(1, 3, 64, false), 170}},
              200 + int(cache));
  }
}

// Head size 256, four query heads per kv head; the q norm alone, then the k norm alone.
TEST(CudaDecodeNewToken, HeadDim256FourQueryHeadsPerKvHead) {
  KILN_REQUIRE_GPU();
  for (GgmlType cache : {GgmlType::F16, GgmlType::F32}) {
    HeadShape c{256, 16, 4, cache, 256};
    c.k_norm = false;
    run_plans(c,
              {{plan_of(2, 1, 200, false, true), 200},
               {plan_of(4, 8, 32, true), 256},
               {plan_of(4, 4, 128, false), 500}},
              300 + int(cache));
    c.k_norm = true, c.q_norm = false, c.n_rot = 128;
    run_plans(c, {{plan_of(1, 1, 64, false, true), 64}, {plan_of(4, 3, 96, false), 260}}, 350 + int(cache));
  }
}

// The plan plan_decode_attention() picks, over the contexts of its regimes.
TEST(CudaDecodeNewToken, PlannedRegimes) {
  KILN_REQUIRE_GPU();
  const HeadShape c{128, 32, 4, GgmlType::F16, 128};
  uint64_t seed = 400;
  for (int context : {17, 256, 700, 2048, 5000}) {
    DecodeAttentionArgs a;
    a.n_seq = 1, a.n_head = c.n_head, a.n_head_kv = c.n_head_kv, a.head_dim = c.head_dim, a.max_context = context;
    const DecodeAttentionPlan plan = plan_decode_attention(a);
    for (int pos : positions_for(plan, context)) run_case(c, plan, context, pos, false, seed++);
  }
}

// Slot -1: no cache byte changes, the output is the same (the token's key never came from
// the cache).
TEST(CudaDecodeNewToken, NoSlotWritesNothing) {
  KILN_REQUIRE_GPU();
  for (GgmlType cache : {GgmlType::F16, GgmlType::F32}) {
    const HeadShape c{128, 32, 4, cache, 128};
    run_case(c, plan_of(1, 1, 256, false, true), 256, 40, true, 500);
    run_case(c, plan_of(8, 5, 64, false), 300, 299, true, 501);
    if (decode_attention_clusters_available()) run_case(c, plan_of(8, 16, 64, true), 1024, 64, true, 502);
  }
}

TEST(CudaDecodeNewToken, RefusesWhatItCannotTake) {
  DecodeAttentionArgs a;
  a.n_seq = 1, a.n_head = 8, a.n_head_kv = 2, a.head_dim = 128;
  alignas(16) int dummy[4];
  a.k_cache = dummy, a.v_cache = dummy;
  EXPECT_EQ(decode_new_token_refusal(a), "no new token given");
  DecodeNewToken& t = a.new_token;
  t.k = t.v = t.angles = reinterpret_cast<const float*>(dummy);
  t.slot = dummy, t.k_cache = dummy, t.v_cache = dummy, t.n_rot = 128;
  EXPECT_EQ(decode_new_token_refusal(a), "");
  a.n_seq = 2;
  EXPECT_NE(decode_new_token_refusal(a).find("one token, not 2"), std::string::npos);
  a.n_seq = 1, a.softcap = 30.0f;
  EXPECT_NE(decode_new_token_refusal(a).find("softcap"), std::string::npos);
  a.softcap = 0.0f, t.n_rot = 130;
  EXPECT_NE(decode_new_token_refusal(a).find("n_rot 130"), std::string::npos);
  t.n_rot = 128, t.v_cache = nullptr;
  EXPECT_NE(decode_new_token_refusal(a).find("caches"), std::string::npos);
}

}  // namespace
}  // namespace kiln::cuda
