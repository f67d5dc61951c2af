// The CPU backend ops against plain definitions written out in double precision, on
// random data of awkward sizes. These CPU ops are the reference the GPU backend is checked
// against, so they are checked against the equations here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "dense_attention_reference.h"

namespace kiln {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor view(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(GgmlType::F32, shape, v.data());
}
Tensor view_i32(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return Tensor::contiguous(GgmlType::I32, shape, v.data());
}

// |a - b| <= tol * (1 + |b|), first mismatches printed with index and both values.
void expect_close(const std::vector<float>& a, const std::vector<double>& b, double tol, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  int bad = 0;
  for (size_t i = 0; i < a.size() && bad < 5; ++i)
    if (!(std::abs(a[i] - b[i]) <= tol * (1 + std::abs(b[i])))) {
      ADD_FAILURE() << what << " [" << i << "]: got " << a[i] << ", expected " << b[i];
      ++bad;
    }
}

TEST(CpuOps, RmsNormAndFusedResidual) {
  CpuBackend be(2);
  const int64_t n = 37, rows = 5;
  std::vector<float> x = random_vector(n * rows, 1), res = random_vector(n * rows, 2), w = random_vector(n, 3);
  std::vector<float> out(n * rows), res0 = res;
  Tensor tx = view(x, {n, rows}), tres = view(res, {n, rows}), tw = view(w, {n}), tout = view(out, {n, rows});
  be.add_rmsnorm(tx, tres, tw, 1e-5f, tout);
  std::vector<double> want(size_t(n * rows)), want_res(size_t(n * rows));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) {
      want_res[size_t(r * n + i)] = double(x[size_t(r * n + i)]) + res0[size_t(r * n + i)];
      ss += want_res[size_t(r * n + i)] * want_res[size_t(r * n + i)];
    }
    for (int64_t i = 0; i < n; ++i)
      want[size_t(r * n + i)] = want_res[size_t(r * n + i)] / std::sqrt(ss / n + 1e-5) * w[size_t(i)];
  }
  expect_close(res, want_res, 1e-6, "residual");
  expect_close(out, want, 1e-5, "add_rmsnorm");
}

// glu_matmul_add's composed default (glu, then matmul_add) on the CPU: the product of the
// glu's values added to the residual, against the gated activation and product written out.
TEST(CpuOps, GluMatmulAddIsGluThenProductAndAdd) {
  CpuBackend be(2);
  const int64_t n = 96, N = 19, T = 11;
  std::vector<float> gate = random_vector(n * T, 21), up = random_vector(n * T, 22), w = random_vector(n * N, 23, 0.2f);
  std::vector<float> res = random_vector(N * T, 24), res0 = res, out(N * T), act(n * T);
  Tensor tg = view(gate, {n, T}), tu = view(up, {n, T}), tw = view(w, {n, N}), tres = view(res, {N, T});
  Tensor tout = view(out, {N, T}), tact = view(act, {n, T});
  be.glu_matmul_add(tg, tu, GluParams{Activation::Silu}, tact, tw, Tensor{}, tout, tres);
  std::vector<double> want(size_t(N * T)), want_res(size_t(N * T));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < N; ++r) {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[size_t(t * n + i)], u = up[size_t(t * n + i)];
        sum += g / (1 + std::exp(-g)) * u * w[size_t(r * n + i)];
      }
      want[size_t(t * N + r)] = sum;
      want_res[size_t(t * N + r)] = res0[size_t(t * N + r)] + sum;
    }
  expect_close(out, want, 1e-4, "glu_matmul_add out");
  expect_close(res, want_res, 1e-4, "glu_matmul_add residual");
}

// rope on {head_dim, heads, T} against the rotation written out, both styles, partial
// rotary (n_rot < head_dim) and frequency factors.
TEST(CpuOps, RopeMatchesDefinition) {
  CpuBackend be(2);
  const int64_t head_dim = 24, heads = 3, T = 7;
  const int n_rot = 16;
  std::vector<float> factors = {1, 1, 1.5f, 2, 4, 8, 8, 16};
  Tensor tf = view(factors, {8});
  std::vector<int32_t> pos = {0, 1, 2, 5, 17, 100, 3000};
  Tensor tp = view_i32(pos, {T});
  for (RopeStyle style : {RopeStyle::Normal, RopeStyle::Neox}) {
    std::vector<float> x = random_vector(size_t(head_dim * heads * T), 7), x0 = x;
    Tensor tx = view(x, {head_dim, heads, T});
    RopeParams p;
    p.style = style;
    p.n_rot = n_rot;
    p.freq_base = 5e5f;
    p.freq_factors = &tf;
    be.rope(tx, tp, p);
    std::vector<double> want(x0.begin(), x0.end());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const size_t base = size_t((t * heads + h) * head_dim);
        for (int i = 0; i < n_rot / 2; ++i) {
          const double theta = pos[size_t(t)] * std::pow(5e5, -2.0 * i / n_rot) / factors[size_t(i)];
          const size_t a = base + size_t(style == RopeStyle::Normal ? 2 * i : i);
          const size_t b = base + size_t(style == RopeStyle::Normal ? 2 * i + 1 : i + n_rot / 2);
          want[a] = x0[a] * std::cos(theta) - x0[b] * std::sin(theta);
          want[b] = x0[a] * std::sin(theta) + x0[b] * std::cos(theta);
        }
      }
    expect_close(x, want, 2e-5, style == RopeStyle::Normal ? "rope normal" : "rope neox");
  }
}

