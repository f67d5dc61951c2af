// The CUDA backend's own ops (ops_extra.h) against the CPU backend on random inputs at
// awkward sizes: each op runs on both backends with the same data and the outputs must agree
// within f32 rounding (tolerances next to each test). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_support.h"
#include "twin_tensors.h"

namespace kiln::testing {
namespace {

using cuda::testing::all_close;

class BackendOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::list_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << "): GPU op test not run";
    CudaOptions o;
    o.exact = true;
    o.graphs = false;
    gpu_ = std::make_unique<CudaBackend>(o);
  }

  template <typename T>
  Twin make(GgmlType type, std::initializer_list<int64_t> shape, const std::vector<T>& data) {
    return make_twin(cpu_, *gpu_, type, shape, data);
  }
  Twin random(std::initializer_list<int64_t> shape, float lo = -1.0f, float hi = 1.0f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return make(GgmlType::F32, shape, cuda::testing::random_floats(rng_, size_t(n), lo, hi));
  }
  // Downloads both sides and compares (the CPU side as the reference).
  ::testing::AssertionResult agree(const Twin& t, double rel, double abs, const std::string& what) {
    const size_t n = size_t(t.cpu.elements());
    std::vector<float> got(n), want(n);
    gpu_->download(t.gpu, got.data(), n * sizeof(float));
    cpu_.download(t.cpu, want.data(), n * sizeof(float));
    return all_close(got, std::vector<double>(want.begin(), want.end()), rel, abs, what);
  }

  std::mt19937_64 rng_{20251101};
  CpuBackend cpu_{2};
  std::unique_ptr<CudaBackend> gpu_;
};

TEST_F(BackendOps, ElementwiseAndSoftmax) {
  Twin a = random({37, 5}), b = random({37, 5}), row = random({37, 1}), out = random({37, 5});
  cpu_.add(a.cpu, b.cpu, out.cpu), gpu_->add(a.gpu, b.gpu, out.gpu);
  EXPECT_TRUE(agree(out, 1e-6, 1e-7, "add"));
  cpu_.add(a.cpu, row.cpu, out.cpu), gpu_->add(a.gpu, row.gpu, out.gpu);
  EXPECT_TRUE(agree(out, 1e-6, 1e-7, "add broadcast"));
  cpu_.scale(a.cpu, 3.5f, out.cpu), gpu_->scale(a.gpu, 3.5f, out.gpu);
  EXPECT_TRUE(agree(out, 1e-6, 1e-7, "scale"));
  cpu_.softcap(a.cpu, 0.7f, out.cpu), gpu_->softcap(a.gpu, 0.7f, out.gpu);
  EXPECT_TRUE(agree(out, 1e-5, 1e-7, "softcap"));
  Twin big = random({301, 3}, -8.0f, 8.0f), sm = random({301, 3});
  cpu_.softmax(big.cpu, sm.cpu), gpu_->softmax(big.gpu, sm.gpu);
  EXPECT_TRUE(agree(sm, 1e-5, 1e-9, "softmax"));
  Twin gate = random({37, 5}), per_row = random({1, 5});
  cpu_.sigmoid_mul(a.cpu, gate.cpu, out.cpu), gpu_->sigmoid_mul(a.gpu, gate.gpu, out.gpu);
  EXPECT_TRUE(agree(out, 1e-5, 1e-7, "sigmoid_mul"));
  cpu_.sigmoid_mul(a.cpu, per_row.cpu, out.cpu), gpu_->sigmoid_mul(a.gpu, per_row.gpu, out.gpu);
  EXPECT_TRUE(agree(out, 1e-5, 1e-7, "sigmoid_mul per row"));
  Twin x = random({48, 7}), z = random({48, 7}), w = random({48}), y = random({48, 7});
  cpu_.rmsnorm_gated(x.cpu, z.cpu, w.cpu, 1e-6f, y.cpu), gpu_->rmsnorm_gated(x.gpu, z.gpu, w.gpu, 1e-6f, y.gpu);
  EXPECT_TRUE(agree(y, 1e-5, 1e-7, "rmsnorm_gated"));
}

