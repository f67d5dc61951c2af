// The generator and `kiln run` / `kiln chat` on stories260K, against llama.cpp's greedy text.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <memory>
#include <utility>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "run_command.h"
#include "runtime/generator.h"
#include "support/testdata.h"
#include "tokenizer/tokenizer.h"

namespace kiln::testing {
namespace {

struct Stories {
  std::unique_ptr<gguf::File> file;
  CpuBackend backend{1};
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  explicit Stories(const std::filesystem::path& path)
      : file(gguf::File::open(path.string())),
        model(Model::load(*file, backend)),
        tokenizer(std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file))) {}
};

nlohmann::json first_greedy_case(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return nlohmann::json::parse(line);
}

SamplerParams greedy() {
  SamplerParams p;
  p.temperature = 0;
  return p;
}

#define KILN_STORIES_CASE()                                                 \
  KILN_REQUIRE_TESTDATA(model_path, "models/stories260K.gguf");             \
  KILN_REQUIRE_TESTDATA(greedy_path, "models/stories260K.greedy.jsonl");    \
  const nlohmann::json ref = first_greedy_case(greedy_path);                \
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>(); \
  const std::vector<int32_t> expected_ids = ref["ids"].get<std::vector<int32_t>>();  \
  const std::string expected_text = ref["text"].get<std::string>()

// Both cache types (f16: llama.cpp's attention precision, see tests/model/stories_test.cpp;
// this first prompt is no near-tie, so f32 matches too).
TEST(Generator, GreedyMatchesLlamaCppWithChunkedPrefill) {
  KILN_STORIES_CASE();
  Stories s(model_path);
  const std::tuple<GgmlType, int, bool> runs[] = {  // cache type, prefill batch, argmax on the device
      {GgmlType::F16, 512, true}, {GgmlType::F16, 2, true}, {GgmlType::F32, 512, true}, {GgmlType::F32, 2, true},
      {GgmlType::F16, 512, false}, {GgmlType::F32, 2, false}};
  for (const auto& [cache_type, max_batch, on_device] : runs) {
    SCOPED_TRACE(fmt::format("{} cache, prefill batches of {}, argmax on the {}", type_name(cache_type), max_batch,
                             on_device ? "device" : "host"));
    Generator gen(*s.model, *s.tokenizer, 256, max_batch, cache_type);
    Sampler sampler(greedy());
    std::string streamed;
    GenerationOptions options{.max_tokens = 100};
    options.argmax_on_device = on_device;
    const GenerationResult r = gen.generate(prompt, sampler, options, [&](std::string_view t) { streamed += t; });
    EXPECT_EQ(r.tokens, expected_ids);
    EXPECT_EQ(r.text, expected_text);
    EXPECT_EQ(streamed, expected_text);
    EXPECT_EQ(r.reason, StopReason::TokenLimit);
    EXPECT_EQ(r.stats.n_prompt, int(prompt.size()));
    EXPECT_EQ(r.stats.n_generated, 100);
  }
}

TEST(Generator, StopStringEndsTheTextBeforeIt) {
  KILN_STORIES_CASE();
  Stories s(model_path);
  Generator gen(*s.model, *s.tokenizer, 256);
  Sampler sampler(greedy());
  GenerationOptions options{.max_tokens = 100, .stop = {"Lily"}};
  std::string streamed;
  const GenerationResult r = gen.generate(prompt, sampler, options, [&](std::string_view t) { streamed += t; });
  const size_t at = expected_text.find("Lily");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(r.reason, StopReason::StopString);
  EXPECT_EQ(r.text, expected_text.substr(0, at));
  EXPECT_EQ(streamed, r.text);
}

