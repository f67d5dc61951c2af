// stories260K (a real trained tiny llama, F32) against llama.cpp: greedy text of five
// prompts (100 tokens each) and the logits of 16 positions, both with an f16 KV cache.
//
// Why f16 is the faithful comparison: llama.cpp runs flash attention on the CPU by default,
// and its graph casts K and V to f16 before the flash-attention op even when the cache is
// f32 (the greedy references were made with an f32 cache, the logits with the default f16
// one); its CPU kernel then converts Q to f16 for the q.k dot products. So llama.cpp's
// attention sees K, V and Q rounded to f16 either way. kiln's f16 cache rounds the same
// three and keeps f32 sums (llama.cpp also sums the V rows in f16, which kiln does not
// copy). With an f32 cache one prompt ("Tom had a red ball.") parts from llama.cpp at
// token 21, a near-tie; with the f16 cache every token matches (measured at the AVX-512 and
// AVX2 levels; KILN_SIMD=scalar sums the matmuls in another order and lands on the other
// side of that near-tie).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "model_test_util.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

TEST(Stories260K, GreedyMatchesLlamaCpp) {
  KILN_REQUIRE_TESTDATA(gguf_path, "models/stories260K.gguf");
  KILN_REQUIRE_TESTDATA(greedy_path, "models/stories260K.greedy.jsonl");
  LoadedModel m(gguf_path, GgmlType::F16);
  std::ifstream in(greedy_path);
  std::string line;
  int prompts = 0, exact = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::vector<int32_t> expected = to_ids(j["ids"]);
    const std::vector<int32_t> got = m.greedy(to_ids(j["prompt_ids"]), int(expected.size()));
    ++prompts;
    exact += expect_same_tokens(got, expected, "prompt '" + j["prompt"].get<std::string>() + "'") ==
             int(expected.size());
  }
  EXPECT_EQ(prompts, 5);
  EXPECT_EQ(exact, prompts);
  std::printf("[ stories260K ] %d of %d prompts reproduce all 100 tokens exactly (f16 cache)\n", exact, prompts);
}

// Bound: 1e-3 relative L2 per position (measured with the f16 cache: 4.7e-4; the rest is
// llama.cpp's f16 sums of the V rows and its matmul order).
TEST(Stories260K, LogitsMatchLlamaCpp) {
  KILN_REQUIRE_TESTDATA(gguf_path, "models/stories260K.gguf");
  KILN_REQUIRE_TESTDATA(meta_path, "models/stories260K.logits.json");
  KILN_REQUIRE_TESTDATA(logits_path, "models/stories260K.logits.f32");
  const nlohmann::json meta = read_json(meta_path);
  const ReferenceLogits want = read_reference_logits(meta, logits_path);
  LoadedModel m(gguf_path, GgmlType::F16);
  const std::vector<float> logits = m.prefill_logits(to_ids(meta["ids"]));
  ASSERT_EQ(logits.size(), want.values.size());
  const double worst = expect_logits_match(logits, want, 1e-3, "stories260K vs llama.cpp");
  std::printf("[ stories260K ] max relative L2 error vs llama.cpp (f16 cache): %.3g\n", worst);
}

}  // namespace
}  // namespace kiln::testing
