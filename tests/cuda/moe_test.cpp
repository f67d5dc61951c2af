// The CUDA backend's routed MoE FFN (moe.h) on random experts of every weight type MoE models
// use, at awkward sizes, against a double-precision reference computed from the reference
// dequantizer (quant/quant.h), and against the CPU backend's moe_ffn; then graph replay
// against eager runs. Skips without a GPU.
//
// Error bounds, per output element i of token t (all from the reference's own values):
//   exact mode (f32 activations, weights decoded exactly):
//     |err| <= 1e-4 * S + 1e-6,   S = sum_j w_j (sum_k |down[i][k] h_k| + |bias_i|);
//   fast paths (int8 activations for a few tokens, bf16 operands with f32 accumulation for
//   many): the rounding of each stage carried to the output to first order, doubled:
//     dg_k = 2^-8 sum_d |gate[k][d] x_d| + sum_blocks b (max_{d in b} |x_d| / 254) sum_{d in b} |gate[k][d]|
//            (blocks of 256: the GPU's int8 blocks are 32, the CPU backend's q8_K 256)
//            (du_k likewise: bf16 operands, then int8 activations: both models added),
//     dh_k = |dglu/dg| dg_k + |dglu/du| du_k + 2^-9 |h_k| + max_{k' in block of k} |h_k'| / 254,
//     |err| <= 2 * sum_j w_j (sum_k |down[i][k]| dh_k + 2^-9 sum_k |down[i][k] h_k|) + 1e-4 * S + 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_support.h"
#include "moe_problem.h"

namespace kiln::testing {
namespace {

using cuda::testing::all_close;
using cuda::testing::describe;
using cuda::testing::make_problem;
using cuda::testing::MoeCase;
using cuda::testing::Problem;
using cuda::testing::random_floats;

// The problem's tensors on one backend.
struct OnBackend {
  std::vector<std::unique_ptr<Buffer>> buffers;
  ExpertWeights ex;
  Tensor x, ids, w, out;

  template <typename T>
  Tensor put(Backend& be, GgmlType type, std::initializer_list<int64_t> shape, const std::vector<T>& data) {
    buffers.push_back(be.allocate(data.size() * sizeof(T)));
    Tensor t = buffers.back()->view(type, shape);
    EXPECT_EQ(t.bytes(), data.size() * sizeof(T)) << "tensor size";
    be.upload(data.data(), t, data.size() * sizeof(T));
    return t;
  }
  OnBackend(Backend& be, const Problem& p) {
    const MoeCase& c = p.c;
    ex.gate = put(be, c.gate_up, {c.n_embd, c.n_ff, c.n_expert}, p.gate);
    ex.up = put(be, c.gate_up, {c.n_embd, c.n_ff, c.n_expert}, p.up);
    ex.down = put(be, c.down, {c.n_ff, c.n_embd, c.n_expert}, p.down);
    if (c.gpt_oss) {
      ex.gate_bias = put(be, GgmlType::F32, {c.n_ff, c.n_expert}, p.gate_b);
      ex.up_bias = put(be, GgmlType::F32, {c.n_ff, c.n_expert}, p.up_b);
      ex.down_bias = put(be, GgmlType::F32, {c.n_embd, c.n_expert}, p.down_b);
    }
    x = put(be, GgmlType::F32, {c.n_embd, p.T}, p.x);
    ids = put(be, GgmlType::I32, {c.n_used, p.T}, p.ids);
    w = put(be, GgmlType::F32, {c.n_used, p.T}, p.w);
    out = put(be, GgmlType::F32, {c.n_embd, p.T}, std::vector<float>(size_t(c.n_embd * p.T), std::nanf("")));
  }
  std::vector<float> run(Backend& be, const MoeCase& c) {
    const GluParams act{c.gpt_oss ? Activation::SwigluOai : Activation::Silu};
    be.moe_ffn(x, ex, ids, w, act, out);
    std::vector<float> host(size_t(out.elements()));
    be.download(out, host.data(), host.size() * sizeof(float));
    return host;
  }
};

// exact: 1e-4 * S + 1e-6; fast: the propagated rounding bound + 1e-4 * S + 1e-5 (see the top).
::testing::AssertionResult within(const std::vector<float>& got, const Problem& p, bool fast, const std::string& what) {
  std::vector<double> tol(p.ref.size());
  for (size_t i = 0; i < tol.size(); ++i) tol[i] = 1e-4 * p.scale[i] + (fast ? p.fast_tol[i] + 1e-5 : 1e-6);
  return all_close(got, p.ref, tol, what);
}

class CudaMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::list_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << "): GPU MoE test not run";
    CudaOptions exact, fast;
    exact.exact = true, exact.graphs = false;
    fast.graphs = false;
    exact_ = std::make_unique<CudaBackend>(exact);
    fast_ = std::make_unique<CudaBackend>(fast);
  }
  std::mt19937_64 rng_{20261130};
  CpuBackend cpu_{4};
  std::unique_ptr<CudaBackend> exact_, fast_;
};