// Two sequences interleaved in one batch over the paged cache; head sizes the library kernel
// takes (64) and ones only the general kernel takes (48 / 40).
TEST_F(BackendOps, AttentionMatchesCpu) {
  using Case = std::tuple<int, int, float, int, bool>;  // dk, dv, softcap, window, sinks
  for (const auto& [dk, dv, cap, window, use_sinks] : std::initializer_list<Case>{
           {64, 64, 0.0f, 0, false}, {64, 64, 30.0f, 5, true}, {48, 40, 0.0f, 0, false}, {48, 48, 20.0f, 7, true}}) {
    const int n_head = 6, n_kv = 2, block = 4, max_blocks = 8, n_rows = 2;
    const int T = 11;  // tokens 0..5 of sequence 0 and 0..4 of sequence 1, interleaved
    std::vector<int32_t> pos, seq, slots;
    std::vector<int32_t> tables(size_t(max_blocks * n_rows));
    for (int r = 0; r < n_rows; ++r)
      for (int b = 0; b < max_blocks; ++b) tables[size_t(r * max_blocks + b)] = (b * n_rows + r + 3) % (max_blocks * n_rows);
    for (int t = 0; t < T; ++t) {
      const int s = t % 2, p = t / 2;
      pos.push_back(p), seq.push_back(s);
      slots.push_back(tables[size_t(s * max_blocks + p / block)] * block + p % block);
    }
    const int64_t n_slots = int64_t(max_blocks) * n_rows * block;
    Twin q = random({int64_t(n_head) * dk, T}), k = random({int64_t(n_kv) * dk, T}), v = random({int64_t(n_kv) * dv, T});
    Twin ck = random({int64_t(n_kv) * dk, n_slots}), cv = random({int64_t(n_kv) * dv, n_slots});
    Twin tp = make(GgmlType::I32, {T}, pos), ts = make(GgmlType::I32, {T}, seq), tsl = make(GgmlType::I32, {T}, slots);
    Twin tb = make(GgmlType::I32, {max_blocks, n_rows}, tables);
    Twin sk = random({n_head}), out = random({int64_t(n_head) * dv, T});
    KvLayer cache_cpu{ck.cpu, cv.cpu, block}, cache_gpu{ck.gpu, cv.gpu, block};
    cpu_.kv_store(k.cpu, v.cpu, cache_cpu, tsl.cpu), gpu_->kv_store(k.gpu, v.gpu, cache_gpu, tsl.gpu);
    AttentionParams p;
    p.n_head = n_head, p.n_head_kv = n_kv, p.head_dim_k = dk, p.head_dim_v = dv;
    p.scale = 0.3f, p.softcap = cap, p.sliding_window = window;
    BatchIndex bc{tp.cpu, ts.cpu, tsl.cpu, tb.cpu, 5}, bg{tp.gpu, ts.gpu, tsl.gpu, tb.gpu, 5};
    AttentionParams pc = p, pg = p;
    if (use_sinks) pc.sinks = &sk.cpu, pg.sinks = &sk.gpu;
    cpu_.attention(q.cpu, cache_cpu, bc, pc, out.cpu);
    gpu_->attention(q.gpu, cache_gpu, bg, pg, out.gpu);
    EXPECT_TRUE(agree(out, 1e-5, 1e-6, "attention dk " + std::to_string(dk) + " dv " + std::to_string(dv)));
    EXPECT_TRUE(agree(ck, 0, 0, "kv_store k"));
  }
}

