// The grouped MoE GEMMs (moe.h's moe_ffn_gemm) with each tile engine (v4, v6 and v7,
// moe_gemm_tile.cuh; v8, moe_gemm_v8.cuh, which takes q4_K and q6_K and hands other types to
// v7), called directly, against a double-precision reference written here.
// The routing is skewed on purpose (expert e is picked with weight (e + 1)^3), so that one
// call has experts with no tokens, tiles of every fill from 1 to 64 tokens and experts that
// span two or more tiles: v6, v7 and v8 skip the 8-token n-tiles past a tile's count, and a
// wrong skip shows as a wrong or unwritten (NaN) output. v8 decodes to the same weight values
// as the others (bf16 of the format's f32 value), so the bound below holds for it unchanged.
// Skips without a GPU.
//
// Bound, per output element (bf16 operands, f32 accumulation, h stored as bf16; first order,
// doubled):
//   dg = 2^-8 sum_d |gate[k][d] x_d|   (du likewise),  dh_k = |dglu/dg| dg + |dglu/du| du + 2^-9 |h_k|,
//   |err| <= 2 sum_j w_j (sum_k |down[i][k]| dh_k + 2^-8 sum_k |down[i][k] h_k|) + 1e-5 S + 1e-6,
//   S = sum_j w_j (sum_k |down[i][k] h_k| + |bias_i|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "backend/cuda/moe.h"
#include "cuda_test_support.h"
#include "moe_glu_reference.h"
#include "quant/quant.h"

namespace kiln::cuda::testing {
namespace {

struct GemmCase {
  GgmlType gate_up, down;
  int64_t n_embd, n_ff, n_expert, n_used, T;
  bool oai;  // biases and the clamped SwiGLU (gpt-oss)
};


struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantized [expert][row][col]
  int64_t row_bytes = 0;
};

Weights random_weights(std::mt19937_64& rng, GgmlType type, int64_t rows, int64_t cols) {
  const TypeTraits& t = traits(type);
  Weights w;
  w.row_bytes = cols / t.block_size * t.type_size;
  w.bytes = random_rows(rng, type, rows, cols, w.row_bytes);
  w.bytes.resize(size_t(rows * w.row_bytes));
  if (type == GgmlType::MXFP4)  // shared exponents of trained-weight size (2^-10 .. 2^-4)
    for (int64_t i = 0; i < rows * w.row_bytes; i += t.type_size) w.bytes[size_t(i)] = uint8_t(117 + rng() % 7);
  w.values.resize(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row_reference(type, w.bytes.data() + r * w.row_bytes, w.values.data() + r * cols, cols);
  return w;
}

// n_used distinct experts per token, expert e drawn with weight (e + 1)^3.
std::vector<int32_t> skewed_ids(std::mt19937_64& rng, int64_t T, int64_t n_expert, int64_t n_used) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> weight(static_cast<size_t>(n_expert));
    for (int64_t e = 0; e < n_expert; ++e) weight[size_t(e)] = std::pow(double(e + 1), 3.0);
    for (int64_t j = 0; j < n_used; ++j) {
      std::discrete_distribution<int> pick(weight.begin(), weight.end());
      const int e = pick(rng);
      ids.push_back(e);
      weight[size_t(e)] = 0;  // distinct within a token
    }
  }
  return ids;
}

