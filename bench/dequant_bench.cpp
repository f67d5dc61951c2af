// Dequantization throughput per type and instruction-set level: the scalar reference, then
// each SIMD kernel the processor has (avx2, avx512), in GB/s of float output (rates use CPU
// time). Two row lengths (the benchmark argument): 2^14 values (64 KiB of output, cache
// resident: the kernels' own speed) and 2^20 values (4 MiB: bounded by L3 / memory stores).
#include <benchmark/benchmark.h>

#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "quant/codec.h"
#include "quant/fast_paths.h"
#include "quant/quant.h"

namespace {

using namespace kiln;

constexpr int64_t kValues = int64_t(1) << 20;

// Real quantized data (quantized from random floats) where kiln can produce the type,
// random bytes otherwise.
std::vector<uint8_t> sample_row(GgmlType type) {
  std::vector<uint8_t> bytes(*row_bytes(type, kValues));
  std::mt19937 rng(1);
  if (can_quantize(type)) {
    std::normal_distribution<float> normal;
    std::vector<float> x(kValues);
    for (float& v : x) v = normal(rng);
    quantize_row(type, x.data(), bytes.data(), kValues);
  } else {
    for (uint8_t& b : bytes) b = uint8_t(rng());
  }
  return bytes;
}

// sample_row once per type (quantizing 2^20 values is slower than the benchmark itself).
const std::vector<uint8_t>& cached_row(GgmlType type) {
  static std::map<GgmlType, std::vector<uint8_t>> rows;
  auto it = rows.find(type);
  if (it == rows.end()) it = rows.emplace(type, sample_row(type)).first;
  return it->second;
}

void run(benchmark::State& state, GgmlType type, DequantizeFn kernel) {
  const std::vector<uint8_t>& bytes = cached_row(type);
  const int64_t values = state.range(0);  // a multiple of every block size; a prefix of the row
  std::vector<float> out(values);
  for (auto _ : state) {
    kernel(bytes.data(), out.data(), values);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * values * int64_t(sizeof(float)));
}

const int registered = [] {
  size_t count;
  const TypeTraits* all = all_types(&count);
  for (size_t i = 0; i < count; ++i) {
    const GgmlType type = all[i].type;
    const RowCodec* codec = find_codec(type);
    if (!codec) continue;
    const std::string name(type_name(type));
    const std::pair<const char*, DequantizeFn> levels[] = {
        {"reference", codec->dequantize_reference},
        {"avx2", fast_dequantizer_at(type, SimdLevel::Avx2)},
        {"avx512", fast_dequantizer_at(type, SimdLevel::Avx512)},
    };
    for (const auto& [level, kernel] : levels)
      if (kernel)
        benchmark::RegisterBenchmark(("dequant/" + name + "/" + level).c_str(),
                                     [type, kernel = kernel](benchmark::State& s) { run(s, type, kernel); })
            ->Arg(int64_t(1) << 14)
            ->Arg(kValues);
  }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