// Prompt chunks of one sequence take the tensor-core prefill kernel (f16 products, so the
// bound is f16 rounding: ~1e-3 of the values) outside exact mode: head sizes 64 and 128,
// f32 and f16 caches, chunks that start at 0 and after earlier cached keys, partial tiles,
// GQA, soft-capping, a window and sinks, against the CPU's f32 attention over the same
// cache. Unwritten f16 slots hold NaN, so a kernel that reads past the chunk's keys fails.
TEST_F(BackendOps, PrefillAttentionMatchesCpu) {
  CudaOptions fast_options;
  fast_options.graphs = false;
  CudaBackend fast(fast_options);  // not exact: prompt chunks use the tensor-core kernel
  using Case = std::tuple<int, int, int, float, int, bool>;  // d, T, first position, softcap, window, sinks
  for (const GgmlType cache_type : {GgmlType::F32, GgmlType::F16})
    for (const auto& [d, T, first, cap, window, use_sinks] : std::initializer_list<Case>{
             {128, 16, 0, 0.0f, 0, false}, {128, 200, 0, 0.0f, 0, false}, {64, 65, 37, 0.0f, 0, false},
             {128, 130, 70, 30.0f, 50, true}, {64, 100, 0, 0.0f, 16, true}, {128, 333, 21, 0.0f, 0, false}}) {
      SCOPED_TRACE(std::string(type_name(cache_type)) + " cache, d " + std::to_string(d) + " T " +
                   std::to_string(T) + " first " + std::to_string(first));
      const int n_head = 8, n_kv = 2, block = 16, n_rows = 2, seq_row = 1;
      const int max_blocks = (first + T + block - 1) / block + 1;
      std::vector<int32_t> tables(size_t(max_blocks * n_rows));
      for (int r = 0; r < n_rows; ++r)  // scattered physical blocks
        for (int b = 0; b < max_blocks; ++b)
          tables[size_t(r * max_blocks + b)] = (b * n_rows + r + 5) % (max_blocks * n_rows);
      auto slot_of = [&](int p) { return tables[size_t(seq_row * max_blocks + p / block)] * block + p % block; };
      std::vector<int32_t> pos, seq, slots, earlier_slots;
      for (int t = 0; t < T; ++t) pos.push_back(first + t), seq.push_back(seq_row), slots.push_back(slot_of(first + t));
      for (int p = 0; p < first; ++p) earlier_slots.push_back(slot_of(p));
      const int64_t n_slots = int64_t(max_blocks) * n_rows * block;
      const int64_t width = int64_t(n_kv) * d;
      Twin q = random({int64_t(n_head) * d, T}), k = random({width, T}), v = random({width, T});
      Twin ck = cache_type == GgmlType::F32
                    ? random({width, n_slots})
                    : make(GgmlType::F16, {width, n_slots}, std::vector<uint16_t>(size_t(width * n_slots), 0x7e00));
      Twin cv = cache_type == GgmlType::F32
                    ? random({width, n_slots})
                    : make(GgmlType::F16, {width, n_slots}, std::vector<uint16_t>(size_t(width * n_slots), 0x7e00));
      KvLayer cache_cpu{ck.cpu, cv.cpu, block}, cache_gpu{ck.gpu, cv.gpu, block};
      if (first > 0) {  // the keys of earlier chunks
        Twin ek = random({width, first}), ev = random({width, first});
        Twin es = make(GgmlType::I32, {first}, earlier_slots);
        cpu_.kv_store(ek.cpu, ev.cpu, cache_cpu, es.cpu), gpu_->kv_store(ek.gpu, ev.gpu, cache_gpu, es.gpu);
      }
      Twin tp = make(GgmlType::I32, {T}, pos), ts = make(GgmlType::I32, {T}, seq), tsl = make(GgmlType::I32, {T}, slots);
      Twin tb = make(GgmlType::I32, {max_blocks, n_rows}, tables);
      Twin sk = random({n_head}), out = random({int64_t(n_head) * d, T});
      cpu_.kv_store(k.cpu, v.cpu, cache_cpu, tsl.cpu), gpu_->kv_store(k.gpu, v.gpu, cache_gpu, tsl.gpu);
      gpu_->synchronize();
      AttentionParams p;
      p.n_head = n_head, p.n_head_kv = n_kv, p.head_dim_k = d, p.head_dim_v = d;
      p.scale = 1.0f / std::sqrt(float(d)), p.softcap = cap, p.sliding_window = window;
      BatchIndex bc{tp.cpu, ts.cpu, tsl.cpu, tb.cpu, first + T - 1, true, first};
      BatchIndex bg{tp.gpu, ts.gpu, tsl.gpu, tb.gpu, first + T - 1, true, first};
      AttentionParams pc = p, pg = p;
      if (use_sinks) pc.sinks = &sk.cpu, pg.sinks = &sk.gpu;
      cpu_.attention(q.cpu, cache_cpu, bc, pc, out.cpu);
      fast.attention(q.gpu, cache_gpu, bg, pg, out.gpu);
      fast.synchronize();
      EXPECT_TRUE(agree(out, 4e-3, 2e-3, "prefill attention"));
    }
}