void check_case(const GemmCase& c, std::mt19937_64& rng) {
  const int64_t D = c.n_embd, F = c.n_ff, E = c.n_expert, K = c.n_used, T = c.T;
  const std::string what = std::string(type_name(c.gate_up)) + "/" + std::string(type_name(c.down)) + " embd " +
                           std::to_string(D) + " ff " + std::to_string(F) + " experts " + std::to_string(E) + " used " +
                           std::to_string(K) + " T " + std::to_string(T) + (c.oai ? " swiglu_oai+bias" : " silu");
  const Weights gate = random_weights(rng, c.gate_up, E * F, D), up = random_weights(rng, c.gate_up, E * F, D);
  const Weights down = random_weights(rng, c.down, E * D, F);
  std::vector<float> gate_b, up_b, down_b;
  if (c.oai) {
    gate_b = random_floats(rng, size_t(E * F), -0.5f, 0.5f);
    up_b = random_floats(rng, size_t(E * F), -0.5f, 0.5f);
    down_b = random_floats(rng, size_t(E * D), -0.5f, 0.5f);
  }
  const std::vector<float> x = random_floats(rng, size_t(T * D)), w = random_floats(rng, size_t(T * K), 0.05f, 1.0f);
  const std::vector<int32_t> ids = skewed_ids(rng, T, E, K);

  // The reference and its bound.
  std::vector<double> ref(static_cast<size_t>(T * D), 0.0), tol(ref), S(ref);
  std::vector<double> h(static_cast<size_t>(F)), dh(static_cast<size_t>(F));
  const double r8 = std::ldexp(1.0, -8), r9 = std::ldexp(1.0, -9);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = ids[size_t(t * K + j)];
      const double wt = w[size_t(t * K + j)];
      for (int64_t f = 0; f < F; ++f) {
        const float* gr = &gate.values[size_t((e * F + f) * D)];
        const float* ur = &up.values[size_t((e * F + f) * D)];
        double g = 0, u = 0, ag = 0, au = 0;
        for (int64_t d = 0; d < D; ++d) {
          const double xd = x[size_t(t * D + d)];
          g += gr[d] * xd, u += ur[d] * xd, ag += std::fabs(gr[d] * xd), au += std::fabs(ur[d] * xd);
        }
        if (c.oai) g += gate_b[size_t(e * F + f)], u += up_b[size_t(e * F + f)];
        h[size_t(f)] = moe_glu_reference(c.oai, g, u);
        const auto [sg, su] = moe_glu_slopes(c.oai, g, u);
        dh[size_t(f)] = sg * r8 * ag + su * r8 * au + r9 * std::fabs(h[size_t(f)]);
      }
      for (int64_t d = 0; d < D; ++d) {
        const float* dr = &down.values[size_t((e * D + d) * F)];
        double y = 0, s = 0, err = 0;
        for (int64_t f = 0; f < F; ++f)
          y += dr[f] * h[size_t(f)], s += std::fabs(dr[f] * h[size_t(f)]), err += std::fabs(dr[f]) * dh[size_t(f)];
        if (c.oai) y += down_b[size_t(e * D + d)];
        const size_t o = size_t(t * D + d);
        ref[o] += wt * y;
        tol[o] += 2.0 * wt * (err + r8 * s);
        S[o] += wt * (s + (c.oai ? std::fabs(down_b[size_t(e * D + d)]) : 0.0));
      }
    }
  for (size_t i = 0; i < tol.size(); ++i) tol[i] += 1e-5 * S[i] + 1e-6;

  const DeviceBuffer d_gate = to_device(gate.bytes), d_up = to_device(up.bytes), d_down = to_device(down.bytes);
  const DeviceBuffer d_gate_b = to_device(gate_b), d_up_b = to_device(up_b), d_down_b = to_device(down_b);
  const DeviceBuffer d_x = to_device(x), d_w = to_device(w), d_ids = to_device(ids);
  const DeviceBuffer d_out(size_t(T * D) * sizeof(float));
  ASSERT_TRUE(d_out.ok());
  MoeFfnArgs a;
  auto matrix = [&](ExpertMatrix& m, GgmlType type, const Weights& wt, const DeviceBuffer& data, int64_t rows,
                    const DeviceBuffer& bias) {
    m.type = type, m.data = data.as();
    m.row_bytes = wt.row_bytes, m.expert_bytes = wt.row_bytes * rows;
    m.bias = c.oai ? bias.as<float>() : nullptr, m.bias_stride = rows;
  };
  matrix(a.gate, c.gate_up, gate, d_gate, F, d_gate_b);
  matrix(a.up, c.gate_up, up, d_up, F, d_up_b);
  matrix(a.down, c.down, down, d_down, D, d_down_b);
  a.n_embd = D, a.n_ff = F, a.n_expert = E, a.n_used = K, a.n_tokens = T;
  a.x = d_x.as<float>(), a.x_stride = D;
  a.ids = d_ids.as<int32_t>(), a.ids_stride = K;
  a.weights = d_w.as<float>(), a.weights_stride = K;
  a.out = d_out.as<float>(), a.out_stride = D;
  a.act = c.oai ? GluKind::SwigluOai : GluKind::Silu;
  ASSERT_TRUE(moe_gemm_fits(a)) << what;
  const DeviceBuffer scratch(moe_gemm_scratch_bytes(a));
  ASSERT_TRUE(scratch.ok());
  for (const int version : {4, 6, 7, 8}) {
    a.gemm_version = version;
    d_out.poison();
    KILN_STATUS_OK(moe_ffn_gemm(a, scratch.as(), scratch.bytes(), nullptr));
    const std::vector<float> got = to_host<float>(d_out, size_t(T * D));
    EXPECT_TRUE(all_close(got, ref, tol, "v" + std::to_string(version) + " " + what));
  }
  // With a residual (rows of another stride): out as before, and residual + out added in f32,
  // bit for bit what a separate add would leave.
  const int64_t rs = D + 4;
  const std::vector<float> residual = random_floats(rng, size_t(T * rs), -3.0f, 3.0f);
  const DeviceBuffer d_residual = to_device(residual);
  a.residual = d_residual.as<float>(), a.residual_stride = rs;
  a.gemm_version = 0;
  d_out.poison();
  KILN_STATUS_OK(moe_ffn_gemm(a, scratch.as(), scratch.bytes(), nullptr));
  const std::vector<float> got = to_host<float>(d_out, size_t(T * D));
  EXPECT_TRUE(all_close(got, ref, tol, "default version with a residual, " + what));
  const std::vector<float> got_residual = to_host<float>(d_residual, size_t(T * rs));
  std::vector<float> want_residual = residual;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) want_residual[size_t(t * rs + d)] += got[size_t(t * D + d)];
  EXPECT_TRUE(all_equal_bits(got_residual, want_residual, "residual += out, " + what));
}

