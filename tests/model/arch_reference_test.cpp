// Each architecture's tiny random model (GGUF written by llama.cpp's converter) against
// the logits and greedy continuations of HF transformers (testdata/arch/*.ref.json):
// logits of every reference position from one prefill pass, relative L2 error <= 1e-4
// per position (float32 engine vs float32 reference); greedy decoding through the KV
// cache (and the recurrent state of the hybrids) equal to HF generate's ids. The hybrid
// architectures' own checks are in hybrid_reference_test.cpp.
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
  const ReferenceLogits want = read_reference_logits(ref, logits_path);
  ASSERT_EQ(int64_t(want.values.size()), want.rows * want.vocab);

  LoadedModel m(gguf_path);
  ASSERT_EQ(m.vocab(), want.vocab);
  const double worst = expect_prefill_matches(*m.model, *m.backend, to_ids(ref["ids"]), want, 1e-4, name);
  std::printf("[ %s ] max relative L2 error over %lld positions: %.3g\n", name.c_str(), (long long)want.rows, worst);
}

TEST_P(ArchReference, GreedyDecodeMatchesTransformers) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  LoadedModel m(gguf_path);
  const int matched = expect_greedy_matches(*m.model, *m.backend, ref, name);
  std::printf("[ %s ] greedy: %d of %zu tokens match\n", name.c_str(), matched, ref["greedy_continuation_ids"].size());
}

INSTANTIATE_TEST_SUITE_P(Arch, ArchReference,
                         ::testing::Values("llama", "llama31-ropescale", "qwen2", "qwen3", "qwen3moe", "mixtral",
                                           "gemma2", "qwen3next", "qwen35", "gptoss"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace kiln::testing
