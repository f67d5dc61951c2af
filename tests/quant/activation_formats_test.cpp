// The activation formats of the CPU dot products (q8_0, q8_1, q8_K), checked against their
// definitions: every level is round(x * (1/d)) with d = absmax / 127, and the side sums
// (q8_1's s, q8_K's bsums) equal the sums of the stored levels. Also the read-only plain
// types (f64, i8..i64).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace kiln {
namespace {

std::vector<float> random_values(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

TEST(ActivationFormats, Q8_1LevelsAndSum) {
  const int n = 96;  // 3 blocks
  const std::vector<float> x = random_values(n, 1);
  std::vector<BlockQ8_1> blocks(n / 32);
  quantize_row(GgmlType::Q8_1, x.data(), blocks.data(), n);
  for (int b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
    const float d = amax / 127, id = 1.0f / d;
    ASSERT_EQ(blocks[b].d, f32_to_f16(d)) << "block " << b;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      ASSERT_EQ(blocks[b].qs[j], int(std::round(x[32 * b + j] * id)))
          << "block " << b << " value " << j << " x " << x[32 * b + j];
      sum += blocks[b].qs[j];
    }
    EXPECT_EQ(blocks[b].s, f32_to_f16(float(sum) * d)) << "block " << b;
  }
}

TEST(ActivationFormats, Q8_KLevelsAndBlockSums) {
  const int n = 512;
  const std::vector<float> x = random_values(n, 2);
  std::vector<BlockQ8_K> blocks(n / 256);
  quantize_row(GgmlType::Q8_K, x.data(), blocks.data(), n);
  std::vector<float> back(n);
  dequantize_row_reference(GgmlType::Q8_K, blocks.data(), back.data(), n);
  for (int b = 0; b < n / 256; ++b) {
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += blocks[b].qs[16 * g + j];
      EXPECT_EQ(blocks[b].bsums[g], sum) << "block " << b << " group " << g;
    }
    for (int j = 0; j < 256; ++j) {
      EXPECT_GE(blocks[b].qs[j], -127);
      // Round trip within half a level.
      EXPECT_LE(std::fabs(back[256 * b + j] - x[256 * b + j]), std::fabs(blocks[b].d) * 0.5f + 1e-6f)
          << "value " << 256 * b + j;
    }
  }
}

TEST(PlainTypes, ConvertLikeCpp) {
  const double f64[3] = {1.5, -2.25e10, 1e-300};
  const int8_t i8[3] = {-128, 0, 127};
  const int16_t i16[3] = {-32768, 7, 32767};
  const int32_t i32[3] = {-2147483647, 16777217, 5};
  const int64_t i64[3] = {-(int64_t(1) << 62), 3, 9007199254740993};
  float out[3];
  dequantize_row(GgmlType::F64, f64, out, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], float(f64[i])) << i;
  dequantize_row(GgmlType::I8, i8, out, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], float(i8[i])) << i;
  dequantize_row(GgmlType::I16, i16, out, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], float(i16[i])) << i;
  dequantize_row(GgmlType::I32, i32, out, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], float(i32[i])) << i;
  dequantize_row(GgmlType::I64, i64, out, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], float(i64[i])) << i;
  EXPECT_FALSE(can_quantize(GgmlType::F64));
  EXPECT_THROW(quantize_row(GgmlType::I32, out, nullptr, 3), Error);
}

}  // namespace
}  // namespace kiln
