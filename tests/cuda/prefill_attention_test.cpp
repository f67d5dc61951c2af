// Prefill attention (backend/cuda/prefill_attention.h), every kernel version, against a
// double-precision reference over a paged cache with shuffled block tables: head sizes 64
// and 128, f32 and f16 caches, GQA groups 1, 2, 4, block sizes 16, 24 (not a power of two)
// and 32, prompts that start at 0 and after earlier keys, partial query blocks, sliding
// windows, sinks and soft-capping. v8 splits the keys between two warp groups and merges
// their softmax states, so cases include rows whose share of a tile is wholly masked, and
// prompts shorter than one key chunk per group. The output's half copy (for the output
// product) must hold the f32 output's bits rounded to f16 / bf16, as gemm() would round them.
//
// Error bound: the kernel rounds q, k and v to f16 (the reference takes the same rounded
// values) and the softmax weights to f16 for P·V (relative 2^-11 each), with f32 sums:
// |out - ref| <= 1e-3 * sum_j p_j |v_j| + 1e-6 per element (twice the weight rounding).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cuda/prefill_attention.h"
#include "core/half.h"
#include "cuda_test_support.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

struct PrefillCase {
  int head_dim, n_head, n_head_kv, n_tokens, first_position;
  GgmlType cache;
  int block_size = 16;
  float softcap = 0.0f;
  int window = 0;
  bool sinks = false;
  float q_scale = 1.0f;
};

float f16_round(float v) { return f16_to_f32(f32_to_f16(v)); }

