// The 16-bit float matvec with a pair epilogue (matvec_half_parts with a PairEpilogue,
// backend/cuda/matvec_f16_pairs.cu; the glu as two warps per pair unless
// KILN_CUDA_HALF_GLU_SPLIT=0) against the same work done apart: the plain launch of
// the products, then the glu() kernel, or rope_table() + rope_store(). Same inputs on both
// sides, fresh random data per case, every output and the cache poisoned (NaN) first; the
// products, activations, rotated rows and cache bytes must match bit for bit (the pair
// kernel sums each row in the one-row kernel's order, and the epilogues call the glu and
// rope formulas those kernels use). The products are also checked against a double
// reference (|y - ref| <= 1e-5 * (sum |w x| + |bias|), as matvec_f16_grouped_test.cpp), so
// that rows neither side wrote cannot pass as equal NaNs.
//
// Shapes: f16 and bf16; widths of 8 columns, under one 1024-column chunk, not a multiple of
// 256, and 4096 + 40; odd row counts for glu; partial rotation (n_rot < head_dim); several
// tokens (the launch for token t reads angle row t and slot t); a slot of -1 (no store);
// f16 and f32 caches; every activation; the activation over gate, over up, or apart.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/matvec_f16_grouped.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/rope_store.h"
#include "cuda_test_support.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

