// A random llama quantized by llama-quantize to mixed per-tensor types, against
// llama.cpp's logits. kiln's CPU matmuls quantize activations exactly as llama.cpp's do (the
// same q8_0 / q8_1 / q8_K bytes for each weight type; backend/cpu/matmul_q8.h), so the two
// engines' matmuls differ only by float summation order. What is left comes from the other
// ops — llama.cpp keeps an f16 KV cache and rounds q, k and v to f16 in attention, kiln's
// test helper an f32 cache — and is amplified by the activation quantization: an input that
// moves by a tiny delta flips the rounding of the elements within delta of a level
// boundary, so quantized models differ by ~sqrt(delta * step) per matmul where the F16
// file differs by delta. Measured with this file's cache (f32): F16 6.6e-4, quantized
// types 1.3e-2 .. 2.3e-2 relative L2 (Q4_K_M .. IQ4_XS were ~3.1e-2 with kiln's former
// per-32 f32-scale activations).
//
// Bounds: relative L2 per position <= 1e-3 (F16) / 3e-2 (quantized types); the same
// argmax as llama.cpp on at least 15 of the 16 positions, with no allowance for near-ties
// — except Q4_0, whose position 5 has two winners 0.01 apart (2.4x the rms difference of
// the engines): 14 of 16 with the f32 cache. Rounding k, v and q to f16 as llama.cpp does
// (an experiment) gives Q4_0 15 of 16 and every other type 15 or 16: raise Q4_0's bar when
// the test helper gets an f16 cache.
#include <gtest/gtest.h>

#include <cmath>
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
  const ReferenceLogits want = read_reference_logits(meta, logits_path);
  const std::vector<float>& expected = want.values;
  const int64_t rows = want.rows, vocab = want.vocab;
  LoadedModel m(gguf_path);
  const std::vector<float> logits = m.prefill_logits(to_ids(meta["ids"]));
  ASSERT_EQ(logits.size(), expected.size());
  const double bound = type == "F16" ? 1e-3 : 3e-2;
  const double worst = expect_logits_match(logits, want, bound, type);
  int same_argmax = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* ours = logits.data() + r * vocab;
    const float* theirs = expected.data() + r * vocab;
    const int32_t a = argmax_row(ours, vocab), b = argmax_row(theirs, vocab);
    if (a == b) {
      ++same_argmax;
      continue;
    }
    double diff_sq = 0;
    for (int64_t i = 0; i < vocab; ++i) diff_sq += (double(ours[i]) - theirs[i]) * (double(ours[i]) - theirs[i]);
    std::printf("[ tiny256-%s ] position %lld: argmax %d (ours) vs %d (llama.cpp); our logits differ by %.4f, "
                "engine difference (rms) %.4f\n",
                type.c_str(), (long long)r, a, b, double(ours[a]) - ours[b], std::sqrt(diff_sq / double(vocab)));
  }
  const int64_t min_agree = type == "Q4_0" ? rows - 2 : rows - 1;
  EXPECT_GE(same_argmax, min_agree) << type << ": argmax agrees with llama.cpp on too few positions";
  std::printf("[ tiny256-%s ] max relative L2 %.3g, argmax agrees on %d of %lld\n", type.c_str(), worst,
              same_argmax, (long long)rows);
}

INSTANTIATE_TEST_SUITE_P(Types, Tiny256,
                         ::testing::Values("F16", "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K",
                                           "IQ4_NL", "IQ4_XS"));

}  // namespace
}  // namespace kiln::testing
