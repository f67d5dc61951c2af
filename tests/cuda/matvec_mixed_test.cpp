// The two-format grouped matvec (matvec_mixed_f32_parts: q4_K and q6_K parts in one launch,
// x normalized and quantized inside, the rope / KV-cache store as the pair epilogue) against
// a scalar CPU reference of the same products, rotation and store, token by token:
//  - normed: against a double-precision rmsnorm, 2e-6 relative (as fused_ops_test.cpp);
//  - products: against a double product with the same int8 activations (the CPU mirror of
//    the quantizer applied to the kernel's normed vector, or to x), |y - ref| <= 1e-5 *
//    sum_i |w_i xq_i| (as matvec_test.cpp), bias added;
//  - rotation: the reference turns its own pair in double with the uploaded angles; the
//    bound of the pair is carried through, (|c| + |s|) * max(tol), plus 1e-6 of the result;
//  - cache: the k and v rows at each token's slot equal the returned k and v bit for bit
//    (f32 cache) or their f16 rounding (f16 cache); a token with slot -1 and every slot no
//    token names stay NaN.
// Awkward shapes: part rows that leave a task of two rows straddling a q4_K and a q6_K part
// (no epilogue), padded row strides, partial rotation, 24 groups (one row per task), 1-8
// tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "backend/cuda/matvec_grouped.h"
#include "cuda_test_support.h"
#include "quant/quant.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

struct MixedCase {
  int64_t K;
  GgmlType types[3];
  int64_t rows[3];
  int64_t q6_pad;  // extra bytes per q6_K row
  int tokens;
  bool norm;
  bool epilogue;   // rows[0] q, rows[1] k, rows[2] v; head_dim and n_rot below
  int head_dim, n_rot;
  GgmlType cache_type;
};

std::string describe(const MixedCase& c) {
  std::string s = "K " + std::to_string(c.K) + " parts";
  for (int i = 0; i < 3; ++i) s += " " + std::string(type_name(c.types[i])) + "x" + std::to_string(c.rows[i]);
  s += " pad " + std::to_string(c.q6_pad) + " T " + std::to_string(c.tokens) + (c.norm ? " norm" : "");
  if (c.epilogue)
    s += " rope head_dim " + std::to_string(c.head_dim) + " n_rot " + std::to_string(c.n_rot) + " cache " +
         std::string(type_name(c.cache_type));
  return s;
}