// Widths per type: n_ff not a multiple of 256 wherever the block size allows.
std::vector<MoeCase> cases_for(GgmlType gate_up, GgmlType down) {
  const int64_t block = std::max(traits(gate_up).block_size, traits(down).block_size);
  const int64_t embd = block == 256 ? 256 : 64, ff = block == 256 ? 512 : block == 32 ? 160 : 96;
  const bool oai = gate_up == GgmlType::MXFP4 || gate_up == GgmlType::BF16;
  return {{gate_up, down, embd, ff, 8, 2, oai}, {gate_up, down, embd, ff, 128, 8, !oai}};
}

void check_types(GgmlType gate_up, GgmlType down, CudaBackend& exact, CudaBackend& fast, CpuBackend& cpu,
                 std::mt19937_64& rng) {
  for (const MoeCase& c : cases_for(gate_up, down))
    for (const int64_t T : {1, 2, 7, 64, 300}) {
      const Problem p = make_problem(rng, c, T);
      const std::string what = describe(c, T);
      OnBackend e(exact, p), f(fast, p);
      EXPECT_TRUE(within(e.run(exact, c), p, false, "exact " + what));
      EXPECT_TRUE(within(f.run(fast, c), p, true, "fast " + what));
      if (T == 7) {  // the CPU backend's moe_ffn on the same data, within the same bound
        OnBackend h(cpu, p);
        EXPECT_TRUE(within(h.run(cpu, c), p, true, "cpu " + what));
      }
    }
}

TEST_F(CudaMoe, F32MatchesReference) { check_types(GgmlType::F32, GgmlType::F32, *exact_, *fast_, cpu_, rng_); }
TEST_F(CudaMoe, F16MatchesReference) { check_types(GgmlType::F16, GgmlType::F16, *exact_, *fast_, cpu_, rng_); }
TEST_F(CudaMoe, Bf16MatchesReference) { check_types(GgmlType::BF16, GgmlType::BF16, *exact_, *fast_, cpu_, rng_); }
TEST_F(CudaMoe, Q8_0MatchesReference) { check_types(GgmlType::Q8_0, GgmlType::Q8_0, *exact_, *fast_, cpu_, rng_); }
TEST_F(CudaMoe, Q4_0MatchesReference) { check_types(GgmlType::Q4_0, GgmlType::Q4_0, *exact_, *fast_, cpu_, rng_); }
TEST_F(CudaMoe, Mxfp4MatchesReference) {
  check_types(GgmlType::MXFP4, GgmlType::MXFP4, *exact_, *fast_, cpu_, rng_);
}
TEST_F(CudaMoe, Q4_KWithQ6_KDownMatchesReference) {
  check_types(GgmlType::Q4_K, GgmlType::Q6_K, *exact_, *fast_, cpu_, rng_);
}
TEST_F(CudaMoe, Q5_KMatchesReference) { check_types(GgmlType::Q5_K, GgmlType::Q5_K, *exact_, *fast_, cpu_, rng_); }
TEST_F(CudaMoe, Q6_KMatchesReference) { check_types(GgmlType::Q6_K, GgmlType::Q6_K, *exact_, *fast_, cpu_, rng_); }

// n_ff of 100 (not a multiple of 32: the grouped GEMM refuses it, the matvecs take it).
TEST_F(CudaMoe, F32OddWidthMatchesReference) {
  const MoeCase c{GgmlType::F32, GgmlType::F32, 48, 100, 8, 2, true};
  for (const int64_t T : {1, 33}) {
    const Problem p = make_problem(rng_, c, T);
    OnBackend e(*exact_, p), f(*fast_, p);
    EXPECT_TRUE(within(e.run(*exact_, c), p, false, "exact " + describe(c, T)));
    EXPECT_TRUE(within(f.run(*fast_, c), p, true, "fast " + describe(c, T)));
  }
}

// An expert id out of range poisons that token's output (NaN), not the others'.
TEST_F(CudaMoe, BadExpertIdGivesNan) {
  const MoeCase c{GgmlType::Q8_0, GgmlType::Q8_0, 64, 96, 8, 2, false};
  for (const int64_t T : {3, 40}) {
    Problem p = make_problem(rng_, c, T);
    p.ids[2] = 9;  // token 1, slot 0
    OnBackend f(*fast_, p);
    const std::vector<float> got = f.run(*fast_, c);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < c.n_embd; ++d) {
        const float v = got[size_t(t * c.n_embd + d)];
        EXPECT_EQ(t == 1, std::isnan(v)) << "T " << T << " token " << t << " row " << d << ": " << v;
      }
  }
}