float weight_value(GgmlType type, const uint8_t* row, int64_t i) {
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  return type == GgmlType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

// rows x cols weights on the host and the device.
struct Weights {
  std::vector<uint8_t> host;
  DeviceBuffer dev;
};
Weights random_weights(std::mt19937_64& rng, GgmlType type, int64_t rows, int64_t cols) {
  std::vector<uint8_t> host = random_rows(rng, type, rows, cols, 2 * cols);
  DeviceBuffer dev = to_device(host);
  return Weights{std::move(host), std::move(dev)};
}

// y = W x + bias in double, with the bound above.
::testing::AssertionResult near_reference(const std::vector<float>& y, GgmlType type, const Weights& w, int64_t rows,
                                          int64_t cols, const std::vector<float>& x, const std::vector<float>* bias,
                                          const std::string& what) {
  std::vector<double> ref(static_cast<size_t>(rows)), tol(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0, magnitude = 0;
    for (int64_t i = 0; i < cols; ++i) {
      const double term = double(weight_value(type, w.host.data() + r * 2 * cols, i)) * x[size_t(i)];
      sum += term, magnitude += std::fabs(term);
    }
    if (bias) sum += (*bias)[size_t(r)], magnitude += std::fabs((*bias)[size_t(r)]);
    ref[size_t(r)] = sum, tol[size_t(r)] = 1e-5 * magnitude;
  }
  return all_close(y, ref, tol, what);
}

// --- glu after gate/up -------------------------------------------------------------------

enum class ActAt { Gate, Up, Apart };

struct GluCase {
  GgmlType type;
  int64_t cols, rows;
  GluKind kind;
  ActAt at;
  bool bias;
};

void run_glu_case(const GluCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(std::string(type_name(c.type)) + " cols " + std::to_string(c.cols) + " rows " +
               std::to_string(c.rows) + " act " + std::to_string(int(c.kind)) + " at " + std::to_string(int(c.at)) +
               (c.bias ? " bias" : ""));
  const int64_t K = c.cols, N = c.rows;
  const std::vector<float> x = random_floats(rng, size_t(K), -1.5f, 1.5f);
  const DeviceBuffer x_d = to_device(x);
  const Weights wg = random_weights(rng, c.type, N, K), wu = random_weights(rng, c.type, N, K);
  const std::vector<float> bg = random_floats(rng, size_t(N), -0.5f, 0.5f);
  const std::vector<float> bu = random_floats(rng, size_t(N), -0.5f, 0.5f);
  const DeviceBuffer bg_d = to_device(bg), bu_d = to_device(bu);

  // Side 0: one launch with the epilogue. Side 1: the products, then glu().
  std::vector<float> gate[2], up[2], act[2];
  for (int side = 0; side < 2; ++side) {
    DeviceBuffer gate_d(size_t(N) * 4), up_d(size_t(N) * 4), apart_d(size_t(N) * 4);
    gate_d.poison(), up_d.poison(), apart_d.poison();
    MatvecPart parts[2];
    parts[0].w = wg.dev.as(), parts[0].rows = N, parts[0].y = gate_d.as<float>();
    parts[1].w = wu.dev.as(), parts[1].rows = N, parts[1].y = up_d.as<float>();
    if (c.bias) parts[0].add = bg_d.as<float>(), parts[1].add = bu_d.as<float>();
    float* out = c.at == ActAt::Gate ? gate_d.as<float>() : c.at == ActAt::Up ? up_d.as<float>() : apart_d.as<float>();
    F32Input in;
    in.x = x_d.as<float>();
    if (side == 0) {
      PairEpilogue ep;
      ep.kind = PairEpilogueKind::Glu;
      ep.glu.kind = c.kind, ep.glu.alpha = 1.702f, ep.glu.limit = 0.4f;  // a limit the products reach
      ep.glu.out = out, ep.glu.out_stride = N;
      ASSERT_TRUE(matvec_half_pairs_fit(K, parts, in, ep));
      KILN_STATUS_OK(matvec_half_parts(c.type, K, 2 * K, parts, in, nullptr, ep));
    } else {
      KILN_STATUS_OK(matvec_half_parts(c.type, K, 2 * K, parts, in, nullptr));
      GluArgs g;
      g.kind = c.kind, g.alpha = 1.702f, g.limit = 0.4f;
      g.gate = gate_d.as<float>(), g.gate_stride = N, g.up = up_d.as<float>(), g.up_stride = N;
      g.rows = 1, g.n = N, g.out = out, g.out_stride = N;
      KILN_STATUS_OK(glu(g, nullptr));
    }
    KILN_CUDA_OK(cudaDeviceSynchronize());
    gate[side] = to_host<float>(gate_d, size_t(N));
    up[side] = to_host<float>(up_d, size_t(N));
    act[side] = to_host<float>(c.at == ActAt::Apart ? apart_d : c.at == ActAt::Gate ? gate_d : up_d, size_t(N));
  }
  if (c.at != ActAt::Gate) EXPECT_TRUE(near_reference(gate[0], c.type, wg, N, K, x, c.bias ? &bg : nullptr, "gate"));
  if (c.at != ActAt::Up) EXPECT_TRUE(near_reference(up[0], c.type, wu, N, K, x, c.bias ? &bu : nullptr, "up"));
  EXPECT_TRUE(all_equal_bits(gate[0], gate[1], "gate's rows"));
  EXPECT_TRUE(all_equal_bits(up[0], up[1], "up's rows"));
  EXPECT_TRUE(all_equal_bits(act[0], act[1], "activation"));
}

TEST(MatvecHalfPairs, GluEpilogueMatchesProductsThenGlu) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261201);
  const GluCase cases[] = {
      {GgmlType::F16, 4096, 2000, GluKind::Silu, ActAt::Gate, false},
      {GgmlType::BF16, 4096, 2000, GluKind::Silu, ActAt::Gate, true},
      {GgmlType::F16, 8, 1, GluKind::GeluTanh, ActAt::Up, true},
      {GgmlType::BF16, 200, 37, GluKind::SwigluOai, ActAt::Apart, false},
      {GgmlType::F16, 1032, 999, GluKind::SwigluOai, ActAt::Gate, true},
      {GgmlType::BF16, 4096 + 40, 333, GluKind::GeluTanh, ActAt::Gate, false},
      // More pairs than the grid has warps (and warp pairs): each takes several, and the
      // glu's hand-over slots alternate between rounds.
      {GgmlType::F16, 2048 + 8, 9001, GluKind::Silu, ActAt::Apart, true},
  };
  for (const GluCase& c : cases) run_glu_case(c, rng);
}

// --- rope + cache store after q/k/v ------------------------------------------------------

struct RopeCase {
  GgmlType type, cache_type;
  int64_t cols;
  int head_dim, n_rot, n_head, n_kv, tokens;
  bool norm;  // x RMS-normalized inside the launch
};

