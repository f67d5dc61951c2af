// The int8 grouped matvec of gate and up with the glu in its epilogue (matvec_f32_parts with
// PairEpilogueKind::Glu, backend/cuda/matvec_grouped_glu.cu) against the same work done
// apart: the plain launch of the products, then the glu() kernel writing the activation and
// its int8 copy. Same inputs on both sides, fresh random data per case, every output and
// the int8 copy poisoned first; gate, up, the activation, the normed input and the int8
// copy (values and (d, d * sum) scales) must match bit for bit. Independent checks besides:
// the products against a double reference over the dequantized weights and the int8 x
// (quantize_q8_host of the kernel's normed x), the activation against the double formula of
// the kernel's own gate and up, and the int8 copy against quantize_q8_host of the activation.
//
// Shapes: q4_0, q8_0, q4_K, q6_K; Llama-3-8B's 4096 x 14,336 (more h-blocks than resident
// blocks: each block loops), fewer groups than lanes (cols 512); every activation; the
// activation over gate, over up or apart; with and without norm, bias, int8 copy; 1 to 8
// tokens; one and two copy stages. Shapes it cannot take (rows not a multiple of 32, rows of
// 17 groups, int8 x, a misaligned copy) must be refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/matvec_grouped.h"
#include "backend/cuda/ops.h"
#include "cuda_test_support.h"
#include "quant/quant.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

enum class ActAt { Gate, Up, Apart };

struct GluCase {
  GgmlType type;
  int64_t cols, rows;
  int tokens;
  GluKind kind;
  ActAt at;
  bool norm, bias, q8;
  int stages;
};

constexpr float kEps = 1e-5f, kAlpha = 1.702f, kLimit = 0.4f;  // a limit the products reach

int64_t row_bytes_of(GgmlType type, int64_t cols) { return cols / traits(type).block_size * traits(type).type_size; }


double act_double(GluKind kind, double g, double u) {
  if (kind == GluKind::Silu) return g / (1.0 + std::exp(-g)) * u;
  if (kind == GluKind::GeluTanh)
    return 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
  const double gc = std::min(g, double(kLimit)), uc = std::min(std::max(u, -double(kLimit)), double(kLimit));
  return gc / (1.0 + std::exp(-double(kAlpha) * gc)) * (uc + 1.0);
}

struct Side {
  std::vector<float> gate, up, act, normed;
  std::vector<uint8_t> q8;
};