// moe_ffn_add (the residual add inside the decode kernels where they run, a separate add
// for the prefill GEMMs) against moe_ffn then add on the same backend: the product and the
// residual bit for bit, exact and fast, at decode and prefill batch sizes.
TEST_F(CudaMoe, FfnAddEqualsFfnThenAdd) {
  const MoeCase c{GgmlType::Q8_0, GgmlType::Q8_0, 64, 160, 8, 2, false};
  for (CudaBackend* be : {exact_.get(), fast_.get()}) {
    for (const int64_t T : {1, 3, 64}) {
      const Problem p = make_problem(rng_, c, T);
      const std::string what = (be == exact_.get() ? "exact " : "fast ") + describe(c, T);
      const std::vector<float> residual_host = random_floats(rng_, size_t(c.n_embd * T), -2.0f, 2.0f);
      const GluParams act{Activation::Silu};
      std::vector<float> out[2], residual[2];
      for (int fused = 0; fused < 2; ++fused) {
        OnBackend on(*be, p);
        Tensor res = on.put(*be, GgmlType::F32, {c.n_embd, T}, residual_host);
        if (fused) {
          be->moe_ffn_add(on.x, on.ex, on.ids, on.w, act, on.out, res);
        } else {
          be->moe_ffn(on.x, on.ex, on.ids, on.w, act, on.out);
          be->add(res, on.out, res);
        }
        out[fused].resize(size_t(c.n_embd * T)), residual[fused].resize(out[fused].size());
        be->download(on.out, out[fused].data(), out[fused].size() * sizeof(float));
        be->download(res, residual[fused].data(), residual[fused].size() * sizeof(float));
      }
      EXPECT_TRUE(cuda::testing::all_equal_bits(out[1], out[0], "out " + what));
      EXPECT_TRUE(cuda::testing::all_equal_bits(residual[1], residual[0], "residual " + what));
    }
  }
}