TEST_F(BackendOps, MoeRouteAndFfnMatchCpu) {
  const int64_t n_embd = 64, n_ff = 96, n_expert = 5, T = 7;
  for (const MoeGating gating : {MoeGating::Softmax, MoeGating::Sigmoid, MoeGating::SoftmaxTopK}) {
    Twin logits = random({n_expert, T}, -3.0f, 3.0f);
    Twin ids = make(GgmlType::I32, {2, T}, std::vector<int32_t>(size_t(2 * T), 0)), w = random({2, T});
    MoeRouteParams rp{2, gating, gating == MoeGating::Sigmoid, 1.5f};
    cpu_.moe_route(logits.cpu, rp, ids.cpu, w.cpu), gpu_->moe_route(logits.gpu, rp, ids.gpu, w.gpu);
    EXPECT_TRUE(agree(w, 1e-5, 1e-7, "moe_route weights"));
    std::vector<int32_t> a(size_t(2 * T)), b(size_t(2 * T));
    cpu_.download(ids.cpu, a.data(), a.size() * 4), gpu_->download(ids.gpu, b.data(), b.size() * 4);
    EXPECT_EQ(a, b) << "moe_route ids";
    Twin x = random({n_embd, T}), gate = random({n_embd, n_ff, n_expert}), up = random({n_embd, n_ff, n_expert});
    Twin down = random({n_ff, n_embd, n_expert}), gb = random({n_ff, n_expert}), out = random({n_embd, T});
    ExpertWeights ec{gate.cpu, up.cpu, down.cpu, gb.cpu, {}, {}}, eg{gate.gpu, up.gpu, down.gpu, gb.gpu, {}, {}};
    cpu_.moe_ffn(x.cpu, ec, ids.cpu, w.cpu, GluParams{Activation::SwigluOai}, out.cpu);
    gpu_->moe_ffn(x.gpu, eg, ids.gpu, w.gpu, GluParams{Activation::SwigluOai}, out.gpu);
    EXPECT_TRUE(agree(out, 1e-4, 1e-5, "moe_ffn"));
  }
}

