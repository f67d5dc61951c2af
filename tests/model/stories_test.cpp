// stories260K (a real trained tiny llama, F32) against llama.cpp: greedy text of five
// prompts (100 tokens each, llama.cpp with an f32 KV cache), and the
// logits of 16 positions (llama.cpp with its default f16 cache: bound 2e-3 relative).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "model_test_util.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

// Decodes greedily and compares with llama.cpp token by token. A difference is accepted
// only at a near-tie: where our logit for llama.cpp's token is within 2e-4 (relative) of
// our top logit — there the two float32 engines may legitimately round to different
// winners (our choice agrees with a double-precision run). The texts diverge after such a
// token, so the comparison of that prompt stops there; it must be reported, never silent.
TEST(Stories260K, GreedyMatchesLlamaCpp) {
  KILN_REQUIRE_TESTDATA(gguf_path, "models/stories260K.gguf");
  KILN_REQUIRE_TESTDATA(greedy_path, "models/stories260K.greedy.jsonl");
  LoadedModel m(gguf_path);
  std::ifstream in(greedy_path);
  std::string line;
  int prompts = 0, exact = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::vector<int32_t> expected = to_ids(j["ids"]);
    const std::vector<int32_t> got = m.greedy(to_ids(j["prompt_ids"]), int(expected.size()));
    ++prompts;
    size_t first_bad = 0;
    while (first_bad < expected.size() && got[first_bad] == expected[first_bad]) ++first_bad;
    if (first_bad == expected.size()) {
      ++exact;
      continue;
    }
    // Our logits at the step that differs.
    std::vector<int32_t> context = to_ids(j["prompt_ids"]);
    context.insert(context.end(), expected.begin(), expected.begin() + std::ptrdiff_t(first_bad));
    const std::vector<float> logits = m.prefill_logits(context, 256);
    const float* row = logits.data() + (context.size() - 1) * size_t(m.vocab());
    const float ours = row[got[first_bad]], theirs = row[expected[first_bad]];
    const double gap = (double(ours) - theirs) / std::abs(double(ours));
    std::printf("[ stories260K ] prompt '%s': token %zu is %d, llama.cpp has %d; our logits %.6f vs %.6f "
                "(relative gap %.2g)\n",
                j["prompt"].get<std::string>().c_str(), first_bad, got[first_bad], expected[first_bad], ours, theirs,
                gap);
    EXPECT_LE(gap, 2e-4) << "prompt '" << j["prompt"].get<std::string>() << "': token " << first_bad << " ours "
                         << got[first_bad] << " llama.cpp " << expected[first_bad] << " is not a near-tie";
  }
  EXPECT_EQ(prompts, 5);
  std::printf("[ stories260K ] %d of %d prompts reproduce all 100 tokens exactly\n", exact, prompts);
}

TEST(Stories260K, LogitsMatchLlamaCpp) {
  KILN_REQUIRE_TESTDATA(gguf_path, "models/stories260K.gguf");
  KILN_REQUIRE_TESTDATA(meta_path, "models/stories260K.logits.json");
  KILN_REQUIRE_TESTDATA(logits_path, "models/stories260K.logits.f32");
  const nlohmann::json meta = read_json(meta_path);
  const ReferenceLogits want = read_reference_logits(meta, logits_path);
  LoadedModel m(gguf_path);
  const std::vector<float> logits = m.prefill_logits(to_ids(meta["ids"]));
  ASSERT_EQ(logits.size(), want.values.size());
  const double worst = expect_logits_match(logits, want, 2e-3, "stories260K vs llama.cpp");
  std::printf("[ stories260K ] max relative L2 error vs llama.cpp: %.3g\n", worst);
}

}  // namespace
}  // namespace kiln::testing
