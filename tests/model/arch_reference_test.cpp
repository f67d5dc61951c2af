// Each architecture's tiny random model (GGUF written by llama.cpp's converter) against
// the logits and greedy continuations of HF transformers (testdata/arch/*.ref.json).
// Bound: relative L2 error <= 1e-4 per position (float32 engine vs float32 reference).
#include <gtest/gtest.h>

#include <string>

#include "model_test_util.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

class ArchReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ArchReference, PrefillLogitsMatchTransformers) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  KILN_REQUIRE_TESTDATA(logits_path, "arch/" + ref["logits_file"].get<std::string>());
  const std::vector<float> expected = read_f32_file(logits_path);
  const int64_t rows = ref["logits_shape"][0], vocab = ref["logits_shape"][1];
  const int64_t first = ref["logits_first_position"];
  ASSERT_EQ(int64_t(expected.size()), rows * vocab);

  LoadedModel m(gguf_path);
  ASSERT_EQ(m.vocab(), vocab);
  const std::vector<int32_t> ids = to_ids(ref["ids"]);
  const std::vector<float> logits = m.prefill_logits(ids);
  ASSERT_EQ(int64_t(logits.size()), int64_t(ids.size()) * vocab);

  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* ours = logits.data() + (first + r) * vocab;
    const float* theirs = expected.data() + r * vocab;
    const double err = relative_l2(ours, theirs, vocab);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-4) << name << " position " << first + r << ": logit[0] ours " << ours[0] << " theirs "
                         << theirs[0] << ", argmax ours " << argmax_row(ours, vocab) << " theirs "
                         << argmax_row(theirs, vocab);
  }
  std::printf("[ %s ] max relative L2 error over %lld positions: %.3g\n", name.c_str(), (long long)rows, worst);
}

TEST_P(ArchReference, GreedyDecodeMatchesTransformers) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  const std::vector<int32_t> expected = to_ids(ref["greedy_continuation_ids"]);
  LoadedModel m(gguf_path);
  const std::vector<int32_t> got = m.greedy(to_ids(ref["greedy_prompt_ids"]), int(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_EQ(got[i], expected[i]) << name << " continuation token " << i;
}

INSTANTIATE_TEST_SUITE_P(Arch, ArchReference,
                         ::testing::Values("llama", "llama31-ropescale", "qwen2", "qwen3", "qwen3moe", "mixtral",
                                           "gemma2"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace kiln::testing