// half_copy: 0 none, 1 f16, 2 bf16.
void run_case(const PrefillCase& c, int version, uint64_t seed, int half_copy = 0) {
  SCOPED_TRACE("v" + std::to_string(version) + (half_copy ? (half_copy == 1 ? " f16 copy" : " bf16 copy") : "") + " head_dim " + std::to_string(c.head_dim) + " heads " +
               std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " tokens " + std::to_string(c.n_tokens) +
               " first " + std::to_string(c.first_position) + " " + std::string(type_name(c.cache)) + " block " +
               std::to_string(c.block_size) + " softcap " + std::to_string(c.softcap) + " window " +
               std::to_string(c.window) + (c.sinks ? " sinks" : ""));
  std::mt19937_64 rng(seed);
  const int D = c.head_dim, T = c.n_tokens, bs = c.block_size;
  const int n_keys = c.first_position + T;
  const int max_blocks = (n_keys + bs - 1) / bs;
  // The sequence is table row 1 of 3; its blocks are a shuffled choice of 2 * max_blocks.
  std::vector<int32_t> physical(size_t(2 * max_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  const int64_t table_stride = max_blocks + 2;
  std::vector<int32_t> tables(size_t(3 * table_stride), -1);
  for (int b = 0; b < max_blocks; ++b) tables[size_t(table_stride + b)] = physical[size_t(b)];
  const std::vector<int32_t> seq_rows = {1};
  auto slot = [&](int key) { return int64_t(tables[size_t(table_stride + key / bs)]) * bs + key % bs; };

  const int64_t n_slots = int64_t(2 * max_blocks) * bs;
  const int64_t slot_stride = int64_t(c.n_head_kv) * D + 8;
  const bool half = c.cache == GgmlType::F16;
  std::vector<float> kf = random_floats(rng, size_t(n_slots * slot_stride)), vf = random_floats(rng, size_t(n_slots * slot_stride));
  std::vector<uint16_t> kh, vh;
  for (float& v : kf) kh.push_back(f32_to_f16(v)), v = half ? f16_to_f32(kh.back()) : v;
  for (float& v : vf) vh.push_back(f32_to_f16(v)), v = half ? f16_to_f32(vh.back()) : v;
  const int64_t q_stride = int64_t(c.n_head) * D + 4, out_stride = int64_t(c.n_head) * D + 6;
  const std::vector<float> q = random_floats(rng, size_t(T * q_stride), -c.q_scale, c.q_scale);
  const std::vector<float> sinks = random_floats(rng, size_t(c.n_head), -2.0f, 4.0f);

  const DeviceBuffer k_d = half ? to_device(kh) : to_device(kf), v_d = half ? to_device(vh) : to_device(vf);
  const DeviceBuffer q_d = to_device(q), t_d = to_device(tables), r_d = to_device(seq_rows), s_d = to_device(sinks);
  DeviceBuffer out_d(size_t(T * out_stride) * 4);
  out_d.poison();
  const int64_t width = int64_t(c.n_head) * D;  // the half copy's packed rows
  DeviceBuffer half_d(size_t(T * width) * 2);
  half_d.poison();

  PrefillAttentionArgs a;
  a.q = q_d.as<float>(), a.q_stride = q_stride;
  a.k_cache = k_d.as(), a.v_cache = v_d.as();
  a.k_slot_stride = a.v_slot_stride = slot_stride;
  a.cache_type = c.cache;
  a.block_tables = t_d.as<int32_t>(), a.block_table_stride = table_stride;
  a.seq_rows = r_d.as<int32_t>(), a.block_size = bs;
  a.first_position = c.first_position, a.n_tokens = T;
  a.n_head = c.n_head, a.n_head_kv = c.n_head_kv, a.head_dim = D;
  a.scale = 1.0f / std::sqrt(float(D)), a.softcap = c.softcap, a.sliding_window = c.window;
  a.sinks = c.sinks ? s_d.as<float>() : nullptr;
  a.out = out_d.as<float>(), a.out_stride = out_stride;
  a.version = version;
  if (half_copy) a.out_half = half_d.as(), a.out_half_bf16 = half_copy == 2;
  KILN_STATUS_OK(prefill_attention(a, nullptr));
  const std::vector<float> out_all = to_host<float>(out_d, size_t(T * out_stride));
  if (half_copy) {
    const std::vector<uint16_t> half_all = to_host<uint16_t>(half_d, size_t(T * width));
    for (int t = 0; t < T; ++t)
      for (int64_t i = 0; i < width; ++i) {
        const float v = out_all[size_t(t * out_stride + i)];
        const uint16_t want = half_copy == 1 ? f32_to_f16(v) : f32_to_bf16(v);
        ASSERT_EQ(half_all[size_t(t * width + i)], want) << "half copy of token " << t << " [" << i << "] = " << v;
      }
  }

  std::vector<float> got;
  std::vector<double> want, tol;
  const int group = c.n_head / c.n_head_kv;
  std::vector<double> score;
  for (int t = 0; t < T; ++t) {
    const int pos = c.first_position + t;
    const int first = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
    for (int h = 0; h < c.n_head; ++h) {
      const int kvh = h / group;
      score.clear();
      double m = c.sinks ? sinks[size_t(h)] : -INFINITY;
      for (int j = first; j <= pos; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += double(f16_round(q[size_t(t * q_stride + h * D + d)])) *
                 f16_round(kf[size_t(slot(j) * slot_stride + kvh * D + d)]);
        double sc = dot * a.scale;
        if (c.softcap > 0) sc = c.softcap * std::tanh(sc / c.softcap);
        score.push_back(sc);
        m = std::max(m, sc);
      }
      double denom = c.sinks ? std::exp(sinks[size_t(h)] - m) : 0.0;
      for (double& sc : score) denom += (sc = std::exp(sc - m));
      for (int d = 0; d < D; ++d) {
        double acc = 0, mag = 0;
        for (int j = first; j <= pos; ++j) {
          const double p = score[size_t(j - first)] / denom;
          const double v = f16_round(vf[size_t(slot(j) * slot_stride + kvh * D + d)]);
          acc += p * v, mag += p * std::fabs(v);
        }
        got.push_back(out_all[size_t(t * out_stride + h * D + d)]);
        want.push_back(acc);
        tol.push_back(1e-3 * mag + 1e-6);
      }
    }
  }
  EXPECT_TRUE(all_close(got, want, tol, "prefill attention"));
}

const std::vector<PrefillCase>& cases() {
  static const std::vector<PrefillCase> all = {
      // The Llama-3-8B layer shape (GQA 4, head size 128, f16 cache) with fewer heads.
      {128, 8, 2, 512, 0, GgmlType::F16},
      {128, 8, 2, 77, 0, GgmlType::F16, 16, 0.0f, 0, false, 3.0f},  // sharp softmax, partial block
      {64, 6, 3, 129, 45, GgmlType::F32},                           // after earlier keys, group 2
      {128, 4, 1, 200, 300, GgmlType::F16, 24, 20.0f, 100, true},   // block size 24, cap, window, sinks
      {64, 4, 4, 16, 0, GgmlType::F16, 16, 0.0f, 7, true},          // the smallest chunk, window < a half tile
      {128, 4, 2, 333, 21, GgmlType::F32, 32, 0.0f, 0, false},
      {64, 4, 2, 99, 0, GgmlType::F16, 16, 30.0f, 40, false, 2.0f},
      {128, 2, 1, 65, 190, GgmlType::F16, 16, 0.0f, 33, true},       // window edges inside half tiles
  };
  return all;
}

// v6: 4 warps on whole 64-key tiles; v8: two warp groups on alternate 32-key chunks.
TEST(PrefillAttention, EveryVersionMatchesDoubleReference) {
  KILN_REQUIRE_GPU();
  for (const int version : {6, 8}) {
    uint64_t seed = 11 + 100 * uint64_t(version);
    for (const PrefillCase& c : cases()) run_case(c, version, seed++);
  }
}

TEST(PrefillAttention, HalfCopyIsTheRoundedOutput) {
  KILN_REQUIRE_GPU();
  for (const int version : {6, 8})
    for (int half_copy : {1, 2}) {
      uint64_t seed = 7 + 10 * uint64_t(version) + uint64_t(half_copy);
      for (size_t i = 0; i < 4; ++i) run_case(cases()[i], version, seed++, half_copy);
    }
}

TEST(PrefillAttention, RefusesUnknownVersion) {
  PrefillAttentionArgs a;
  alignas(16) const float x[4] = {};
  alignas(16) const int32_t i[4] = {};
  a.q = x, a.k_cache = x, a.v_cache = x, a.block_tables = i, a.seq_rows = i, a.out = const_cast<float*>(x);
  a.cache_type = GgmlType::F32, a.head_dim = 64, a.n_tokens = 1, a.n_head = 1, a.n_head_kv = 1, a.block_size = 16;
  a.version = 5;  // 6 and 8 exist
  const Status s = prefill_attention(a, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("version 5"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kiln::cuda
