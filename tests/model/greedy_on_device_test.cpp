// Greedy decoding with the tokens kept on the backend (Model::forward_greedy): every
// architecture's reference continuation from HF transformers' generate, token for token,
// with the host queuing each step before it reads the previous one's token.
#include <gtest/gtest.h>

#include <string>

#include "model_test_util.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

class GreedyOnDevice : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyOnDevice, MatchesTransformersGenerate) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  LoadedModel m(gguf_path);
  const std::vector<int32_t> expected = to_ids(ref["greedy_continuation_ids"]);
  const std::vector<int32_t> got =
      greedy_decode_on_device(*m.model, *m.backend, to_ids(ref["greedy_prompt_ids"]), int(expected.size()));
  expect_same_tokens(got, expected, name);
  EXPECT_EQ(m.model->pending_greedy(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Arch, GreedyOnDevice,
                         ::testing::Values("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gptoss", "qwen3next"),
                         [](const auto& info) { return info.param; });

// Misuse is an error, not wrong output: feeding back a step that did not happen.
TEST(GreedyOnDeviceErrors, FeedBackWithoutPreviousStepIsRefused) {
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/llama.gguf");
  LoadedModel m(gguf_path);
  KvCache cache(*m.backend, m.model->cache_config(64));
  const int seq = cache.add_sequence();
  Batch batch;
  batch.add(-1, 0, seq, true);
  batch.add(-1, 1, seq, true);
  EXPECT_THROW(m.model->forward_greedy(batch, cache, /*feed_back=*/true), Error);
  EXPECT_THROW(m.model->take_greedy(), Error);
}

}  // namespace
}  // namespace kiln::testing