// Bit pattern of what the cache holds for v (f32 or its f16 rounding).
uint32_t cache_bits(GgmlType cache_type, float v) {
  if (cache_type == GgmlType::F16) return f32_to_f16(v);
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

void check_mixed(const MixedCase& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937_64 rng(seed);
  const int64_t K = c.K, T = c.tokens, n_slots = 11;
  constexpr float kEps = 1e-5f;
  constexpr int kParts = 3;

  // Weights, one stride per type.
  std::vector<uint8_t> w_host[kParts];
  std::vector<DeviceBuffer> w_dev;
  PartFormat formats[kParts];
  for (int i = 0; i < kParts; ++i) {
    const TypeTraits& t = traits(c.types[i]);
    const int64_t stride = K / t.block_size * t.type_size + (c.types[i] == GgmlType::Q6_K ? c.q6_pad : 0);
    formats[i] = {c.types[i], stride};
    w_host[i] = random_rows(rng, c.types[i], c.rows[i], K, stride);
    w_dev.push_back(to_device(w_host[i]));
  }
  const std::vector<float> x = random_floats(rng, size_t(K * T), -1.5f, 1.5f);
  const std::vector<float> norm_w = random_floats(rng, size_t(K), 0.5f, 1.5f);
  const std::vector<float> bias = random_floats(rng, size_t(c.rows[0]), -1.0f, 1.0f);
  // Angles as rope_table() lays them out: per token, cos [n_rot / 2] then sin [n_rot / 2].
  std::vector<float> angles;
  std::uniform_real_distribution<double> theta(-3.2, 3.2);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> cs(size_t(c.n_rot / 2)), sn(size_t(c.n_rot / 2));
    for (int i = 0; i < c.n_rot / 2; ++i) {
      const double a = theta(rng);
      cs[size_t(i)] = float(std::cos(a)), sn[size_t(i)] = float(std::sin(a));
    }
    angles.insert(angles.end(), cs.begin(), cs.end());
    angles.insert(angles.end(), sn.begin(), sn.end());
  }
  if (angles.empty()) angles.push_back(0.0f);
  std::vector<int32_t> slots;
  for (int64_t t = 0; t < T; ++t) slots.push_back(t == 1 && T >= 3 ? -1 : int32_t((7 * t + 3) % n_slots));

  const DeviceBuffer x_d = to_device(x), norm_d = to_device(norm_w), bias_d = to_device(bias);
  const DeviceBuffer angles_d = to_device(angles), slots_d = to_device(slots);
  DeviceBuffer normed_d(size_t(K * T) * 4);
  normed_d.poison();
  std::vector<DeviceBuffer> y_d;
  for (int i = 0; i < kParts; ++i) {
    y_d.emplace_back(size_t(c.rows[i] * T) * 4);
    y_d.back().poison();
  }
  const size_t elem = c.cache_type == GgmlType::F16 ? 2 : 4;
  const int64_t kv = c.rows[1];
  DeviceBuffer cache_k(size_t(n_slots * kv) * elem), cache_v(size_t(n_slots * c.rows[2]) * elem);
  cache_k.poison(), cache_v.poison();

  for (int64_t t = 0; t < T; ++t) {
    MatvecPart parts[kParts];
    for (int i = 0; i < kParts; ++i) {
      parts[i].w = w_dev[i].as();
      parts[i].rows = c.rows[i];
      parts[i].add = i == 0 ? bias_d.as<float>() : nullptr;
      parts[i].y = y_d[i].as<float>() + t * c.rows[i];
    }
    F32Input in;
    in.x = x_d.as<float>() + t * K;
    if (c.norm) in.norm_weight = norm_d.as<float>(), in.eps = kEps, in.normed = normed_d.as<float>() + t * K;
    PairEpilogue ep;
    if (c.epilogue) {
      ep.kind = PairEpilogueKind::RopeStore;
      ep.token = t, ep.head_dim = c.head_dim, ep.n_rot = c.n_rot, ep.angles = angles_d.as<float>();
      KvStoreArgs& st = ep.store;
      st.k_width = kv, st.v_width = c.rows[2];
      st.cache_k = cache_k.as(), st.cache_v = cache_v.as(), st.cache_type = c.cache_type;
      st.cache_k_stride = kv, st.cache_v_stride = c.rows[2], st.n_slots = n_slots;
      st.slots = slots_d.as<int32_t>(), st.n_tokens = T;
    }
    ASSERT_TRUE(matvec_mixed_f32_fit(K, parts, formats, in)) << "token " << t;
    KILN_STATUS_OK(matvec_mixed_f32_parts(K, parts, formats, in, nullptr, ep));
  }
  const std::vector<float> normed = c.norm ? to_host<float>(normed_d, size_t(K * T)) : std::vector<float>{};
  std::vector<float> y[kParts];
  for (int i = 0; i < kParts; ++i) y[i] = to_host<float>(y_d[i], size_t(c.rows[i] * T));

  if (c.norm)
    ASSERT_TRUE(all_close(normed, double_rmsnorm(x, norm_w, K, T, kEps), 2e-6, 0.0, "normed vs double rmsnorm"));

  std::vector<float> deq(static_cast<size_t>(K));
  for (int i = 0; i < kParts; ++i) {
    const int64_t rows = c.rows[i];
    std::vector<double> ref(size_t(rows * T)), tol(size_t(rows * T));
    for (int64_t t = 0; t < T; ++t) {
      // The int8 activations the kernel used: its normed vector (checked above) or x.
      const std::vector<float> xin(c.norm ? normed.begin() + t * K : x.begin() + t * K,
                                   c.norm ? normed.begin() + (t + 1) * K : x.begin() + (t + 1) * K);
      const HostQ8 xq = quantize_q8_host(xin);
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_row_reference(c.types[i], w_host[i].data() + r * formats[i].w_row_bytes, deq.data(), K);
        double sum = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = double(deq[size_t(k)]) * (double(xq.d[size_t(k / 32)]) * xq.qs[size_t(k)]);
          sum += p, mag += std::fabs(p);
        }
        const double add = i == 0 ? bias[size_t(r)] : 0.0;
        ref[size_t(t * rows + r)] = sum + add;
        tol[size_t(t * rows + r)] = 1e-5 * mag + 1e-6 * std::fabs(add) + 1e-30;
      }
      if (c.epilogue && i < 2) {  // q and k: rotate the first n_rot dims of every head
        const int half = c.n_rot / 2;
        for (int64_t r = 0; r < rows; r += 2) {
          const int d = int(r % c.head_dim);
          if (d >= c.n_rot) continue;
          const double cs = angles[size_t(t * c.n_rot + d / 2)], sn = angles[size_t(t * c.n_rot + half + d / 2)];
          double& a = ref[size_t(t * rows + r)];
          double& b = ref[size_t(t * rows + r + 1)];
          const double a0 = a, b0 = b;
          a = a0 * cs - b0 * sn, b = a0 * sn + b0 * cs;
          const double bound = (std::fabs(cs) + std::fabs(sn)) *
                               std::max(tol[size_t(t * rows + r)], tol[size_t(t * rows + r + 1)]);
          tol[size_t(t * rows + r)] = bound + 1e-6 * std::fabs(a);
          tol[size_t(t * rows + r + 1)] = bound + 1e-6 * std::fabs(b);
        }
      }
    }
    EXPECT_TRUE(all_close(y[i], ref, tol, "part " + std::to_string(i) + " (" + std::string(type_name(c.types[i])) +
                                              ") vs scalar reference"));
  }
  if (!c.epilogue) return;

  // The cache: token t's k / v rows at its slot; nothing anywhere else.
  for (int which = 0; which < 2; ++which) {
    const int64_t width = which == 0 ? kv : c.rows[2];
    const DeviceBuffer& cache = which == 0 ? cache_k : cache_v;
    const std::vector<float>& src = which == 0 ? y[1] : y[2];
    std::vector<uint8_t> bytes = to_host<uint8_t>(cache, size_t(n_slots * width) * elem);
    size_t bad = 0;
    for (int64_t s = 0; s < n_slots; ++s) {
      int64_t token = -1;
      for (int64_t t = 0; t < T; ++t) token = slots[size_t(t)] == s ? t : token;
      for (int64_t j = 0; j < width; ++j) {
        uint32_t got = 0;
        std::memcpy(&got, bytes.data() + size_t(s * width + j) * elem, elem);
        const uint32_t want = token >= 0 ? cache_bits(c.cache_type, src[size_t(token * width + j)])
                                         : (elem == 2 ? 0xFFFFu : 0xFFFFFFFFu);  // poison: untouched
        if (got != want && bad++ < 8)
          ADD_FAILURE() << (which ? "v" : "k") << " cache slot " << s << " [" << j << "] got 0x" << std::hex << got
                        << " want 0x" << want << std::dec << (token >= 0 ? " (token " : " (no token") << token << ")";
      }
    }
    EXPECT_EQ(bad, 0u) << (which ? "value" : "key") << " cache elements wrong";
  }
}