TEST(Generator, ReusesTheCachedPrefix) {
  KILN_STORIES_CASE();
  Stories s(model_path);
  Generator gen(*s.model, *s.tokenizer, 256);
  Sampler sampler(greedy());
  const GenerationResult first = gen.generate(prompt, sampler, {.max_tokens = 20});
  // The next prompt extends what the cache holds: only the new tokens are run.
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), first.tokens.begin(), first.tokens.end());
  const GenerationResult second = gen.generate(longer, sampler, {.max_tokens = 80});
  EXPECT_EQ(second.stats.n_reused, int(prompt.size() + first.tokens.size() - 1));
  EXPECT_EQ(second.stats.n_prompt, 1);
  std::vector<int32_t> all = first.tokens;
  all.insert(all.end(), second.tokens.begin(), second.tokens.end());
  EXPECT_EQ(all, expected_ids);
  // A prompt that departs from the cache is cut back to the common part.
  const GenerationResult again = gen.generate(prompt, sampler, {.max_tokens = 100});
  EXPECT_EQ(again.stats.n_reused, int(prompt.size()) - 1);
  EXPECT_EQ(again.tokens, expected_ids);
}

TEST(Generator, StopsWhenTheContextIsFull) {
  KILN_STORIES_CASE();
  Stories s(model_path);
  Generator gen(*s.model, *s.tokenizer, 20);
  Sampler sampler(greedy());
  const GenerationResult r = gen.generate(prompt, sampler, {});
  EXPECT_EQ(r.reason, StopReason::ContextFull);
  EXPECT_EQ(gen.cached_tokens().size(), 20u);
  EXPECT_EQ(r.tokens.size(), 20 - prompt.size() + 1);  // the last one sampled but not run
  std::vector<int32_t> too_long(21, prompt[1]);
  EXPECT_THROW(gen.generate(too_long, sampler, {}), Error);
}

// The default cache (f16) and an f32 one.
TEST(KilnRun, GreedyTextMatchesLlamaCpp) {
  KILN_REQUIRE_KILN_BINARY();
  KILN_STORIES_CASE();
  for (const char* cache : {"", " --cache-type f32"}) {
    const Captured r = run_kiln_stdout("run -m " + quote(model_path.string()) + " -p " +
                                       quote(ref["prompt"].get<std::string>()) + " --temp 0 -n 100 -t 1" + cache);
    EXPECT_EQ(r.exit_code, 0) << cache;
    EXPECT_EQ(r.out, expected_text) << cache;
  }
}

TEST(KilnRun, RefusesAnUnknownCacheType) {
  KILN_REQUIRE_KILN_BINARY();
  KILN_REQUIRE_TESTDATA(model_path, "models/stories260K.gguf");
  const Captured r = run_kiln_stdout("run -m " + quote(model_path.string()) + " -p Hi -n 1 --cache-type q8_0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
}

TEST(KilnRun, RefusesAContextThatDoesNotFit) {
  KILN_REQUIRE_KILN_BINARY();
  KILN_REQUIRE_TESTDATA(model_path, "models/stories260K.gguf");
  const Captured r = run_kiln_stdout("run -m " + quote(model_path.string()) + " -p Hi -c 2000000000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
}

TEST(KilnChat, ScriptedConversationOnStdin) {
  KILN_REQUIRE_KILN_BINARY();
  KILN_REQUIRE_TESTDATA(model_path, "models/stories260K.gguf");
  // stories260K has no chat template: the plain transcript fallback is used. Two turns,
  // a reset, a third turn equal to the first: greedy, so its reply equals the first's.
  const Captured r = run_kiln_stdout("chat -m " + quote(model_path.string()) + " --temp 0 -n 12 -t 1",
                                     "Hello\nTell me more\n/reset\nHello\n/exit\nignored\n");
  EXPECT_EQ(r.exit_code, 0);
  std::vector<std::string> replies;
  size_t start = 0;
  for (size_t nl; (nl = r.out.find('\n', start)) != std::string::npos; start = nl + 1)
    replies.push_back(r.out.substr(start, nl - start));
  ASSERT_EQ(replies.size(), 3u) << r.out;
  EXPECT_FALSE(replies[0].empty());
  EXPECT_EQ(replies[0], replies[2]);
}

}  // namespace
}  // namespace kiln::testing
