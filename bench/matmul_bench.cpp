// Matrix products at the Llama-3.2-1B shapes: matvec (n_tokens = 1, reported as GB/s of
// weights read) and 64-token prefill (reported as GFLOP/s, 2 * rows * cols * tokens).
// Weights rotate through copies totalling >= 1 GiB, so that matvec reads them from
// memory as a real decode step does, not from cache (KILN_BENCH_HOT=1: one copy).
//
//   bench_matmul_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//   KILN_SIMD=avx2 ... to measure the AVX2 paths.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "quant/quant.h"

namespace {

using kiln::GgmlType;

struct Weights {
  std::vector<std::vector<uint8_t>> copies;
  size_t row_bytes = 0;
};

// Random weights of `type`: 16 distinct quantized rows repeated over the matrix (the
// values do not change the speed), then copied until the copies total >= 1 GiB.
const Weights& weights_for(GgmlType type, int64_t rows, int64_t cols) {
  static std::map<std::tuple<int, int64_t, int64_t>, std::unique_ptr<Weights>> cache;
  auto& slot = cache[{int(type), rows, cols}];
  if (slot) return *slot;
  if (cache.size() > 1) {  // keep memory bounded: drop the other shapes
    for (auto it = cache.begin(); it != cache.end();)
      it = (it->second.get() == slot.get()) ? std::next(it) : cache.erase(it);
  }
  slot = std::make_unique<Weights>();
  slot->row_bytes = *kiln::row_bytes(type, cols);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> src(static_cast<size_t>(cols));
  std::vector<uint8_t> distinct(16 * slot->row_bytes);
  for (int r = 0; r < 16; ++r) {
    for (auto& v : src) v = normal(rng);
    kiln::quantize_row(type, src.data(), distinct.data() + r * slot->row_bytes, cols);
  }
  const size_t bytes = slot->row_bytes * size_t(rows);
  // KILN_BENCH_HOT=1 keeps one copy (cache-resident for the small shapes): kernel speed
  // without the memory system.
  const bool hot = std::getenv("KILN_BENCH_HOT") != nullptr;
  const size_t n_copies =
      hot ? 1 : std::min<size_t>(64, std::max<size_t>(1, ((size_t(1) << 30) + bytes - 1) / bytes));
  for (size_t c = 0; c < n_copies; ++c) {
    std::vector<uint8_t> w(bytes);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(w.data() + size_t(r) * slot->row_bytes, distinct.data() + (r % 16) * slot->row_bytes, slot->row_bytes);
    slot->copies.push_back(std::move(w));
  }
  return *slot;
}

kiln::ThreadPool& pool_of(int threads) {
  static kiln::ThreadPool one(1), two(2);
  return threads == 1 ? one : two;
}

void BM_Matmul(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), n_tokens = state.range(3);
  const int threads = int(state.range(4));
  const Weights& w = weights_for(type, rows, cols);
  std::vector<float> x(size_t(cols * n_tokens)), y(size_t(rows * n_tokens));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(rng);
  kiln::ThreadPool& pool = pool_of(threads);
  size_t next = 0;
  for (auto _ : state) {
    const kiln::cpu::MatmulArgs args{type, w.copies[next].data(), w.row_bytes, rows, cols, x.data(), cols,
                                     n_tokens, y.data(), rows};
    kiln::cpu::matmul(args, pool);
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % w.copies.size();
  }
  const double weight_bytes = double(w.row_bytes) * double(rows);
  if (n_tokens == 1)
    state.counters["GB/s"] = benchmark::Counter(weight_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  else
    state.counters["GFLOP/s"] = benchmark::Counter(2e-9 * double(rows) * double(cols) * double(n_tokens),
                                                   benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(kiln::type_name(type)));
}

void shapes(benchmark::internal::Benchmark* b) {
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16};
  const int64_t shape[][2] = {{2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}, {128256, 2048}};
  b->ArgNames({"type", "rows", "cols", "tokens", "threads"});
  for (GgmlType t : types)
    for (const auto& s : shape)
      for (int64_t tokens : {1, 64})
        for (int64_t threads : {1, 2}) b->Args({int64_t(t), s[0], s[1], tokens, threads});
  b->UseRealTime();
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Matmul)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
