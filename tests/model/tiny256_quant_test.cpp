// A random llama quantized by llama-quantize to mixed per-tensor types, against
// llama.cpp's logits. llama.cpp quantizes activations in its dot products and keeps an
// f16 cache, so the bound is loose: relative L2 <= 5e-2 per position and the same argmax
// on at least 15 of the 16 positions.
#include <gtest/gtest.h>

#include <string>

#include "model_test_util.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

class Tiny256 : public ::testing::TestWithParam<std::string> {};

TEST_P(Tiny256, LogitsMatchLlamaCpp) {
  const std::string type = GetParam();
  KILN_REQUIRE_TESTDATA(gguf_path, "quant/models/tiny256-" + type + ".gguf");
  KILN_REQUIRE_TESTDATA(logits_path, "quant/models/tiny256-" + type + ".llamacpp-logits.f32");
  KILN_REQUIRE_TESTDATA(ids_path, "quant/models/ids.json");
  const nlohmann::json meta = read_json(ids_path);
  const std::vector<float> expected = read_f32_file(logits_path);
  const int64_t rows = meta["logits_shape"][0], vocab = meta["logits_shape"][1];
  LoadedModel m(gguf_path);
  const std::vector<float> logits = m.prefill_logits(to_ids(meta["ids"]));
  ASSERT_EQ(logits.size(), expected.size());
  double worst = 0;
  int same_argmax = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* ours = logits.data() + r * vocab;
    const float* theirs = expected.data() + r * vocab;
    const double err = relative_l2(ours, theirs, vocab);
    worst = std::max(worst, err);
    EXPECT_LE(err, 5e-2) << type << " position " << r;
    same_argmax += argmax_row(ours, vocab) == argmax_row(theirs, vocab);
  }
  EXPECT_GE(same_argmax, rows - 1) << type;
  std::printf("[ tiny256-%s ] max relative L2 %.3g, argmax agrees on %d of %lld\n", type.c_str(), worst,
              same_argmax, (long long)rows);
}

INSTANTIATE_TEST_SUITE_P(Types, Tiny256,
                         ::testing::Values("F16", "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K",
                                           "IQ4_NL", "IQ4_XS"));

}  // namespace
}  // namespace kiln::testing