TEST_F(BackendOps, GatedDeltaNetMatchesCpu) {
  // Two sequences: a prefill chunk of 9 tokens of sequence 1, then decode steps of both.
  const int nk = 2, nv = 4, dk = 32, dv = 24, C = 2 * nk * dk + nv * dv, K = 4;
  Twin conv_state = random({K - 1, C, 2}), delta_state = random({dv, dk, nv, 2});
  Twin conv_w = random({K, C}), a_log = random({nv}, -1.0f, -0.1f), dt = random({nv});
  for (const std::vector<std::pair<int, int>>& batch_rows :
       {std::vector<std::pair<int, int>>{{1, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}, {1, 6}, {1, 7}, {1, 8}},
        std::vector<std::pair<int, int>>{{0, 0}, {1, 9}}, std::vector<std::pair<int, int>>{{1, 10}, {0, 1}}}) {
    const int64_t T = int64_t(batch_rows.size());
    std::vector<int32_t> pos, seq;
    for (auto [s, p] : batch_rows) seq.push_back(s), pos.push_back(p);
    Twin tp = make(GgmlType::I32, {T}, pos), ts = make(GgmlType::I32, {T}, seq);
    Twin tb = make(GgmlType::I32, {1, 2}, std::vector<int32_t>{0, 1}), sl = make(GgmlType::I32, {T}, seq);
    BatchIndex bc{tp.cpu, ts.cpu, sl.cpu, tb.cpu, 10}, bg{tp.gpu, ts.gpu, sl.gpu, tb.gpu, 10};
    Twin x = random({C, T}), conv_out = random({C, T});
    cpu_.causal_conv_silu(x.cpu, conv_w.cpu, conv_state.cpu, bc, conv_out.cpu);
    gpu_->causal_conv_silu(x.gpu, conv_w.gpu, conv_state.gpu, bg, conv_out.gpu);
    EXPECT_TRUE(agree(conv_out, 1e-5, 1e-6, "causal_conv_silu"));
    EXPECT_TRUE(agree(conv_state, 1e-6, 0, "conv state"));
    Twin ab = random({2 * nv, T}), out = random({int64_t(nv) * dv, T});
    auto view = [&](const Tensor& t, int64_t off) {  // {nv, 1, T} column views of ab
      Tensor v = t;
      v.n_dims = 3, v.ne[0] = nv, v.ne[1] = 1, v.ne[2] = T;
      v.nb[1] = size_t(nv) * 4, v.nb[2] = t.nb[1], v.nb[3] = t.nb[1] * size_t(T);
      v.data = static_cast<float*>(t.data) + off;
      return v;
    };
    auto slice = [](const Tensor& t, int64_t off, int64_t width) {
      Tensor v = t;
      v.ne[0] = width;
      v.data = static_cast<float*>(t.data) + off;
      return v;
    };
    DeltaRuleParams p;
    p.n_k_heads = nk, p.n_v_heads = nv, p.head_dim_k = dk, p.head_dim_v = dv, p.tiled_heads = T == 2;
    cpu_.gated_delta_rule(slice(conv_out.cpu, 0, nk * dk), slice(conv_out.cpu, nk * dk, nk * dk),
                          slice(conv_out.cpu, 2 * nk * dk, nv * dv), view(ab.cpu, 0), view(ab.cpu, nv), a_log.cpu,
                          dt.cpu, delta_state.cpu, bc, p, out.cpu);
    gpu_->gated_delta_rule(slice(conv_out.gpu, 0, nk * dk), slice(conv_out.gpu, nk * dk, nk * dk),
                           slice(conv_out.gpu, 2 * nk * dk, nv * dv), view(ab.gpu, 0), view(ab.gpu, nv), a_log.gpu,
                           dt.gpu, delta_state.gpu, bg, p, out.gpu);
    // The CPU runs prefill chunks in double; f32 recurrence on the GPU: ~1e-5 relative.
    EXPECT_TRUE(agree(out, 1e-4, 1e-5, "gated_delta_rule T=" + std::to_string(T)));
    EXPECT_TRUE(agree(delta_state, 1e-4, 1e-5, "delta state T=" + std::to_string(T)));
  }
}

TEST_F(BackendOps, UnsupportedWeightTypeIsNamed) {
  const GgmlType types[] = {GgmlType::Q4_0};
  EXPECT_FALSE(gpu_->supports(Op::Matmul, types).has_value());
  const GgmlType f16[] = {GgmlType::F16}, bf16[] = {GgmlType::BF16};
  EXPECT_FALSE(gpu_->supports(Op::Attention, f16).has_value()) << "f16 KV caches are supported";
  const auto why = gpu_->supports(Op::Attention, bf16);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("attention"), std::string::npos) << *why;
}

}  // namespace
}  // namespace kiln::testing