void run_case(const GluCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(std::string(type_name(c.type)) + " cols " + std::to_string(c.cols) + " rows " + std::to_string(c.rows) +
               " T " + std::to_string(c.tokens) + " act " + std::to_string(int(c.kind)) + " at " +
               std::to_string(int(c.at)) + (c.norm ? " norm" : "") + (c.bias ? " bias" : "") +
               (c.q8 ? " q8" : "") + " stages " + std::to_string(c.stages));
  const int64_t K = c.cols, N = c.rows, T = c.tokens, w_row = row_bytes_of(c.type, K), q8_row = q8_row_bytes(N);
  const std::vector<float> x = random_floats(rng, size_t(K * T), -1.5f, 1.5f);
  const std::vector<float> norm_w = random_floats(rng, size_t(K), 0.5f, 1.5f);
  const std::vector<uint8_t> wg = random_rows(rng, c.type, N, K, w_row), wu = random_rows(rng, c.type, N, K, w_row);
  const std::vector<float> bg = random_floats(rng, size_t(N), -0.5f, 0.5f), bu = random_floats(rng, size_t(N), -0.5f, 0.5f);
  const DeviceBuffer x_d = to_device(x), norm_d = to_device(norm_w), wg_d = to_device(wg), wu_d = to_device(wu),
                     bg_d = to_device(bg), bu_d = to_device(bu);

  // Side 0: one launch per token with the epilogue. Side 1: the products, then glu().
  Side side[2];
  for (int s = 0; s < 2; ++s) {
    DeviceBuffer gate_d(size_t(N * T) * 4), up_d(size_t(N * T) * 4), apart_d(size_t(N * T) * 4),
        normed_d(size_t(K * T) * 4), q8_d(size_t(q8_row * T));
    gate_d.poison(), up_d.poison(), apart_d.poison(), normed_d.poison(), q8_d.poison();
    float* out = c.at == ActAt::Gate ? gate_d.as<float>() : c.at == ActAt::Up ? up_d.as<float>() : apart_d.as<float>();
    for (int64_t t = 0; t < T; ++t) {
      MatvecPart parts[2];
      parts[0].w = wg_d.as(), parts[0].rows = N, parts[0].y = gate_d.as<float>() + t * N;
      parts[1].w = wu_d.as(), parts[1].rows = N, parts[1].y = up_d.as<float>() + t * N;
      if (c.bias) parts[0].add = bg_d.as<float>(), parts[1].add = bu_d.as<float>();
      F32Input in;
      in.x = x_d.as<float>() + t * K;
      if (c.norm) in.norm_weight = norm_d.as<float>(), in.eps = kEps, in.normed = normed_d.as<float>() + t * K;
      ASSERT_TRUE(matvec_parts_f32_fit(c.type, K, w_row, parts, in));
      if (s == 0) {
        PairEpilogue ep;
        ep.kind = PairEpilogueKind::Glu, ep.token = t;
        ep.glu.kind = c.kind, ep.glu.alpha = kAlpha, ep.glu.limit = kLimit;
        ep.glu.out = out, ep.glu.out_stride = N, ep.glu.stages = c.stages;
        if (c.q8) ep.glu.q8 = q8_d.as<uint8_t>(), ep.glu.q8_row_bytes = q8_row;
        ASSERT_TRUE(matvec_pairs_fit(K, parts, ep));
        KILN_STATUS_OK(matvec_f32_parts(c.type, K, w_row, parts, in, nullptr, ep));
      } else {
        KILN_STATUS_OK(matvec_f32_parts(c.type, K, w_row, parts, in, nullptr));
      }
    }
    if (s == 1) {
      GluArgs g;
      g.kind = c.kind, g.alpha = kAlpha, g.limit = kLimit;
      g.gate = gate_d.as<float>(), g.gate_stride = N, g.up = up_d.as<float>(), g.up_stride = N;
      g.rows = T, g.n = N, g.out = out, g.out_stride = N;
      if (c.q8) g.q8 = q8_d.as<uint8_t>(), g.q8_row_bytes = q8_row;
      ASSERT_TRUE(!c.q8 || glu_can_quantize(g));
      KILN_STATUS_OK(glu(g, nullptr));
    }
    KILN_CUDA_OK(cudaDeviceSynchronize());
    side[s].gate = to_host<float>(gate_d, size_t(N * T));
    side[s].up = to_host<float>(up_d, size_t(N * T));
    side[s].act = to_host<float>(c.at == ActAt::Apart ? apart_d : c.at == ActAt::Gate ? gate_d : up_d, size_t(N * T));
    if (c.norm) side[s].normed = to_host<float>(normed_d, size_t(K * T));
    if (c.q8) side[s].q8 = to_host<uint8_t>(q8_d, size_t(q8_row * T));
  }

  // Bit for bit against the ops apart.
  if (c.at != ActAt::Gate) EXPECT_TRUE(all_equal_bits(side[0].gate, side[1].gate, "gate's rows"));
  if (c.at != ActAt::Up) EXPECT_TRUE(all_equal_bits(side[0].up, side[1].up, "up's rows"));
  EXPECT_TRUE(all_equal_bits(side[0].act, side[1].act, "activation"));
  if (c.norm) EXPECT_TRUE(all_equal_bits(side[0].normed, side[1].normed, "normed"));
  if (c.q8) {
    int64_t shown = 0, bad = 0;
    for (size_t i = 0; i < side[0].q8.size(); ++i) {
      const int64_t t = int64_t(i) / q8_row, at = int64_t(i) % q8_row;
      if (at >= (N + 15) / 16 * 16 + N / 32 * 8) continue;  // the row's padding: written by neither
      if (at >= N && at < (N + 15) / 16 * 16) continue;
      if (side[0].q8[i] != side[1].q8[i] && ++bad && shown++ < 8)
        ADD_FAILURE() << "int8 copy byte " << at << " of token " << t << ": epilogue " << int(side[0].q8[i])
                      << ", glu kernel " << int(side[1].q8[i]);
    }
    EXPECT_EQ(bad, 0) << "int8 copy bytes differing";
  }

  // Independent references, from the epilogue side's own values.
  if (c.norm)
    EXPECT_TRUE(all_close(side[0].normed, double_rmsnorm(x, norm_w, K, T, kEps), 2e-6, 0.0, "normed vs double rmsnorm"));
  if (c.at == ActAt::Apart) {  // gate and up kept: check the products and the activation
    std::vector<float> deq(static_cast<size_t>(K));
    for (int part = 0; part < 2; ++part) {
      const std::vector<uint8_t>& w = part == 0 ? wg : wu;
      const std::vector<float>& bias = part == 0 ? bg : bu;
      std::vector<double> ref(size_t(N * T)), tol(size_t(N * T));
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<float> xin(c.norm ? side[0].normed.begin() + t * K : x.begin() + t * K,
                                     c.norm ? side[0].normed.begin() + (t + 1) * K : x.begin() + (t + 1) * K);
        const HostQ8 xq = quantize_q8_host(xin);
        for (int64_t r = 0; r < N; ++r) {
          dequantize_row_reference(c.type, w.data() + r * w_row, deq.data(), K);
          double sum = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double p = double(deq[size_t(k)]) * (double(xq.d[size_t(k / 32)]) * xq.qs[size_t(k)]);
            sum += p, mag += std::fabs(p);
          }
          const double add = c.bias ? bias[size_t(r)] : 0.0;
          ref[size_t(t * N + r)] = sum + add;
          tol[size_t(t * N + r)] = 1e-5 * mag + 1e-6 * std::fabs(add) + 1e-30;
        }
      }
      EXPECT_TRUE(all_close(part == 0 ? side[0].gate : side[0].up, ref, tol,
                            part == 0 ? "gate vs scalar reference" : "up vs scalar reference"));
    }
    std::vector<double> ref(size_t(N * T)), tol(size_t(N * T));
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] = act_double(c.kind, side[0].gate[i], side[0].up[i]);
      tol[i] = 1e-5 * std::fabs(ref[i]) + 1e-6 * (std::fabs(side[0].gate[i]) + 1.0) * (std::fabs(side[0].up[i]) + 1.0);
    }
    EXPECT_TRUE(all_close(side[0].act, ref, tol, "activation vs double formula"));
  }
  if (c.q8) {  // the copy is quantize_q8's rounding of the activation
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> h(side[0].act.begin() + t * N, side[0].act.begin() + (t + 1) * N);
      const HostQ8 hq = quantize_q8_host(h);
      const uint8_t* row = side[0].q8.data() + t * q8_row;
      ASSERT_EQ(std::memcmp(row, hq.qs.data(), size_t(N)), 0) << "int8 values of token " << t << " vs quantize_q8_host";
      for (int64_t b = 0; b < N / 32; ++b) {
        float ds[2];
        std::memcpy(ds, row + (N + 15) / 16 * 16 + 8 * b, 8);
        ASSERT_EQ(std::memcmp(&ds[0], &hq.d[size_t(b)], 4), 0) << "d of block " << b << " token " << t << ": " << ds[0]
                                                               << " vs " << hq.d[size_t(b)];
        ASSERT_EQ(std::memcmp(&ds[1], &hq.s[size_t(b)], 4), 0) << "d*sum of block " << b << " token " << t << ": "
                                                               << ds[1] << " vs " << hq.s[size_t(b)];
      }
    }
  }
}

