// Every SIMD dequantizer, at each instruction-set level the processor has (AVX2, AVX-512),
// against its scalar reference, on random bytes (so scales cover subnormals, infinities and
// NaNs too) at awkward block counts and misaligned source and output pointers. Identical
// bits are required; NaNs only need to be NaN on both sides (payloads may differ: F16C
// quiets signaling NaNs, and an XOR sign flip and a multiply by -1 treat a NaN's sign
// differently).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <string>

#include "core/cpu_features.h"
#include "quant/codec.h"
#include "quant/fast_paths.h"
#include "quant/quant.h"
#include "quant/zoo.h"

namespace kiln {
namespace {

std::vector<GgmlType> types_with_codecs() {
  return testing::types_where([](GgmlType t) { return find_codec(t) != nullptr; });
}

const char* level_name(SimdLevel level) {
  return level == SimdLevel::Avx512 ? "avx512" : level == SimdLevel::Avx2 ? "avx2" : "scalar";
}

bool level_available(SimdLevel level) {
  const CpuFeatures& cpu = cpu_features();
  return level == SimdLevel::Avx512 ? cpu.avx512 : level == SimdLevel::Avx2 ? cpu.avx2 : true;
}

// Runs `kernel` and the reference of `type` on the same random bytes and reports the first
// mismatches with their block, element and both values.
void expect_matches_reference(GgmlType type, DequantizeFn kernel, const char* what) {
  const RowCodec* codec = find_codec(type);
  const TypeTraits& t = traits(type);
  std::mt19937 rng(uint32_t(t.type) * 7919u + 1);
  for (const int64_t blocks : {1, 3, 7, 19, 64}) {
    for (const int misalign : {0, 1, 3}) {
      const int64_t n = blocks * t.block_size;
      std::vector<uint8_t> bytes(*row_bytes(type, n) + misalign);
      for (uint8_t& b : bytes) b = uint8_t(rng());
      std::vector<float> ref(n), fast(n + misalign);
      codec->dequantize_reference(bytes.data() + misalign, ref.data(), n);
      kernel(bytes.data() + misalign, fast.data() + misalign, n);
      int mismatches = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float got = fast[i + misalign];
        const bool same = std::bit_cast<uint32_t>(ref[i]) == std::bit_cast<uint32_t>(got) ||
                          (std::isnan(ref[i]) && std::isnan(got));
        if (same || ++mismatches > 5) continue;
        ADD_FAILURE() << type_name(type) << " " << what << ", " << blocks << " blocks, misalign " << misalign
                      << ": value " << i << " (block " << i / t.block_size << ", element " << i % t.block_size
                      << "): reference " << ref[i] << " (0x" << std::hex << std::bit_cast<uint32_t>(ref[i])
                      << "), fast " << got << " (0x" << std::bit_cast<uint32_t>(got) << std::dec << ")";
      }
      ASSERT_EQ(mismatches, 0) << type_name(type) << " " << what << ": " << blocks << " blocks, misalign "
                               << misalign;
    }
  }
}

class FastPath : public ::testing::TestWithParam<GgmlType> {};

// The kernel of each level, called directly.
TEST_P(FastPath, EachLevelMatchesReferenceOnRandomBlocks) {
  const GgmlType type = GetParam();
  int tested = 0;
  for (const SimdLevel level : {SimdLevel::Avx2, SimdLevel::Avx512}) {
    const DequantizeFn kernel = fast_dequantizer_at(type, level);
    if (!kernel) continue;
    expect_matches_reference(type, kernel, level_name(level));
    ++tested;
  }
  if (tested == 0) GTEST_SKIP() << type_name(type) << ": no SIMD kernel on this processor";
}

// What dequantize_row picks (the widest level) also matches.
TEST_P(FastPath, DispatchedPathMatchesReference) {
  const GgmlType type = GetParam();
  const RowCodec* codec = find_codec(type);
  if (!codec->dequantize_fast) GTEST_SKIP() << type_name(type) << ": no fast path on this processor";
  expect_matches_reference(type, codec->dequantize_fast, "dispatched");
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, FastPath, ::testing::ValuesIn(types_with_codecs()),
                         [](const auto& info) { return std::string(type_name(info.param)); });

// The types promised a fast path have one at each level the processor has, so the tests
// above are not silently skipping them.
TEST(FastPathCoverage, AllQuantizedTypesHaveAvx2) {
  if (!cpu_features().avx2) GTEST_SKIP() << "no AVX2 on this processor (or KILN_SIMD=scalar)";
  for (const GgmlType type : types_with_codecs()) {
    if (!traits(type).is_quantized && type != GgmlType::F16 && type != GgmlType::BF16) continue;
    if (type == GgmlType::Q8_K) continue;  // an activation format, never stored in a model
    EXPECT_NE(fast_dequantizer_at(type, SimdLevel::Avx2), nullptr) << type_name(type);
  }
}

TEST(FastPathCoverage, HotTypesHaveAvx512) {
  if (!cpu_features().avx512) GTEST_SKIP() << "no AVX-512 on this processor (or KILN_SIMD caps it)";
  for (const GgmlType type : {GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q2_K,
                              GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL,
                              GgmlType::IQ4_XS, GgmlType::MXFP4})
    EXPECT_NE(fast_dequantizer_at(type, SimdLevel::Avx512), nullptr) << type_name(type);
}

// dequantize_row uses the widest level available: AVX-512 where a kernel exists, else AVX2.
TEST(FastPathCoverage, DispatchPicksTheWidestLevel) {
  for (const GgmlType type : types_with_codecs()) {
    const DequantizeFn widest = fast_dequantizer_at(type, SimdLevel::Avx512)
                                    ? fast_dequantizer_at(type, SimdLevel::Avx512)
                                    : fast_dequantizer_at(type, SimdLevel::Avx2);
    EXPECT_EQ(find_codec(type)->dequantize_fast, widest) << type_name(type);
  }
}

TEST(FastPathCoverage, NoKernelAtLevelsTheProcessorLacks) {
  for (const SimdLevel level : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512}) {
    if (level != SimdLevel::Scalar && level_available(level)) continue;
    for (const GgmlType type : types_with_codecs())
      EXPECT_EQ(fast_dequantizer_at(type, level), nullptr) << type_name(type) << " at " << level_name(level);
  }
}

}  // namespace
}  // namespace kiln