TEST(CudaMoeGemm, TileEnginesMatchDoubleReference) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261201);
  const std::vector<GemmCase> cases = {
      {GgmlType::Q4_K, GgmlType::Q6_K, 256, 512, 16, 2, 300, false},
      {GgmlType::Q4_K, GgmlType::Q4_K, 512, 256, 12, 4, 97, false},
      // v8 on q6_K gate/up (210-byte blocks: every misalignment head), and on q4_K gate/up
      // with a partial block of rows (n_ff 160 of 256) next to a q8_0 down that v7 runs.
      {GgmlType::Q6_K, GgmlType::Q6_K, 256, 256, 8, 2, 130, false},
      {GgmlType::Q4_K, GgmlType::Q8_0, 256, 160, 8, 2, 100, false},
      {GgmlType::Q8_0, GgmlType::Q8_0, 96, 160, 16, 2, 300, false},
      {GgmlType::Q4_0, GgmlType::Q4_0, 64, 96, 8, 3, 130, false},
      {GgmlType::MXFP4, GgmlType::MXFP4, 64, 96, 16, 4, 200, true},
      {GgmlType::F16, GgmlType::F16, 64, 160, 16, 2, 300, false},
      {GgmlType::BF16, GgmlType::BF16, 96, 64, 8, 2, 150, true},
      {GgmlType::F32, GgmlType::F32, 64, 96, 8, 2, 150, false},
  };
  for (const GemmCase& c : cases) check_case(c, rng);
}

// A version that does not exist is refused, not run.
TEST(CudaMoeGemm, UnknownVersionIsRefused) {
  KILN_REQUIRE_GPU();
  MoeFfnArgs a;
  a.gate.type = a.up.type = a.down.type = GgmlType::F16;
  a.n_embd = 64, a.n_ff = 64, a.n_expert = 2, a.n_used = 1, a.n_tokens = 40;
  a.gemm_version = 3;
  const Status s = moe_ffn_gemm(a, nullptr, 0, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("version"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kiln::cuda::testing