TEST(MatvecMixed, Q4KAndQ6KPartsMatchScalarReference) {
  KILN_REQUIRE_GPU();
  using G = GgmlType;
  const MixedCase cases[] = {
      // Q4_K_M's q/k/v of a Llama-3-8B layer, one token, rope over whole heads.
      {4096, {G::Q4_K, G::Q4_K, G::Q6_K}, {4096, 1024, 1024}, 0, 1, true, true, 128, 128, G::F16},
      // Partial rotation, padded q6_K rows, 8 tokens (token 1 has no slot), f32 cache.
      {2048, {G::Q4_K, G::Q4_K, G::Q6_K}, {256, 128, 128}, 32, 8, true, true, 64, 32, G::F32},
      // q6_K first and last, q4_K between; 3 tokens.
      {2048, {G::Q6_K, G::Q4_K, G::Q6_K}, {192, 64, 64}, 0, 3, true, true, 32, 32, G::F16},
      // Odd part rows: tasks of two rows straddle the boundaries, q4_K then q6_K (rows 36 and
      // 37) and q6_K then q4_K (56 and 57); no epilogue.
      {2048, {G::Q4_K, G::Q6_K, G::Q4_K}, {37, 20, 11}, 16, 2, true, false, 0, 0, G::F32},
      // x taken as it is (no norm).
      {4096, {G::Q4_K, G::Q6_K, G::Q6_K}, {70, 33, 18}, 0, 1, false, false, 0, 0, G::F32},
      // 24 groups: one row per task (32 lanes).
      {6144, {G::Q4_K, G::Q4_K, G::Q6_K}, {96, 40, 41}, 0, 2, true, false, 0, 0, G::F32},
  };
  uint64_t seed = 88000;
  for (const MixedCase& c : cases) check_mixed(c, seed++);
}

