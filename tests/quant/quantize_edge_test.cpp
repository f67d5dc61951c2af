// Quantizers on awkward inputs: all-zero rows, tiny and huge magnitudes, with and without
// an importance vector. The round trip must stay finite (no NaN or inf) and zero rows must
// come back as zeros. Also checks that an importance vector lowers the weighted error it
// is meant to lower.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "quant/quant.h"
#include "quant/zoo.h"

namespace kiln {
namespace {

std::vector<GgmlType> quantizable_types() { return testing::types_where(can_quantize); }

// One row of n values: a mix of signs and sizes scaled by `magnitude`.
std::vector<float> random_row(int64_t n, float magnitude, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(n));
  for (float& v : row) v = normal(rng) * magnitude;
  return row;
}

std::vector<float> round_trip(GgmlType type, const std::vector<float>& row, const float* importance) {
  const int64_t n = int64_t(row.size());
  std::vector<uint8_t> bytes(*row_bytes(type, n));
  std::vector<float> back(row.size());
  quantize_row(type, row.data(), bytes.data(), n, importance);
  dequantize_row_reference(type, bytes.data(), back.data(), n);
  return back;
}

class QuantizeEdges : public ::testing::TestWithParam<GgmlType> {};

TEST_P(QuantizeEdges, ZeroRowsComeBackZero) {
  const GgmlType type = GetParam();
  const int64_t n = 512;
  const std::vector<float> zeros(n, 0.0f), importance(n, 1.0f);
  for (const float* imp : {static_cast<const float*>(nullptr), importance.data()}) {
    const std::vector<float> back = round_trip(type, zeros, imp);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(back[i], 0.0f) << type_name(type) << (imp ? " (importance)" : "") << " at " << i;
  }
}

TEST_P(QuantizeEdges, TinyAndHugeStayFinite) {
  const GgmlType type = GetParam();
  const int64_t n = 512;
  std::vector<float> importance = random_row(n, 1.0f, 99);
  for (float& w : importance) w = std::fabs(w) + 0.01f;
  // From below f32's normal range to values whose scales still fit in f16 (ggml's limit
  // for f16-scaled formats is about 6.5e4 times the format's largest level).
  for (const float magnitude : {1e-38f, 1e-30f, 1e-8f, 1e-3f, 1.0f, 1e3f, 1e4f}) {
    const std::vector<float> row = random_row(n, magnitude, 7);
    for (const float* imp : {static_cast<const float*>(nullptr), static_cast<const float*>(importance.data())}) {
      const std::vector<float> back = round_trip(type, row, imp);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_TRUE(std::isfinite(back[i])) << type_name(type) << " magnitude " << magnitude
                                            << (imp ? " (importance)" : "") << ": value " << i << " is "
                                            << back[i] << " (input " << row[i] << ")";
    }
  }
}

// Importance-weighted error sum(w * (x - q)^2) with the importance given should not be
// worse than without (2% slack: the searches are heuristics).
TEST_P(QuantizeEdges, ImportanceLowersWeightedError) {
  const GgmlType type = GetParam();
  const int64_t n = 1024;
  const std::vector<float> row = random_row(n, 1.0f, 3);
  std::vector<float> importance = random_row(n, 1.0f, 4);
  for (float& w : importance) w = w * w * w * w + 1e-3f;  // heavy-tailed, positive
  auto weighted_error = [&](const std::vector<float>& back) {
    double e = 0;
    for (int64_t i = 0; i < n; ++i) e += importance[i] * (double(back[i]) - row[i]) * (double(back[i]) - row[i]);
    return e;
  };
  const double plain = weighted_error(round_trip(type, row, nullptr));
  const double weighted = weighted_error(round_trip(type, row, importance.data()));
  EXPECT_LE(weighted, plain * 1.02) << type_name(type);
}

INSTANTIATE_TEST_SUITE_P(AllQuantizable, QuantizeEdges, ::testing::ValuesIn(quantizable_types()),
                         [](const auto& info) { return std::string(type_name(info.param)); });

}  // namespace
}  // namespace kiln