TEST(MatvecGroupedGlu, EpilogueMatchesProductsThenGlu) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261202);
  const GluCase cases[] = {
      // Llama-3-8B's gate/up: 448 h-blocks, more than the resident blocks.
      {GgmlType::Q4_0, 4096, 14336, 1, GluKind::Silu, ActAt::Gate, true, false, true, 2},
      {GgmlType::Q4_0, 4096, 14336, 1, GluKind::Silu, ActAt::Gate, true, false, true, 1},
      {GgmlType::Q8_0, 4096, 14336, 2, GluKind::Silu, ActAt::Gate, true, false, true, 2},
      {GgmlType::Q4_K, 4096, 14336, 1, GluKind::Silu, ActAt::Gate, true, false, true, 2},
      {GgmlType::Q8_0, 2048, 9600, 1, GluKind::Silu, ActAt::Apart, true, true, true, 1},
      {GgmlType::Q4_K, 2048, 6400, 3, GluKind::GeluTanh, ActAt::Apart, true, true, true, 2},
      {GgmlType::Q6_K, 2048, 2048, 2, GluKind::Silu, ActAt::Apart, false, true, true, 2},
      {GgmlType::Q6_K, 4096, 4096, 1, GluKind::SwigluOai, ActAt::Up, true, false, true, 1},
      {GgmlType::Q4_0, 512, 128, 8, GluKind::SwigluOai, ActAt::Apart, false, true, true, 2},
      {GgmlType::Q4_0, 512, 96, 3, GluKind::Silu, ActAt::Apart, true, false, false, 2},  // no int8 copy: 96 % 128
      {GgmlType::Q8_0, 256, 32, 1, GluKind::GeluTanh, ActAt::Up, true, true, false, 2},
      {GgmlType::Q4_K, 1024, 4160, 4, GluKind::Silu, ActAt::Apart, false, false, false, 1},
      {GgmlType::Q4_0, 3072, 8192, 2, GluKind::GeluTanh, ActAt::Gate, true, true, true, 2},
  };
  for (const GluCase& c : cases) run_case(c, rng);
}