void run_rope_case(const RopeCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(std::string(type_name(c.type)) + " cols " + std::to_string(c.cols) + " head_dim " +
               std::to_string(c.head_dim) + " n_rot " + std::to_string(c.n_rot) + " heads " +
               std::to_string(c.n_head) + "/" + std::to_string(c.n_kv) + " T " + std::to_string(c.tokens) +
               " cache " + std::string(type_name(c.cache_type)) + (c.norm ? " norm" : ""));
  const int64_t K = c.cols, T = c.tokens, n_slots = 12;
  const int64_t q_width = int64_t(c.n_head) * c.head_dim, kv_width = int64_t(c.n_kv) * c.head_dim;
  const std::vector<float> x = random_floats(rng, size_t(K * T), -1.5f, 1.5f);
  const std::vector<float> norm_w = random_floats(rng, size_t(K), 0.5f, 1.5f);
  const DeviceBuffer x_d = to_device(x), norm_d = to_device(norm_w);
  const Weights wq = random_weights(rng, c.type, q_width, K), wk = random_weights(rng, c.type, kv_width, K),
                wv = random_weights(rng, c.type, kv_width, K);
  const std::vector<float> bq = random_floats(rng, size_t(q_width), -0.5f, 0.5f);
  const DeviceBuffer bq_d = to_device(bq);
  std::vector<int32_t> positions, slots;
  for (int64_t t = 0; t < T; ++t) {
    positions.push_back(int32_t(911 * t + 5));
    slots.push_back(t == 1 ? -1 : int32_t(n_slots - 1 - 3 * t));  // token 1 is not stored
  }
  const DeviceBuffer pos_d = to_device(positions), slots_d = to_device(slots);
  DeviceBuffer angles_d(size_t(T * c.n_rot) * 4);

  RopeArgs rope;
  rope.n_tokens = T, rope.head_dim = c.head_dim, rope.positions = pos_d.as<int32_t>(), rope.n_rot = c.n_rot;
  rope.freq_base = 500000.0f;
  RopeArgs for_table = rope;  // the table reads no x, but the checks want one
  for_table.x = angles_d.as<float>(), for_table.n_heads = 1;
  KILN_STATUS_OK(rope_table(for_table, angles_d.as<float>(), nullptr));

  const size_t elem = c.cache_type == GgmlType::F16 ? 2 : 4;
  std::vector<float> q[2], k[2], v[2];
  std::vector<uint8_t> cache_k[2], cache_v[2];
  for (int side = 0; side < 2; ++side) {
    DeviceBuffer q_d(size_t(q_width * T) * 4), k_d(size_t(kv_width * T) * 4), v_d(size_t(kv_width * T) * 4);
    DeviceBuffer ck_d(size_t(kv_width * n_slots) * elem), cv_d(size_t(kv_width * n_slots) * elem);
    DeviceBuffer normed_d(size_t(K * T) * 4);
    for (const DeviceBuffer* b : {&q_d, &k_d, &v_d, &ck_d, &cv_d, &normed_d}) b->poison();
    KvStoreArgs st;
    st.k = k_d.as<float>(), st.k_stride = kv_width, st.k_width = kv_width;
    st.v = v_d.as<float>(), st.v_stride = kv_width, st.v_width = kv_width;
    st.cache_k = ck_d.as(), st.cache_v = cv_d.as(), st.cache_type = c.cache_type;
    st.cache_k_stride = kv_width, st.cache_v_stride = kv_width, st.n_slots = n_slots;
    st.slots = slots_d.as<int32_t>(), st.n_tokens = T;
    for (int64_t t = 0; t < T; ++t) {
      MatvecPart parts[3];
      parts[0].w = wq.dev.as(), parts[0].rows = q_width, parts[0].y = q_d.as<float>() + t * q_width;
      parts[0].add = bq_d.as<float>();
      parts[1].w = wk.dev.as(), parts[1].rows = kv_width, parts[1].y = k_d.as<float>() + t * kv_width;
      parts[2].w = wv.dev.as(), parts[2].rows = kv_width, parts[2].y = v_d.as<float>() + t * kv_width;
      F32Input in;
      in.x = x_d.as<float>() + t * K;
      if (c.norm) in.norm_weight = norm_d.as<float>(), in.eps = 1e-5f, in.normed = normed_d.as<float>() + t * K;
      PairEpilogue ep;
      if (side == 0) {
        ep.kind = PairEpilogueKind::RopeStore;
        ep.token = t, ep.head_dim = c.head_dim, ep.n_rot = c.n_rot, ep.angles = angles_d.as<float>(), ep.store = st;
        ASSERT_TRUE(matvec_half_pairs_fit(K, parts, in, ep));
      }
      KILN_STATUS_OK(matvec_half_parts(c.type, K, 2 * K, parts, in, nullptr, ep));
    }
    if (side == 1) {
      RopeArgs rq = rope, rk = rope;
      rq.x = q_d.as<float>(), rq.token_stride = q_width, rq.head_stride = c.head_dim, rq.n_heads = c.n_head;
      rk.x = k_d.as<float>(), rk.token_stride = kv_width, rk.head_stride = c.head_dim, rk.n_heads = c.n_kv;
      KILN_STATUS_OK(rope_store(rq, rk, st, nullptr, angles_d.as<float>()));
    }
    KILN_CUDA_OK(cudaDeviceSynchronize());
    q[side] = to_host<float>(q_d, size_t(q_width * T));
    k[side] = to_host<float>(k_d, size_t(kv_width * T));
    v[side] = to_host<float>(v_d, size_t(kv_width * T));
    cache_k[side] = to_host<uint8_t>(ck_d, ck_d.bytes());
    cache_v[side] = to_host<uint8_t>(cv_d, cv_d.bytes());
  }
  if (!c.norm) {  // v is not rotated: its rows against the reference
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> xt(x.begin() + t * K, x.begin() + (t + 1) * K);
      const std::vector<float> vt(v[0].begin() + t * kv_width, v[0].begin() + (t + 1) * kv_width);
      EXPECT_TRUE(near_reference(vt, c.type, wv, kv_width, K, xt, nullptr, "v of token " + std::to_string(t)));
    }
  }
  EXPECT_TRUE(all_equal_bits(q[0], q[1], "q"));
  EXPECT_TRUE(all_equal_bits(k[0], k[1], "k"));
  EXPECT_TRUE(all_equal_bits(v[0], v[1], "v"));
  for (int which = 0; which < 2; ++which) {
    const std::vector<uint8_t>& got = which ? cache_v[0] : cache_k[0];
    const std::vector<uint8_t>& want = which ? cache_v[1] : cache_k[1];
    size_t differ = 0, first = got.size();
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i]) differ += 1, first = std::min(first, i);
    EXPECT_EQ(differ, 0u) << (which ? "value" : "key") << " cache: " << differ << " bytes differ, the first at byte "
                          << first;
  }
}

