// f16/bf16 conversions against the processor's own conversion instructions (F16C) over
// every half value and a sweep of floats, and against hand-checked IEEE values.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <random>

#include "core/cpu_features.h"
#include "core/half.h"

namespace kiln {
namespace {

__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float f) {
  return uint16_t(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

TEST(Half, KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_FLOAT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
}

TEST(Half, AllHalvesMatchHardware) {
  if (!cpu_features().avx2) GTEST_SKIP() << "no F16C on this processor";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = hw_f16_to_f32(uint16_t(h));
    const float got = f16_to_f32(uint16_t(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "half " << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << "half " << h;
    }
  }
}

TEST(Half, FloatsRoundLikeHardware) {
  if (!cpu_features().avx2) GTEST_SKIP() << "no F16C on this processor";
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t bits = rng();
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), hw_f32_to_f16(f)) << "float bits 0x" << std::hex << bits;
  }
}

}  // namespace
}  // namespace kiln