// Shapes the glu epilogue does not take: refused by matvec_pairs_fit, and the launches
// that cannot take it return an error rather than run without it.
TEST(MatvecGroupedGlu, RefusesWhatItCannotTake) {
  KILN_REQUIRE_GPU();
  const int64_t K = 4096, N = 96;
  DeviceBuffer w(size_t(N) * 4608 * 2), y0(size_t(N) * 4), y1(size_t(N) * 4), act(size_t(N) * 4), q8(4096);
  MatvecPart parts[2];
  parts[0].w = w.as(), parts[0].rows = N, parts[0].y = y0.as<float>();
  parts[1].w = w.as(), parts[1].rows = N, parts[1].y = y1.as<float>();
  PairEpilogue ep;
  ep.kind = PairEpilogueKind::Glu, ep.glu.out = act.as<float>(), ep.glu.out_stride = N;
  ep.glu.q8 = q8.as<uint8_t>(), ep.glu.q8_row_bytes = 256;
  EXPECT_TRUE(matvec_pairs_fit(K, parts, ep));
  {
    MatvecPart odd[2] = {parts[0], parts[1]};
    odd[0].rows = odd[1].rows = 80;  // not whole int8 blocks of 32
    EXPECT_FALSE(matvec_pairs_fit(K, odd, ep));
  }
  EXPECT_FALSE(matvec_pairs_fit(K + 256, parts, ep)) << "17 groups a row";
  PairEpilogue bad = ep;
  bad.glu.q8 = q8.as<uint8_t>() + 8;
  EXPECT_FALSE(matvec_pairs_fit(K, parts, bad)) << "misaligned int8 copy";
  bad = ep;
  bad.glu.q8_row_bytes = 96;
  EXPECT_FALSE(matvec_pairs_fit(K, parts, bad)) << "int8 copy row too short";
  bad = ep;
  bad.glu.stages = 3;
  EXPECT_FALSE(matvec_pairs_fit(K, parts, bad)) << "three stages";
  // Over int8 x the launch would read the scratch the copy goes to: refused.
  DeviceBuffer xq_qs{size_t(K)}, xq_ds{size_t(K / 32) * 8};
  Q8Vector xq;
  xq.qs = xq_qs.as<int8_t>(), xq.ds = xq_ds.as<float2>(), xq.n = K;
  EXPECT_FALSE(matvec_q8_parts(GgmlType::Q4_0, K, K / 32 * 18, parts, xq, nullptr, ep).ok());
}

}  // namespace
}  // namespace kiln::cuda
