// Each architecture's tiny random model (GGUF written by llama.cpp's converter) against
// the logits and greedy continuations of HF transformers (testdata/arch/*.ref.json):
// logits of every reference position from one prefill pass, relative L2 error <= 1e-4
// per position (float32 engine with an f32 KV cache vs float32 reference); greedy decoding
// through the KV cache (and the recurrent state of the hybrids) equal to HF generate's ids.
// The same with the f16 KV cache (kiln's default on the command line): logits within 1e-3
// relative L2 (f16 rounding of K, V and Q), greedy ids still equal. The hybrid
// architectures' own checks are in hybrid_reference_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "model_test_util.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

class ArchReference : public ::testing::TestWithParam<std::string> {};

void check_prefill(const std::string& name, GgmlType cache_type, double bound) {
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  KILN_REQUIRE_TESTDATA(logits_path, "arch/" + ref["logits_file"].get<std::string>());
  const ReferenceLogits want = read_reference_logits(ref, logits_path);
  ASSERT_EQ(int64_t(want.values.size()), want.rows * want.vocab);

  LoadedModel m(gguf_path);
  ASSERT_EQ(m.vocab(), want.vocab);
  const double worst = expect_prefill_matches(*m.model, *m.backend, to_ids(ref["ids"]), want, bound, name, cache_type);
  std::printf("[ %s ] %s cache: max relative L2 error over %lld positions: %.3g\n", name.c_str(),
              std::string(type_name(cache_type)).c_str(), (long long)want.rows, worst);
}

void check_greedy(const std::string& name, GgmlType cache_type) {
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  LoadedModel m(gguf_path);
  const int matched = expect_greedy_matches(*m.model, *m.backend, ref, name, cache_type);
  std::printf("[ %s ] %s cache: greedy: %d of %zu tokens match\n", name.c_str(),
              std::string(type_name(cache_type)).c_str(), matched, ref["greedy_continuation_ids"].size());
}

TEST_P(ArchReference, PrefillLogitsMatchTransformers) { check_prefill(GetParam(), GgmlType::F32, 1e-4); }
TEST_P(ArchReference, GreedyDecodeMatchesTransformers) { check_greedy(GetParam(), GgmlType::F32); }
TEST_P(ArchReference, PrefillLogitsWithF16CacheStayNearTransformers) {
  check_prefill(GetParam(), GgmlType::F16, 1e-3);
}
TEST_P(ArchReference, GreedyDecodeWithF16CacheMatchesTransformers) { check_greedy(GetParam(), GgmlType::F16); }

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
