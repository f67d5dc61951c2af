// Decode attention (backend/cuda/attention.h) against a double-precision reference over a
// paged cache with shuffled block tables, at contexts 1, 17, 1000 and 5000 (which take one
// key range or several merged ranges), and with given plans at planned contexts (a graph's
// bucket) longer than the tokens' own: ranges merged in a cluster (1..16 ranges) or by the
// second kernel, empty ranges among them, or one range in blocks of 512 threads. The int8
// copy of the output every plan can leave is checked byte for byte against quantize_q8's
// arithmetic on the f32 output.
//
// Error bound: f32 dot products, expf and f32 sums: |out - ref| <= 2e-5 * sum_j p_j |v_j|
// (+ 1e-7) per element, p_j the reference softmax weights. With an f16 cache the reference
// takes K, V and the query rounded to f16, as the kernel does.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <optional>

#include "backend/cuda/attention.h"
#include "cuda_test_support.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

struct AttnCase {
  int head_dim, n_head, n_head_kv;
  GgmlType cache;
  std::vector<int32_t> positions;
  float softcap = 0.0f;
  int window = 0;
  bool sinks = false;
  float q_scale = 1.0f;
  int max_context = 0;  // the planned context (> every position); 0: the longest position + 1
  std::optional<DecodeAttentionPlan> plan;  // else plan_decode_attention()'s
};

DecodeAttentionPlan given_plan(int heads_per_block, int n_splits, int keys_per_split, bool cluster) {
  DecodeAttentionPlan p;
  p.heads_per_block = heads_per_block, p.n_splits = n_splits, p.keys_per_split = keys_per_split, p.cluster = cluster;
  return p;
}

// One range of `keys` keys in blocks of 512 threads.
DecodeAttentionPlan wide_plan(int heads_per_block, int keys) {
  DecodeAttentionPlan p = given_plan(heads_per_block, 1, keys, false);
  p.wide = true;
  return p;
}

