// CPU attention over the paged KV cache, f32 against f16 entries: one decode token (32
// query heads over 8 kv heads of 128 dims, a Llama-3-8B layer) at contexts of 512, 4096
// and 16384 keys, and a 64-token prefill chunk at 512 keys. One thread, so that the
// numbers compare the kernels, not the machine's load. Rates are keys read per second
// (CPU time): each key is one K row and one V row of a kv head, per query head.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace {

using namespace kiln;

constexpr int kHeads = 32, kKvHeads = 8, kDim = 128, kBlock = 16;

void run(benchmark::State& state, GgmlType cache_type) {
  const int context = int(state.range(0)), n_tokens = int(state.range(1));
  CpuBackend backend(1);
  const int64_t width = int64_t(kKvHeads) * kDim;
  std::vector<float> kv(size_t(width) * context), q(size_t(kHeads) * kDim * n_tokens);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& x : kv) x = normal(rng);
  for (float& x : q) x = normal(rng);
  const size_t element = cache_type == GgmlType::F16 ? 2 : 4;
  std::vector<uint8_t> k_cache(size_t(width) * context * element), v_cache(k_cache.size());
  std::vector<int32_t> table(static_cast<size_t>(context / kBlock)), slots(static_cast<size_t>(context)),
      pos(static_cast<size_t>(n_tokens)), seq(static_cast<size_t>(n_tokens), 0);
  for (size_t b = 0; b < table.size(); ++b) table[b] = int32_t(table.size() - 1 - b);  // blocks in reverse
  for (int p = 0; p < context; ++p) slots[size_t(p)] = table[size_t(p / kBlock)] * kBlock + p % kBlock;
  for (int t = 0; t < n_tokens; ++t) pos[size_t(t)] = context - n_tokens + t;

  KvLayer cache{Tensor::contiguous(cache_type, {width, context}, k_cache.data()),
                Tensor::contiguous(cache_type, {width, context}, v_cache.data()), kBlock};
  const Tensor all = Tensor::contiguous(GgmlType::F32, {width, context}, kv.data());
  backend.kv_store(all, all, cache, Tensor::contiguous(GgmlType::I32, {context}, slots.data()));
  BatchIndex index{Tensor::contiguous(GgmlType::I32, {n_tokens}, pos.data()),
                   Tensor::contiguous(GgmlType::I32, {n_tokens}, seq.data()),
                   Tensor::contiguous(GgmlType::I32, {n_tokens}, slots.data() + (context - n_tokens)),
                   Tensor::contiguous(GgmlType::I32, {int64_t(table.size()), 1}, table.data()), context - 1};
  AttentionParams p{kHeads, kKvHeads, kDim, kDim, 0.088f, 0.0f, 0, nullptr};
  std::vector<float> out(q.size());
  const Tensor tq = Tensor::contiguous(GgmlType::F32, {kHeads * kDim, n_tokens}, q.data());
  Tensor tout = Tensor::contiguous(GgmlType::F32, {kHeads * kDim, n_tokens}, out.data());
  for (auto _ : state) {
    backend.attention(tq, cache, index, p, tout);
    benchmark::DoNotOptimize(out.data());
  }
  int64_t keys = 0;
  for (int t = 0; t < n_tokens; ++t) keys += pos[size_t(t)] + 1;
  state.SetItemsProcessed(state.iterations() * keys * kHeads);
}

void args(benchmark::internal::Benchmark* b) {
  b->Args({512, 1})->Args({4096, 1})->Args({16384, 1})->Args({512, 64})->ArgNames({"context", "tokens"});
}

BENCHMARK_CAPTURE(run, f32, GgmlType::F32)->Apply(args);
BENCHMARK_CAPTURE(run, f16, GgmlType::F16)->Apply(args);

}  // namespace

BENCHMARK_MAIN();
