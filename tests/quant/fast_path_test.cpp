// Every type's dequantize_row (the SIMD path where the processor has one) against its
// scalar reference, on random bytes (so scales cover subnormals, infinities and NaNs too)
// at awkward block counts. Identical bits are required; NaNs only need to be NaN on both
// sides (payloads may differ).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <string>

#include "core/cpu_features.h"
#include "quant/codec.h"
#include "quant/quant.h"
#include "quant/zoo.h"

namespace kiln {
namespace {

std::vector<GgmlType> types_with_codecs() {
  std::vector<GgmlType> out;
  size_t count;
  const TypeTraits* all = all_types(&count);
  for (size_t i = 0; i < count; ++i)
    if (find_codec(all[i].type)) out.push_back(all[i].type);
  return out;
}

class FastPath : public ::testing::TestWithParam<GgmlType> {};

TEST_P(FastPath, MatchesReferenceOnRandomBlocks) {
  const GgmlType type = GetParam();
  const RowCodec* codec = find_codec(type);
  if (!codec->dequantize_fast) GTEST_SKIP() << type_name(type) << ": no fast path on this processor";
  const TypeTraits& t = traits(type);
  std::mt19937 rng(uint32_t(t.type) * 7919u + 1);
  for (const int64_t blocks : {1, 3, 7, 19, 64}) {
    const int64_t n = blocks * t.block_size;
    std::vector<uint8_t> bytes(*row_bytes(type, n));
    for (uint8_t& b : bytes) b = uint8_t(rng());
    std::vector<float> ref(n), fast(n);
    dequantize_row_reference(type, bytes.data(), ref.data(), n);
    dequantize_row(type, bytes.data(), fast.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const bool same = std::bit_cast<uint32_t>(ref[i]) == std::bit_cast<uint32_t>(fast[i]) ||
                        (std::isnan(ref[i]) && std::isnan(fast[i]));
      ASSERT_TRUE(same) << type_name(type) << ", " << blocks << " blocks: value " << i << " (block "
                        << i / t.block_size << ", element " << i % t.block_size << "): reference " << ref[i]
                        << ", fast " << fast[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, FastPath, ::testing::ValuesIn(types_with_codecs()),
                         [](const auto& info) { return std::string(type_name(info.param)); });

// The types promised a fast path have one wherever AVX2 is available, so the test above
// is not silently skipping them.
TEST(FastPath, PresentForTheMainTypesWithAvx2) {
  if (!cpu_features().avx2) GTEST_SKIP() << "no AVX2 on this processor (or KILN_SIMD=scalar)";
  for (const GgmlType type : {GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                              GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                              GgmlType::Q6_K, GgmlType::MXFP4, GgmlType::NVFP4})
    EXPECT_NE(find_codec(type)->dequantize_fast, nullptr) << type_name(type);
}

}  // namespace
}  // namespace kiln