TEST(MatvecMixed, RefusesWhatItCannotTakeNamingItself) {
  using G = GgmlType;
  const PartFormat q4k{G::Q4_K, 4096 / 256 * 144}, q6k{G::Q6_K, 4096 / 256 * 210};
  const PartFormat qkv[] = {q4k, q4k, q6k};
  EXPECT_TRUE(matvec_mixed_formats(qkv));
  const PartFormat one_type[] = {q4k, q4k};
  EXPECT_FALSE(matvec_mixed_formats(one_type)) << "one type: the one-format launch's";
  const PartFormat other_pair[] = {{G::Q4_0, 4096 / 32 * 18}, q6k};
  EXPECT_FALSE(matvec_mixed_formats(other_pair)) << "q4_0 with q6_K is not compiled";
  const PartFormat two_strides[] = {q4k, {G::Q4_K, q4k.w_row_bytes + 16}, q6k};
  EXPECT_FALSE(matvec_mixed_formats(two_strides)) << "one row stride per type";

  alignas(16) static float stand_in[16];
  F32Input in;
  in.x = stand_in;
  auto parts_of = [&](int64_t rows) {
    std::vector<MatvecPart> p(3);
    for (MatvecPart& part : p) part.w = stand_in, part.rows = rows, part.y = stand_in;
    return p;
  };
  const std::vector<MatvecPart> parts = parts_of(64);
  const int64_t q4k_2304 = 2304 / 256 * 144, q6k_2304 = 2304 / 256 * 210;
  const PartFormat narrow[] = {{G::Q4_K, q4k_2304}, {G::Q4_K, q4k_2304}, {G::Q6_K, q6k_2304}};
  EXPECT_FALSE(matvec_mixed_f32_fit(2304, parts, narrow, in)) << "q6_K needs a multiple of 2048 columns";
  EXPECT_TRUE(matvec_mixed_f32_fit(4096, parts, qkv, in));
  const std::vector<MatvecPart> two = parts_of(64);
  EXPECT_FALSE(matvec_mixed_f32_fit(4096, std::span(two.data(), 2), qkv, in)) << "a format per part";
  const Status st = matvec_mixed_f32_parts(2304, parts, narrow, in, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("matvec_mixed_f32_parts"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kiln::cuda