// rmsnorm_moe_route (one kernel in fast decode; rmsnorm, the router product and moe_route in
// prefill) against the CPU backend's composed default
// (rmsnorm, matmul, moe_route) on the same data: normed and logits within f32 rounding,
// the same experts (a near-tie within 1e-4 of the CPU's choice is accepted, at most one),
// weights within 1e-4 relative. Run in a graph: the second step replays the first's
// capture with new activations (the kernel's tickets must be back at zero).
TEST_F(CudaMoe, NormRouteMatchesComposed) {
  struct FrontCase {
    int64_t D, E;
    int K;
    MoeGating gating;
    bool bias;
  };
  for (const FrontCase& c : {FrontCase{2048, 128, 8, MoeGating::Softmax, false},
                             FrontCase{64, 32, 4, MoeGating::SoftmaxTopK, true}}) {
    CudaOptions graphed;
    graphed.graphs = true;
    CudaBackend g(graphed);
    const MoeRouteParams route{c.K, c.gating, c.gating == MoeGating::Softmax, 1.0f};
    const float eps = 1e-6f;
    for (const int64_t T : {int64_t(1), int64_t(5), int64_t(40)}) {  // 40: prefill's ops
      const std::vector<float> nw = random_floats(rng_, size_t(c.D), 0.5f, 1.5f);
      const std::vector<float> router = random_floats(rng_, size_t(c.D * c.E), -0.1f, 0.1f);
      const std::vector<float> rb = random_floats(rng_, size_t(c.E), -0.5f, 0.5f);
      struct Front {
        Tensor x, nw, normed, router, rb, logits, ids, w;
      };
      std::vector<std::unique_ptr<Buffer>> held;
      auto make = [&](Backend& be) {
        auto put = [&](GgmlType type, std::initializer_list<int64_t> shape, const auto& data) {
          held.push_back(be.allocate(data.size() * 4));
          Tensor t = held.back()->view(type, shape);
          be.upload(data.data(), t, data.size() * 4);
          return t;
        };
        Front f;
        f.x = put(GgmlType::F32, {c.D, T}, std::vector<float>(size_t(c.D * T), 0.0f));
        f.nw = put(GgmlType::F32, {c.D}, nw);
        f.normed = put(GgmlType::F32, {c.D, T}, std::vector<float>(size_t(c.D * T), std::nanf("")));
        f.router = put(GgmlType::F32, {c.D, c.E}, router);
        if (c.bias) f.rb = put(GgmlType::F32, {c.E}, rb);
        f.logits = put(GgmlType::F32, {c.E, T}, std::vector<float>(size_t(c.E * T), std::nanf("")));
        f.ids = put(GgmlType::I32, {int64_t(c.K), T}, std::vector<int32_t>(size_t(c.K * T), -1));
        f.w = put(GgmlType::F32, {int64_t(c.K), T}, std::vector<float>(size_t(c.K * T), std::nanf("")));
        return f;
      };
      Front gpu = make(g), cpu = make(cpu_);
      g.synchronize();  // the setup's uploads run as a pass of their own
      // Each step slot's pass is captured once (step_io.h): the step after them replays one.
      for (int step = 0; step <= cuda::StepIo::kSlots; ++step) {
        const std::string what = "D " + std::to_string(c.D) + " E " + std::to_string(c.E) + " T " +
                                 std::to_string(T) + " step " + std::to_string(step);
        const std::vector<float> x = random_floats(rng_, size_t(c.D * T), -2.0f, 2.0f);
        g.upload(x.data(), gpu.x, x.size() * 4), cpu_.upload(x.data(), cpu.x, x.size() * 4);
        auto run = [&](Backend& be, Front& f) {
          be.rmsnorm_moe_route(f.x, f.nw, eps, f.normed, f.router, f.rb, route, f.logits, f.ids, f.w);
          std::vector<float> normed(size_t(c.D * T)), logits(size_t(c.E * T)), w(size_t(c.K * T));
          std::vector<int32_t> ids(size_t(c.K * T));
          be.download(f.normed, normed.data(), normed.size() * 4);
          be.download(f.logits, logits.data(), logits.size() * 4);
          be.download(f.ids, ids.data(), ids.size() * 4);
          be.download(f.w, w.data(), w.size() * 4);
          return std::make_tuple(normed, logits, ids, w);
        };
        const auto [g_normed, g_logits, g_ids, g_w] = run(g, gpu);
        const auto [c_normed, c_logits, c_ids, c_w] = run(cpu_, cpu);
        auto as_double = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
        EXPECT_TRUE(cuda::testing::all_close(g_normed, as_double(c_normed), 1e-5, 1e-6, "normed " + what));
        EXPECT_TRUE(cuda::testing::all_close(g_logits, as_double(c_logits), 1e-4, 1e-5, "logits " + what));
        int near_ties = 0;
        for (int64_t t = 0; t < T; ++t)
          for (int j = 0; j < c.K; ++j) {
            const int32_t want = c_ids[size_t(t * c.K + j)], got = g_ids[size_t(t * c.K + j)];
            if (want == got) {
              EXPECT_NEAR(g_w[size_t(t * c.K + j)], c_w[size_t(t * c.K + j)], 1e-4 * std::fabs(c_w[size_t(t * c.K + j)]) + 1e-6)
                  << what << ": weight of token " << t << " slot " << j;
              continue;
            }
            ASSERT_TRUE(got >= 0 && got < c.E) << what << ": token " << t << " slot " << j << " expert " << got;
            const float lw = c_logits[size_t(t * c.E + want)], lg = c_logits[size_t(t * c.E + got)];
            EXPECT_LE(std::fabs(lw - lg), 1e-4f * std::fabs(lw) + 1e-5f)
                << what << ": token " << t << " slot " << j << " expert " << got << ", want " << want;
            ++near_ties;
          }
        EXPECT_LE(near_ties, 2) << what;  // a swapped pair counts twice
      }
      if (T == 1) EXPECT_GE(g.graphs().replays(), 1) << "the second step was not replayed";
    }
  }
}

// A decode step recorded as a graph, replayed with new routing and activations, gives what
// eager launches give (bit for bit: the same kernels on the same data).
TEST_F(CudaMoe, GraphReplayEqualsEager) {
  for (const MoeCase& c : {MoeCase{GgmlType::Q4_K, GgmlType::Q6_K, 256, 512, 128, 8, false},
                           MoeCase{GgmlType::F16, GgmlType::F16, 64, 96, 8, 2, true}}) {
    CudaOptions graphed;
    graphed.graphs = true;
    CudaBackend g(graphed);
    const int64_t T = 2;
    const Problem first = make_problem(rng_, c, T);
    OnBackend on_graph(g, first);
    on_graph.run(g, c);  // captured
    Problem second = first;
    std::shuffle(second.ids.begin(), second.ids.end(), rng_);  // a token may now use one expert twice: allowed
    second.x = random_floats(rng_, second.x.size(), -1.0f, 1.0f);
    // The same step once per step slot (each captured once, step_io.h), then once replayed.
    std::vector<float> replayed;
    for (int i = 0; i <= cuda::StepIo::kSlots; ++i) {
      g.upload(second.ids.data(), on_graph.ids, second.ids.size() * 4);
      g.upload(second.x.data(), on_graph.x, second.x.size() * 4);
      replayed = on_graph.run(g, c);
    }
    EXPECT_GE(g.graphs().replays(), 1) << "the second step was not replayed";
    OnBackend eager(*fast_, second);
    const std::vector<float> direct = eager.run(*fast_, c);
    EXPECT_TRUE(cuda::testing::all_equal_bits(replayed, direct, "graph replay vs eager " + describe(c, T)));
  }
}

}  // namespace
}  // namespace kiln::testing
