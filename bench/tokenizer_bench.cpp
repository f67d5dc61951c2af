// Tokenizer throughput: encode ~1 MB of English text on one core, per vocabulary.
// Text: the stories260K greedy continuations and llama.cpp's tokenizer test strings,
// repeated in a fixed order up to 1 MiB. Reference data from $KILN_TESTDATA or
// ../shared/testdata (run from the repository root).
//   ./bench_tokenizer_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace {

std::filesystem::path testdata_root() {
  if (const char* env = std::getenv("KILN_TESTDATA")) return env;
  return "../shared/testdata";
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::string& english_text() {
  static const std::string text = [] {
    const auto root = testdata_root();
    std::string seed;
    std::istringstream jsonl(read_file(root / "models/stories260K.greedy.jsonl"));
    for (std::string line; std::getline(jsonl, line);) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line);
      seed += j.at("prompt").get<std::string>() + j.at("text").get<std::string>() + "\n\n";
    }
    seed += read_file(root / "tokenizer/vocab/ggml-vocab-llama-bpe.gguf.inp");
    std::string out;
    if (seed.empty()) return out;
    while (out.size() < (1u << 20)) out += seed;
    out.resize(1u << 20);
    // Do not end inside a UTF-8 character.
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();
    if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xC0) out.pop_back();
    return out;
  }();
  return text;
}

const kiln::Tokenizer* tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<kiln::Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    const auto path = testdata_root() / ("tokenizer/vocab/ggml-vocab-" + name + ".gguf");
    if (!std::filesystem::exists(path)) return nullptr;
    slot = std::make_unique<kiln::Tokenizer>(kiln::Tokenizer::from_gguf(path.string()));
  }
  return slot.get();
}

void encode_1mb(benchmark::State& state, const std::string& name) {
  const kiln::Tokenizer* tok = tokenizer(name);
  const std::string& text = english_text();
  if (!tok || text.empty()) {
    state.SkipWithError("reference data absent (set KILN_TESTDATA)");
    return;
  }
  size_t tokens = 0;
  for (auto _ : state) {
    const auto ids = tok->encode(text, false, false);
    tokens += ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["tokens/s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
  state.counters["tokens"] = double(tokens) / double(state.iterations());
}

void decode_1mb(benchmark::State& state, const std::string& name) {
  const kiln::Tokenizer* tok = tokenizer(name);
  const std::string& text = english_text();
  if (!tok || text.empty()) {
    state.SkipWithError("reference data absent (set KILN_TESTDATA)");
    return;
  }
  const auto ids = tok->encode(text, false, false);
  for (auto _ : state) {
    const std::string back = tok->decode(ids);
    benchmark::DoNotOptimize(back.data());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(double(ids.size()) * double(state.iterations()), benchmark::Counter::kIsRate);
}

void load_vocab(benchmark::State& state, const std::string& name) {
  const auto path = testdata_root() / ("tokenizer/vocab/ggml-vocab-" + name + ".gguf");
  if (!std::filesystem::exists(path)) {
    state.SkipWithError("reference data absent (set KILN_TESTDATA)");
    return;
  }
  for (auto _ : state) {
    auto tok = kiln::Tokenizer::from_gguf(path.string());
    benchmark::DoNotOptimize(&tok);
  }
}

BENCHMARK_CAPTURE(encode_1mb, llama_bpe, std::string("llama-bpe"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode_1mb, qwen2, std::string("qwen2"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode_1mb, llama_spm, std::string("llama-spm"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode_1mb, llama_bpe, std::string("llama-bpe"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(load_vocab, llama_bpe, std::string("llama-bpe"))->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
