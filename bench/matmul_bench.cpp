// Matrix products at the Llama-3.2-1B shapes: matvec (n_tokens = 1, reported as GB/s of
// weights read) and 64-token prefill (reported as GFLOP/s, 2 * rows * cols * tokens).
// Weights rotate through copies totalling >= 1 GiB, so that matvec reads them from
// memory as a real decode step does, not from cache (KILN_BENCH_HOT=1: one copy).
//
//   bench_matmul_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//   KILN_SIMD=avx2 ... to measure the AVX2 paths.
#include <benchmark/benchmark.h>
#include <immintrin.h>

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

// The floors, measured in the same run (the machine may be shared, and its clock varies):
// - BM_ReadBandwidth: bytes/s one or two threads stream from memory (sum of a 1 GiB
//   buffer), the bound of matvec;
// - BM_VnniPeak: int8 operations/s of independent vpdpbusd chains on one thread (2 ops per
//   multiply-add, 64 per instruction), the bound of the int8 prefill kernels;
// - BM_FmaPeak: f32 FLOP/s of independent FMA chains, the bound of the float prefill.
__attribute__((target("avx512f"))) float sum_range(const float* p, size_t n) {
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps(), c = _mm512_setzero_ps(), d = _mm512_setzero_ps();
  for (size_t i = 0; i + 64 <= n; i += 64) {
    a = _mm512_add_ps(a, _mm512_load_ps(p + i));
    b = _mm512_add_ps(b, _mm512_load_ps(p + i + 16));
    c = _mm512_add_ps(c, _mm512_load_ps(p + i + 32));
    d = _mm512_add_ps(d, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}

void BM_ReadBandwidth(benchmark::State& state) {
  const size_t n = (size_t(1) << 30) / sizeof(float);
  static float* data = nullptr;
  if (!data) {
    data = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
    for (size_t i = 0; i < n; ++i) data[i] = 1.0f;
  }
  kiln::ThreadPool& pool = pool_of(int(state.range(0)));
  for (auto _ : state) {
    float sums[2] = {0, 0};
    pool.run([&](int t) {
      const size_t half = n / size_t(pool.size());
      sums[t] = sum_range(data + half * size_t(t), half);
    });
    benchmark::DoNotOptimize(sums);
  }
  state.counters["GB/s"] = benchmark::Counter(double(n * sizeof(float)) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

__attribute__((target("avx512f,avx512vnni"))) void BM_VnniPeak(benchmark::State& state) {
  constexpr int kChains = 12;
  const long n = 1 << 20;
  for (auto _ : state) {
    __m512i acc[kChains];
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_epi32(j);
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
    for (long i = 0; i < n; ++i) {
      for (int j = 0; j < kChains; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
      asm volatile("" : "+v"(a));
    }
    benchmark::DoNotOptimize(acc);
  }
  state.counters["GOP/s"] = benchmark::Counter(1e-9 * double(n) * kChains * 128, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_VnniPeak)->UseRealTime()->Unit(benchmark::kMillisecond);

__attribute__((target("avx512f"))) void BM_FmaPeak(benchmark::State& state) {
  constexpr int kChains = 12;
  const long n = 1 << 20;
  for (auto _ : state) {
    __m512 acc[kChains];
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(float(j));
    __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.0f);
    for (long i = 0; i < n; ++i) {
      for (int j = 0; j < kChains; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
      asm volatile("" : "+v"(a));
    }
    benchmark::DoNotOptimize(acc);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(1e-9 * double(n) * kChains * 32, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FmaPeak)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