void run_case(const AttnCase& c, uint64_t seed) {
  SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " heads " + std::to_string(c.n_head) + "/" +
               std::to_string(c.n_head_kv) + " " + std::string(type_name(c.cache)) + " softcap " +
               std::to_string(c.softcap) + " window " + std::to_string(c.window) + (c.sinks ? " sinks" : ""));
  std::mt19937_64 rng(seed);
  const int D = c.head_dim, n_seq = int(c.positions.size()), block_size = 16;
  const int max_context =
      std::max(c.max_context, *std::max_element(c.positions.begin(), c.positions.end()) + 1);
  const int max_blocks = (max_context + block_size - 1) / block_size;
  // Physical blocks: every sequence gets its own, handed out in shuffled order.
  std::vector<int32_t> physical(size_t(n_seq * max_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  const int64_t table_stride = max_blocks + 3;
  std::vector<int32_t> tables(size_t(n_seq * table_stride), -1);
  for (int s = 0; s < n_seq; ++s)
    for (int b = 0; b < max_blocks; ++b) tables[s * table_stride + b] = physical[s * max_blocks + b];
  const int64_t n_slots = int64_t(n_seq) * max_blocks * block_size;
  const int64_t row = int64_t(c.n_head_kv) * D, slot_stride = row + 8;
  const bool half = c.cache == GgmlType::F16;
  // Cache values as the kernel will see them (rounded to f16 for an f16 cache).
  std::vector<float> kf = random_floats(rng, size_t(n_slots * slot_stride)), vf = random_floats(rng, size_t(n_slots * slot_stride));
  std::vector<uint16_t> kh, vh;
  if (half) {
    for (float& v : kf) kh.push_back(f32_to_f16(v)), v = f16_to_f32(kh.back());
    for (float& v : vf) vh.push_back(f32_to_f16(v)), v = f16_to_f32(vh.back());
  }
  const int64_t q_stride = int64_t(c.n_head) * D + 5, out_stride = int64_t(c.n_head) * D + 3;
  const std::vector<float> q = random_floats(rng, size_t(n_seq * q_stride), -c.q_scale, c.q_scale);
  // The query as the kernel uses it: rounded to f16 against an f16 cache.
  std::vector<float> q_used = q;
  if (half)
    for (float& v : q_used) v = f16_to_f32(f32_to_f16(v));
  const std::vector<float> sinks = random_floats(rng, size_t(c.n_head), -2.0f, 4.0f);

  const DeviceBuffer k_d = half ? to_device(kh) : to_device(kf), v_d = half ? to_device(vh) : to_device(vf);
  const DeviceBuffer q_d = to_device(q), t_d = to_device(tables), p_d = to_device(c.positions), s_d = to_device(sinks);
  DeviceBuffer out_d(size_t(n_seq * out_stride) * 4);
  out_d.poison();

  DecodeAttentionArgs a;
  a.q = q_d.as<float>();
  a.q_stride = q_stride;
  a.k_cache = k_d.as();
  a.v_cache = v_d.as();
  a.k_slot_stride = a.v_slot_stride = slot_stride;
  a.cache_type = c.cache;
  a.block_tables = t_d.as<int32_t>();
  a.block_table_stride = table_stride;
  a.block_size = block_size;
  a.positions = p_d.as<int32_t>();
  a.n_seq = n_seq;
  a.n_head = c.n_head;
  a.n_head_kv = c.n_head_kv;
  a.head_dim = D;
  a.max_context = max_context;
  a.scale = 1.0f / std::sqrt(float(D));
  a.softcap = c.softcap;
  a.sliding_window = c.window;
  a.sinks = c.sinks ? s_d.as<float>() : nullptr;
  a.out = out_d.as<float>();
  a.out_stride = out_stride;
  // Every plan leaves the int8 copy of the output too when asked (rows of 32-value blocks).
  const int64_t n_out = int64_t(c.n_head) * D;
  const int64_t q8_row = ((n_out + n_out / 32 * 8 + 15) / 16 + 1) * 16;  // values, scales, a 16-byte multiple
  DeviceBuffer q8_d(size_t(std::max<int64_t>(16, n_seq * q8_row)));
  q8_d.poison();
  if (n_out % 32 == 0) a.out_q8 = static_cast<uint8_t*>(q8_d.as()), a.out_q8_row_bytes = q8_row;
  const DecodeAttentionPlan plan = c.plan ? *c.plan : plan_decode_attention(a);
  SCOPED_TRACE("planned context " + std::to_string(max_context) + ": " + std::to_string(plan.heads_per_block) +
               " heads per block, " + std::to_string(plan.n_splits) + " ranges of " +
               std::to_string(plan.keys_per_split) +
               (plan.cluster ? " keys, cluster" : plan.wide ? " keys, 512 threads" : " keys"));
  DeviceBuffer scratch(std::max<size_t>(16, decode_attention_scratch_bytes(a, plan)));
  scratch.poison();
  KILN_STATUS_OK(decode_attention(a, plan, scratch.as(), scratch.bytes(), nullptr));
  const std::vector<float> out_all = to_host<float>(out_d, size_t(n_seq * out_stride));
  if (a.out_q8) {
    const std::vector<uint8_t> q8_all = to_host<uint8_t>(q8_d, size_t(n_seq * q8_row));
    for (int s = 0; s < n_seq; ++s)
      expect_q8_copy_of(&out_all[size_t(s * out_stride)], n_out, &q8_all[size_t(s * q8_row)],
                        "sequence " + std::to_string(s));
  }

  std::vector<float> got;
  std::vector<double> want, tol;
  const int group = c.n_head / c.n_head_kv;
  for (int s = 0; s < n_seq; ++s) {
    const int pos = c.positions[s];
    const int first = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
    auto slot = [&](int j) { return int64_t(tables[s * table_stride + j / block_size]) * block_size + j % block_size; };
    for (int h = 0; h < c.n_head; ++h) {
      const int kvh = h / group;
      std::vector<double> score;
      double m = c.sinks ? sinks[h] : -INFINITY;
      for (int j = first; j <= pos; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += double(q_used[s * q_stride + h * D + d]) * kf[slot(j) * slot_stride + kvh * D + d];
        double sc = dot * a.scale;
        if (c.softcap > 0) sc = c.softcap * std::tanh(sc / c.softcap);
        score.push_back(sc);
        m = std::max(m, sc);
      }
      double denom = c.sinks ? std::exp(sinks[h] - m) : 0.0;
      for (double& sc : score) denom += (sc = std::exp(sc - m));
      for (int d = 0; d < D; ++d) {
        double acc = 0, mag = 0;
        for (int j = first; j <= pos; ++j) {
          const double p = score[j - first] / denom, v = vf[slot(j) * slot_stride + kvh * D + d];
          acc += p * v;
          mag += p * std::fabs(v);
        }
        want.push_back(acc);
        tol.push_back(2e-5 * mag + 1e-7);
        got.push_back(out_all[s * out_stride + h * D + d]);
      }
    }
  }
  EXPECT_TRUE(all_close(got, want, tol, "attention output"));
}

const std::vector<int32_t> kContexts = {0, 16, 999, 4999};  // contexts 1, 17, 1000, 5000

TEST(CudaDecodeAttention, GqaF16Cache) {
  KILN_REQUIRE_GPU();
  run_case({128, 32, 8, GgmlType::F16, kContexts}, 21);
}

TEST(CudaDecodeAttention, MultiHeadF32CacheDim64) {
  KILN_REQUIRE_GPU();
  run_case({64, 8, 8, GgmlType::F32, kContexts}, 22);
}

TEST(CudaDecodeAttention, EightQueryHeadsPerKvHeadSoftcapWindow) {
  KILN_REQUIRE_GPU();
  AttnCase c{128, 16, 2, GgmlType::F16, kContexts};
  c.softcap = 20.0f;
  c.window = 256;
  c.q_scale = 6.0f;
  run_case(c, 23);
}

TEST(CudaDecodeAttention, SinksWithSixQueryHeadsPerKvHead) {
  KILN_REQUIRE_GPU();
  AttnCase c{64, 12, 2, GgmlType::F32, kContexts};
  c.sinks = true;
  run_case(c, 24);
}

TEST(CudaDecodeAttention, HeadDim256) {
  KILN_REQUIRE_GPU();
  run_case({256, 8, 1, GgmlType::F16, {0, 16, 999}}, 25);
  run_case({256, 4, 2, GgmlType::F32, {3, 300}}, 26);
}

#define KILN_REQUIRE_CLUSTERS()                                                       \
  do {                                                                                \
    KILN_REQUIRE_GPU();                                                               \
    if (!decode_attention_clusters_available()) GTEST_SKIP() << "no sm_90 clusters here"; \
  } while (0)

// One sequence, 32 query heads over 8 kv heads, 4 per block: k ranges of 32 keys merged in a
// cluster of k blocks. The token sits at the last position (every range holds keys) or at a
// random one (later ranges empty).
TEST(CudaDecodeAttention, ClusterMergeOfOneToSixteenRanges) {
  KILN_REQUIRE_CLUSTERS();
  std::mt19937 rng(31);
  for (int k = 1; k <= kMaxClusterSplits; ++k) {
    for (int32_t pos : {32 * k - 1, int32_t(rng() % uint32_t(32 * k))}) {
      AttnCase c{128, 32, 8, GgmlType::F16, {pos}};
      c.max_context = 32 * k;
      c.plan = given_plan(4, k, 32, true);
      run_case(c, 100 + k);
    }
  }
}

// Several sequences in one launch, each with its own number of empty ranges; f32 cache.
TEST(CudaDecodeAttention, ClusterMergeSeveralSequences) {
  KILN_REQUIRE_CLUSTERS();
  AttnCase c{128, 32, 8, GgmlType::F32, {0, 5, 300, 511, 97}};
  c.max_context = 512;
  c.plan = given_plan(4, 16, 32, true);
  run_case(c, 41);
}

// Sinks, soft-capping and a sliding window (the window is the span the ranges cover); two
// query heads per block (groups of 6).
TEST(CudaDecodeAttention, ClusterMergeSinksSoftcapWindow) {
  KILN_REQUIRE_CLUSTERS();
  AttnCase c{64, 12, 2, GgmlType::F32, {3, 150, 399, 260}};
  c.sinks = true;
  c.softcap = 15.0f;
  c.q_scale = 4.0f;
  c.window = 100;
  c.max_context = 400;
  c.plan = given_plan(2, 4, 32, true);
  run_case(c, 42);
  c.window = 0;
  c.cache = GgmlType::F16;
  c.plan = given_plan(2, 13, 32, true);
  run_case(c, 43);
}

// Eight query heads per block (head size 128), four of head size 256, one of head size 64.
TEST(CudaDecodeAttention, ClusterMergeWideAndNarrowHeadGroups) {
  KILN_REQUIRE_CLUSTERS();
  AttnCase wide{128, 16, 2, GgmlType::F16, {200, 33}};
  wide.max_context = 320;
  wide.plan = given_plan(8, 10, 32, true);
  run_case(wide, 44);
  AttnCase big{256, 8, 1, GgmlType::F32, {250, 0, 129}};
  big.max_context = 256;
  big.sinks = true;
  big.plan = given_plan(4, 8, 32, true);
  run_case(big, 45);
  AttnCase single{64, 8, 8, GgmlType::F16, {700, 64}};
  single.max_context = 1024;
  single.plan = given_plan(1, 16, 64, true);
  run_case(single, 46);
}

// The short-span plan (plan_decode_attention's with the wide regime switched off): ranges
// of 32 keys, 2 heads per block, merged by the second kernel, which reads only the ranges
// that hold keys; with sinks and a window too.
TEST(CudaDecodeAttention, SecondKernelMergesShortRanges) {
  KILN_REQUIRE_GPU();
  AttnCase c{128, 32, 8, GgmlType::F16, {0, 40, 255, 130}};
  c.max_context = 256;
  c.plan = given_plan(2, 8, 32, false);
  run_case(c, 47);
  AttnCase w{64, 12, 2, GgmlType::F32, {3, 90, 249}};
  w.sinks = true;
  w.window = 50;
  w.max_context = 250;
  w.plan = given_plan(2, 2, 32, false);
  run_case(w, 48);
}

// One range per head group in blocks of 512 threads (several key steps where the range is
// longer than one step), the token anywhere in the planned span; with several sequences,
// sinks, soft-capping, a window, both caches and the three head sizes.
TEST(CudaDecodeAttention, WideBlocksTakeOneRange) {
  KILN_REQUIRE_GPU();
  for (int heads : {1, 2}) {
    AttnCase c{128, 32, 8, GgmlType::F16, {0, 40, 127, 128, 255}};
    c.max_context = 256;
    c.plan = wide_plan(heads, 256);
    run_case(c, 60 + heads);
  }
  AttnCase w{64, 12, 2, GgmlType::F32, {3, 90, 249, 500}};
  w.sinks = true;
  w.softcap = 15.0f;
  w.q_scale = 4.0f;
  w.window = 100;
  w.max_context = 501;
  w.plan = wide_plan(2, 100);
  run_case(w, 63);
  AttnCase big{256, 8, 2, GgmlType::F16, {0, 77, 300}};
  big.max_context = 320;
  big.plan = wide_plan(2, 320);
  run_case(big, 64);
  AttnCase one{128, 16, 2, GgmlType::F32, {5}};
  one.sinks = true;
  one.plan = wide_plan(1, 32);
  run_case(one, 65);
}

// The blocks may let the next kernel be scheduled as they start (DecodeAttentionPlan::
// trigger_early): every kind of plan then gives what the reference wants, as without.
TEST(CudaDecodeAttention, EarlyTriggerInEveryPlan) {
  KILN_REQUIRE_GPU();
  auto early = [](DecodeAttentionPlan p) {
    p.trigger_early = true;
    return p;
  };
  AttnCase wide{128, 32, 8, GgmlType::F16, {0, 40, 127, 255}};
  wide.max_context = 256;
  wide.plan = early(wide_plan(1, 256));
  run_case(wide, 70);
  AttnCase second{64, 12, 2, GgmlType::F32, {3, 90, 249}};
  second.sinks = true;
  second.max_context = 250;
  second.plan = early(given_plan(2, 8, 32, false));
  run_case(second, 71);
  if (decode_attention_clusters_available()) {
    AttnCase cluster{128, 32, 8, GgmlType::F16, {5, 300, 511}};
    cluster.max_context = 512;
    cluster.plan = early(given_plan(4, 16, 32, true));
    run_case(cluster, 72);
  }
}

// What plan_decode_attention() picks for one Llama-3-8B token (32 query heads over 8 kv
// heads of 128) as the planned context grows (attention.cu names the three regimes).
TEST(CudaDecodeAttention, PlanRegimes) {
  DecodeAttentionArgs a;
  a.n_seq = 1, a.n_head = 32, a.n_head_kv = 8, a.head_dim = 128;
  const bool clusters = decode_attention_clusters_available();
  const bool early_switch_set = std::getenv("KILN_CUDA_ATTN_EARLY_TRIGGER") != nullptr;
  struct Want {
    int context, heads, n_splits, keys;
    bool cluster, wide = false;
  };
  const Want wants[] = {
      {100, 1, 1, 128, false, true}, {256, 1, 1, 256, false, true},
      {257, 4, 9, 32, true},         {512, 4, 16, 32, true},
      {1024, 4, 16, 64, true},       {2048, 4, 16, 128, true},
      {4096, 4, 64, 64, false},      {40000, 4, 79, 512, false},
  };
  for (Want w : wants) {
    SCOPED_TRACE("context " + std::to_string(w.context));
    if (w.cluster && !clusters) {  // the second kernel's plan instead
      w.keys = std::max(64, (w.context / 66 + 31) / 32 * 32);
      w.n_splits = (w.context + w.keys - 1) / w.keys;
    }
    a.max_context = w.context;
    const DecodeAttentionPlan p = plan_decode_attention(a);
    EXPECT_EQ(p.heads_per_block, w.heads);
    EXPECT_EQ(p.n_splits, w.n_splits);
    EXPECT_EQ(p.keys_per_split, w.keys);
    EXPECT_EQ(p.cluster, w.cluster && clusters);
    EXPECT_EQ(p.wide, w.wide);
    if (!early_switch_set) EXPECT_TRUE(p.trigger_early);
  }
  // By default also where the kernel takes the new token in (Qwen3-style head norms).
  static const float any_key = 0.0f;  // the plan only asks whether the token is taken in
  a.new_token.k = &any_key;
  a.max_context = 100;
  if (!early_switch_set) EXPECT_TRUE(plan_decode_attention(a).trigger_early);
}

// A plan that leaves keys out, or a cluster too large, is refused before any launch.
TEST(CudaDecodeAttention, RefusesPlansThatDoNotFit) {
  DecodeAttentionArgs a;
  a.n_seq = 1, a.n_head = 32, a.n_head_kv = 8, a.head_dim = 128, a.max_context = 1000, a.block_size = 16;
  alignas(16) int dummy[4];
  a.q = reinterpret_cast<const float*>(dummy), a.k_cache = dummy, a.v_cache = dummy, a.out = reinterpret_cast<float*>(dummy);
  a.block_tables = dummy, a.positions = dummy;
  const Status short_plan = decode_attention(a, given_plan(4, 8, 64, false), nullptr, 0, nullptr);
  EXPECT_FALSE(short_plan.ok());
  EXPECT_NE(short_plan.message().find("does not cover 1000 keys"), std::string::npos) << short_plan.message();
  const Status big = decode_attention(a, given_plan(4, 17, 64, true), nullptr, 0, nullptr);
  EXPECT_FALSE(big.ok());
  EXPECT_NE(big.message().find("a cluster of 17 ranges"), std::string::npos) << big.message();
  const Status heads = decode_attention(a, given_plan(8, 16, 64, false), nullptr, 0, nullptr);
  EXPECT_FALSE(heads.ok());
  EXPECT_NE(heads.message().find("8 heads per block for groups of 4"), std::string::npos) << heads.message();
  DecodeAttentionPlan wide_split = wide_plan(2, 512);
  wide_split.n_splits = 2;
  const Status wide = decode_attention(a, wide_split, nullptr, 0, nullptr);
  EXPECT_FALSE(wide.ok());
  EXPECT_NE(wide.message().find("a wide plan takes one range"), std::string::npos) << wide.message();
  const Status wide_heads = decode_attention(a, wide_plan(4, 1000), nullptr, 0, nullptr);
  EXPECT_FALSE(wide_heads.ok());
  EXPECT_NE(wide_heads.message().find("a wide plan takes one range"), std::string::npos) << wide_heads.message();
}

TEST(CudaDecodeAttention, RefusesUnsupportedHeadDim) {
  DecodeAttentionArgs a;
  a.head_dim = 96;
  const Status s = decode_attention(a, nullptr, 0, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("64 128 256"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kiln::cuda