struct AttentionCase {
  int window;
  float softcap;
  bool sinks;
};

// Two sequences interleaved in one batch, a paged cache with blocks of 4 handed out in a
// scrambled order; the op against dense softmax(q.k * scale) v per (token, head).
class CpuAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CpuAttention, PagedCacheMatchesDenseDefinition) {
  const AttentionCase c = GetParam();
  CpuBackend be(2);
  const int n_head = 6, n_kv = 2, dk = 19, dv = 11, bs = 4, max_blocks = 5;
  const std::vector<int> lengths = {13, 9};  // tokens of sequence 0 and 1
  std::vector<int32_t> tables = {7, 2, 9, 0, 4, /* seq 1: */ 3, 8, 1, 5, 6};
  std::vector<int32_t> pos, seq, slots;
  for (int i = 0; i < 13; ++i)
    for (int s = 0; s < 2; ++s)
      if (i < lengths[size_t(s)]) {
        pos.push_back(i);
        seq.push_back(s);
        slots.push_back(tables[size_t(s * max_blocks + i / bs)] * bs + i % bs);
      }
  const int64_t T = int64_t(pos.size());
  std::vector<float> q = random_vector(size_t(T * n_head * dk), 11), k = random_vector(size_t(T * n_kv * dk), 12),
                     v = random_vector(size_t(T * n_kv * dv), 13), sinks = random_vector(n_head, 14);
  std::vector<float> kc(size_t(10 * bs * n_kv * dk)), vc(size_t(10 * bs * n_kv * dv)), out(size_t(T * n_head * dv));
  KvLayer cache{view(kc, {n_kv * dk, 10 * bs}), view(vc, {n_kv * dv, 10 * bs}), bs};
  BatchIndex index{view_i32(pos, {T}), view_i32(seq, {T}), view_i32(slots, {T}), view_i32(tables, {max_blocks, 2}),
                   12};
  Tensor tsinks = view(sinks, {n_head});
  be.kv_store(view(k, {n_kv * dk, T}), view(v, {n_kv * dv, T}), cache, index.slots);
  AttentionParams p{n_head, n_kv, dk, dv, 0.3f, c.softcap, c.window, c.sinks ? &tsinks : nullptr};
  Tensor tout = view(out, {n_head * dv, T});
  be.attention(view(q, {n_head * dk, T}), cache, index, p, tout);

  const testing::DenseAttentionShape shape{n_head, n_kv, dk, dv, 0.3, c.softcap, c.window};
  const std::vector<double> want =
      testing::dense_attention(q, k, v, pos, seq, shape, c.sinks ? sinks.data() : nullptr, [](float x) { return x; })
          .out;
  expect_close(out, want, 1e-5, "attention");
}

INSTANTIATE_TEST_SUITE_P(Variants, CpuAttention,
                         ::testing::Values(AttentionCase{0, 0, false}, AttentionCase{3, 0, false},
                                           AttentionCase{0, 1.5f, false}, AttentionCase{5, 0, true}));

TEST(CpuOps, MoeRoutingVariantsAgree) {
  CpuBackend be(1);
  const int64_t E = 9, T = 4;
  const int k = 3;
  std::vector<float> logits = random_vector(size_t(E * T), 21, 2.0f);
  std::vector<int32_t> ids_a(size_t(k * T)), ids_b(size_t(k * T));
  std::vector<float> w_a(size_t(k * T)), w_b(size_t(k * T));
  Tensor ia = view_i32(ids_a, {k, T}), ib = view_i32(ids_b, {k, T}), wa = view(w_a, {k, T}), wb = view(w_b, {k, T});
  // Softmax over all, top k, renormalized == softmax over the k largest logits.
  be.moe_route(view(logits, {E, T}), MoeRouteParams{k, MoeGating::Softmax, true, 1.0f, nullptr}, ia, wa);
  be.moe_route(view(logits, {E, T}), MoeRouteParams{k, MoeGating::SoftmaxTopK, false, 1.0f, nullptr}, ib, wb);
  EXPECT_EQ(ids_a, ids_b);
  std::vector<double> wb_d(w_b.begin(), w_b.end());
  expect_close(w_a, wb_d, 1e-6, "routing weights");
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    const float* l = logits.data() + t * E;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
    for (int j = 0; j < k; ++j) EXPECT_EQ(ids_a[size_t(t * k + j)], order[size_t(j)]) << "token " << t;
  }
}

// A backend that implements nothing names the op it lacks.
class EmptyBackend final : public Backend {
 public:
  std::string_view name() const override { return "empty"; }
  Device device() const override { return Device::Cpu; }
  std::unique_ptr<Buffer> allocate(size_t) override { return nullptr; }
  Tensor weight(const gguf::TensorInfo&) override { return {}; }
  Tensor owned_weight(const Tensor&, std::string_view) override { return {}; }
  void upload(const void*, const Tensor&, size_t) override {}
  void download(const Tensor&, void*, size_t) override {}
};

TEST(Backend, MissingOpThrowsWithItsName) {
  EmptyBackend be;
  Tensor t;
  try {
    be.softmax(t, t);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("softmax"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(be.supports(Op::Attention, {}).has_value());
  EXPECT_NE(be.supports(Op::Attention, {})->find("attention"), std::string::npos);
}

}  // namespace
}  // namespace kiln