TEST(MatvecHalfPairs, RopeStoreEpilogueMatchesProductsThenRopeStore) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(4242);
  const RopeCase cases[] = {
      // Llama-3-8B's layer, one token.
      {GgmlType::F16, GgmlType::F16, 4096, 128, 128, 32, 8, 1, true},
      {GgmlType::BF16, GgmlType::F32, 4096, 128, 128, 32, 8, 1, true},
      // Partial rotation, three tokens (the second not stored), awkward widths.
      {GgmlType::F16, GgmlType::F32, 1032, 64, 32, 6, 2, 3, false},
      {GgmlType::BF16, GgmlType::F16, 200, 16, 10, 5, 3, 3, true},
      {GgmlType::F16, GgmlType::F16, 8, 8, 8, 2, 1, 2, false},
      {GgmlType::BF16, GgmlType::F16, 4096 + 40, 96, 64, 3, 1, 2, false},
  };
  for (const RopeCase& c : cases) run_rope_case(c, rng);
}

TEST(MatvecHalfPairs, RefusesEpiloguesThatDoNotFit) {
  alignas(16) static uint8_t weights[8 * 1024];
  alignas(16) static float x[64], y0[16], y1[16], y2[16], act[16], cache[64];
  static int32_t slot = 0;
  MatvecPart gate, up;
  gate.w = weights, gate.rows = 4, gate.y = y0;
  up.w = weights, up.rows = 4, up.y = y1;
  F32Input in;
  in.x = x;
  PairEpilogue glu;
  glu.kind = PairEpilogueKind::Glu;
  glu.glu.out = act;
  const std::vector<MatvecPart> gu{gate, up};
  EXPECT_TRUE(matvec_half_pairs_fit(64, gu, in, glu));
  EXPECT_TRUE(matvec_half_pairs_fit(64, gu, in, PairEpilogue{})) << "no epilogue";
  PairEpilogue over_gate = glu, over_up = glu, shifted = glu, over_x = glu, no_out = glu;
  over_gate.glu.out = y0, over_up.glu.out = y1, shifted.glu.out = y0 + 1, over_x.glu.out = x, no_out.glu.out = nullptr;
  EXPECT_TRUE(matvec_half_pairs_fit(64, gu, in, over_gate)) << "the activation over gate's rows";
  EXPECT_TRUE(matvec_half_pairs_fit(64, gu, in, over_up)) << "the activation over up's rows";
  EXPECT_FALSE(matvec_half_pairs_fit(64, gu, in, shifted)) << "over gate, one row off";
  EXPECT_FALSE(matvec_half_pairs_fit(64, gu, in, over_x)) << "over x";
  EXPECT_FALSE(matvec_half_pairs_fit(64, gu, in, no_out)) << "no output";
  MatvecPart longer = up;
  longer.rows = 6;
  EXPECT_FALSE(matvec_half_pairs_fit(64, std::vector<MatvecPart>{gate, longer}, in, glu)) << "unequal rows";
  EXPECT_FALSE(matvec_half_pairs_fit(64, std::vector<MatvecPart>{gate}, in, glu)) << "one part";
  MatvecPart accumulating = up;
  accumulating.accumulate = y2;
  EXPECT_FALSE(matvec_half_pairs_fit(64, std::vector<MatvecPart>{gate, accumulating}, in, glu)) << "accumulate";

  MatvecPart q = gate, k = up, v = up;
  q.rows = 8, k.rows = 4, v.rows = 4, v.y = y2;
  PairEpilogue rope;
  rope.kind = PairEpilogueKind::RopeStore;
  rope.head_dim = 4, rope.n_rot = 4;
  rope.angles = x;
  rope.store.k_width = 4, rope.store.v_width = 4, rope.store.slots = &slot, rope.store.cache_k = cache,
  rope.store.cache_v = cache, rope.store.cache_type = GgmlType::F16;
  const std::vector<MatvecPart> qkv{q, k, v};
  EXPECT_TRUE(matvec_half_pairs_fit(64, qkv, in, rope));
  EXPECT_TRUE(matvec_half_pairs_fit(4096 + 8, qkv, in, rope)) << "any width (the int8 kernel's limit is not here)";
  PairEpilogue no_angles = rope, odd_rot = rope, q8_cache = rope;
  no_angles.angles = nullptr, odd_rot.n_rot = 3, q8_cache.store.cache_type = GgmlType::Q8_0;
  EXPECT_FALSE(matvec_half_pairs_fit(64, qkv, in, no_angles)) << "no angle table";
  EXPECT_FALSE(matvec_half_pairs_fit(64, qkv, in, odd_rot)) << "odd n_rot";
  EXPECT_FALSE(matvec_half_pairs_fit(64, qkv, in, q8_cache)) << "cache type";
  MatvecPart odd_q = q;
  odd_q.rows = 7;
  EXPECT_FALSE(matvec_half_pairs_fit(64, std::vector<MatvecPart>{odd_q, k, v}, in, rope)) << "odd rows";
  EXPECT_FALSE(matvec_half_pairs_fit(64, gu, in, rope)) << "two parts";
  EXPECT_FALSE(matvec_pairs_fit(256, gu, glu)) << "the int8 kernel has no glu epilogue";

  // The launcher refuses the same, without launching anything.
  const Status s = matvec_half_parts(GgmlType::F16, 64, 128, gu, in, nullptr, shifted);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("pair epilogue"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kiln::cuda
