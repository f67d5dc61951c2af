// Dequantization throughput per type, scalar reference vs dequantize_row (the SIMD path
// where one exists), in GB/s of float output. Rows of 2^20 values (4 MiB of output: about
// L2/L3-sized, so this measures the kernels more than DRAM).
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "quant/codec.h"
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

void run(benchmark::State& state, GgmlType type, bool fast) {
  const std::vector<uint8_t> bytes = sample_row(type);
  std::vector<float> out(kValues);
  for (auto _ : state) {
    if (fast) dequantize_row(type, bytes.data(), out.data(), kValues);
    else dequantize_row_reference(type, bytes.data(), out.data(), kValues);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kValues * int64_t(sizeof(float)));
}

const int registered = [] {
  size_t count;
  const TypeTraits* all = all_types(&count);
  for (size_t i = 0; i < count; ++i) {
    const GgmlType type = all[i].type;
    const RowCodec* codec = find_codec(type);
    if (!codec) continue;
    const std::string name(type_name(type));
    benchmark::RegisterBenchmark(("dequant/" + name + "/reference").c_str(),
                                 [type](benchmark::State& s) { run(s, type, false); });
    if (codec->dequantize_fast)
      benchmark::RegisterBenchmark(("dequant/" + name + "/fast").c_str(),
                                   [type](benchmark::State& s) { run(s, type, true); });
  }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
