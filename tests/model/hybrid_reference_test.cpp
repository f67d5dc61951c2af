// The hybrid (GatedDeltaNet) and gpt-oss architectures (testdata/arch/<name>.ref.json,
// GGUF written by llama.cpp's converter), what their recurrent state adds to the checks
// against HF transformers that arch_reference_test.cpp runs for them (one-pass logits of
// all 24 positions, greedy decoding of 16 tokens through the KV cache and the state):
//   - the same 24 positions fed in pieces (prefill 5, two decode steps, prefill the rest)
//     give the one-pass logits: state carried between calls, chunked vs recurrent forms;
//   - the generator's prefix reuse starts over or continues where it must.
#include <gtest/gtest.h>

#include <string>

#include "model_test_util.h"
#include "runtime/generator.h"
#include "tokenizer/tokenizer.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

class HybridReference : public ::testing::TestWithParam<std::string> {};

// Feeding the ids in pieces must reproduce the one-pass logits (bound 1e-5 relative L2:
// both are this engine; only the summation order of the chunked delta rule differs).
TEST_P(HybridReference, PiecewiseMatchesOnePass) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  const std::vector<int32_t> ids = to_ids(ref["ids"]);
  LoadedModel m(gguf_path);
  const int64_t vocab = m.vocab();
  const std::vector<float> one_pass = m.prefill_logits(ids);

  KvCache cache(*m.backend, m.model->cache_config(64, /*max_seqs=*/2));
  cache.add_sequence();  // sequence 0 stays empty: the state rows of sequence 1 are used
  const int seq = cache.add_sequence();
  std::vector<float> pieces;
  size_t next = 0;
  for (size_t count : {size_t(5), size_t(1), size_t(1), ids.size() - 7}) {
    Batch batch;
    for (size_t i = 0; i < count; ++i, ++next) batch.add(ids[next], int32_t(next), seq, true);
    const std::vector<float> l = m.model->forward(batch, cache);
    pieces.insert(pieces.end(), l.begin(), l.end());
  }
  ASSERT_EQ(pieces.size(), one_pass.size());
  expect_rows_near(pieces.data(), one_pass.data(), int64_t(ids.size()), vocab, 1e-5, name);
}

// The generator reuses a cached prefix. Recurrent state cannot be cut back, so a prompt
// that departs from the cache (or repeats it: the last token is always re-run) must
// start over, and one that extends the cache must continue from it.
TEST_P(HybridReference, GeneratorPrefixReuseKeepsLogits) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const std::vector<int32_t> ids = to_ids(read_json(ref_path)["ids"]);
  LoadedModel m(gguf_path);
  const int64_t vocab = m.vocab();
  const std::vector<float> one_pass = m.prefill_logits(ids);
  const Tokenizer tokenizer = Tokenizer::from_gguf(*m.file);
  Generator gen(*m.model, tokenizer, 64);
  const std::span<const int32_t> all(ids);
  for (size_t n : {size_t(12), size_t(12), size_t(6), size_t(20), size_t(9)}) {
    const std::span<const float> l = gen.prefill(all.first(n));
    const double err = relative_l2(l.data(), one_pass.data() + (n - 1) * size_t(vocab), vocab);
    EXPECT_LE(err, 1e-5) << name << " prefill of " << n << " tokens after " << gen.cached_tokens().size();
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, HybridReference, ::testing::Values("qwen3next", "qwen35", "gptoss"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln::testing
