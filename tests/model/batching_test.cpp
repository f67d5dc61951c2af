// Several sequences in one batch, prefill split into chunks, and a cache with small
// blocks must give the same logits as each sequence run alone in one pass.
#include <gtest/gtest.h>

#include "model_test_util.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

TEST(Batching, MixedSequencesMatchSeparateRuns) {
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/qwen3.gguf");
  LoadedModel m(gguf_path);
  const int V = m.vocab();
  const std::vector<int32_t> a = {5, 77, 300, 12, 9, 410, 33, 2, 101, 250, 7}, b = {400, 3, 18, 96, 222, 5, 64};
  const std::vector<float> ref_a = m.prefill_logits(a), ref_b = m.prefill_logits(b);

  // Blocks of 4 tokens; sequence 1 starts while sequence 0 is mid-prefill.
  KvCache cache(*m.backend, m.model->cache_config(32, 2, 4));
  const int s0 = cache.add_sequence(), s1 = cache.add_sequence();
  std::vector<float> got_a(ref_a.size()), got_b(ref_b.size());
  size_t ia = 0, ib = 0;
  const int steps[][2] = {{5, 0}, {3, 4}, {1, 2}, {2, 1}};  // tokens of a, b per pass
  for (const auto& step : steps) {
    Batch batch;
    std::vector<std::pair<float*, size_t>> rows;
    for (int i = 0; i < step[0]; ++i, ++ia) {
      batch.add(a[ia], int32_t(ia), s0, true);
      rows.push_back({got_a.data(), ia});
    }
    for (int i = 0; i < step[1]; ++i, ++ib) {
      batch.add(b[ib], int32_t(ib), s1, true);
      rows.push_back({got_b.data(), ib});
    }
    const std::vector<float> logits = m.model->forward(batch, cache);
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy_n(logits.begin() + std::ptrdiff_t(r * size_t(V)), V, rows[r].first + rows[r].second * size_t(V));
  }
  ASSERT_EQ(ia, a.size());
  ASSERT_EQ(ib, b.size());
  expect_rows_near(got_a.data(), ref_a.data(), int64_t(a.size()), V, 1e-5, "sequence 0");
  expect_rows_near(got_b.data(), ref_b.data(), int64_t(b.size()), V, 1e-5, "sequence 1");
}

TEST(Loading, UnknownTensorIsAnError) {
  // The llama weight table does not list qwen3's q/k norms: loading a qwen3 file as llama
  // must fail naming such a tensor rather than silently ignore it.
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/qwen3.gguf");
  auto file = gguf::File::open(gguf_path.string());
  const Architecture* llama = find_architecture("llama");
  ASSERT_NE(llama, nullptr);
  CpuBackend backend(1);
  HParams hp = HParams::from_gguf(*file);
  try {
    load_weights(*file, backend, hp, llama->global_weights, llama->layer_weights);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("_norm.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::testing
