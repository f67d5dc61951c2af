// The AVX2 dequantizers of iq4_nl and iq4_xs against the scalar reference, bit for bit, on
// random blocks (every byte random: any scale, including inf and NaN halves, any nibbles,
// any iq4_xs group scales), at awkward block counts and with misaligned source and output.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "quant/fast_paths.h"
#include "quant/iquant_kernels.h"

namespace kiln {
namespace {

using RowFn = void (*)(const void*, float*, int64_t);

void expect_avx2_matches_reference(RowFn reference, RowFn avx2, int block_elems, int block_bytes,
                                   const char* what) {
  std::mt19937 rng(20240531);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int blocks : {1, 3, 7, 37, 129}) {
    for (int misalign : {0, 1, 3}) {
      const int64_t n = int64_t(blocks) * block_elems;
      std::vector<uint8_t> src(size_t(blocks) * block_bytes + misalign);
      for (uint8_t& b : src) b = uint8_t(byte(rng));
      std::vector<float> want(n + misalign), got(n + misalign);
      reference(src.data() + misalign, want.data() + misalign, n);
      avx2(src.data() + misalign, got.data() + misalign, n);
      int mismatches = 0;
      for (int64_t i = misalign; i < n + misalign; ++i) {
        const int64_t at = i - misalign;
        if (std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i])) continue;
        if (++mismatches <= 10)
          ADD_FAILURE() << what << " (" << blocks << " blocks, misalign " << misalign << "): block "
                        << at / block_elems << " element " << at % block_elems << ": avx2 "
                        << got[i] << ", reference " << want[i];
      }
      EXPECT_EQ(mismatches, 0) << what << ": " << blocks << " blocks, misalign " << misalign;
    }
  }
}

TEST(IquantAvx2, Iq4nlMatchesReference) {
  if (!cpu_features().avx2) GTEST_SKIP() << "processor without AVX2 (or KILN_SIMD=scalar)";
  expect_avx2_matches_reference(iquant::dequantize_iq4_nl, iquant::dequantize_iq4_nl_avx2, 32, 18,
                                "iq4_nl");
}

TEST(IquantAvx2, Iq4xsMatchesReference) {
  if (!cpu_features().avx2) GTEST_SKIP() << "processor without AVX2 (or KILN_SIMD=scalar)";
  expect_avx2_matches_reference(iquant::dequantize_iq4_xs, iquant::dequantize_iq4_xs_avx2, 256,
                                136, "iq4_xs");
}

TEST(IquantAvx512, Iq4nlMatchesReference) {
  if (!cpu_features().avx512) GTEST_SKIP() << "processor without AVX-512 (or KILN_SIMD caps it)";
  expect_avx2_matches_reference(iquant::dequantize_iq4_nl, avx512::dequantize_iq4_nl, 32, 18, "iq4_nl avx512");
}

TEST(IquantAvx512, Iq4xsMatchesReference) {
  if (!cpu_features().avx512) GTEST_SKIP() << "processor without AVX-512 (or KILN_SIMD caps it)";
  expect_avx2_matches_reference(iquant::dequantize_iq4_xs, avx512::dequantize_iq4_xs, 256, 136, "iq4_xs avx512");
}

}  // namespace
}  // namespace kiln
