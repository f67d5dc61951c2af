// AVX2 dequantizers of mxfp4 and nvfp4 (references in quant/fp4.cpp): the 16-entry code
// table is looked up with a byte shuffle, then widened, converted and scaled.
#include <immintrin.h>

#include <bit>

#include "quant/blocks.h"
#include "quant/fast_paths.h"
#include "quant/simd_avx2.h"

namespace kiln::avx2 {
namespace {

using namespace avx2_util;

// Codes -> doubled E2M1 levels for 16 bytes of packed codes: low nibbles first, then high.
__m256i decode_fp4(__m128i packed) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kFp4Doubled));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(packed, mask));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(packed, 4), mask));
  return _mm256_set_m128i(hi, lo);
}

// Same scale decodings as the reference (exact bit constructions).
float e8m0_half(uint8_t e) {
  return std::bit_cast<float>(e < 2 ? uint32_t(0x00200000) << e : uint32_t(e - 1) << 23);
}
float ue4m3_half(uint8_t x) {
  if (x == 0 || x == 0x7F) return 0.0f;
  const int exp = (x >> 3) & 0xF, man = x & 7;
  // man * 2^-9 or (1 + man/8) * 2^(exp-7), both exact; then halved.
  const float raw = exp == 0 ? float(man) * 0x1p-9f
                             : (1.0f + float(man) / 8.0f) * std::bit_cast<float>(uint32_t(exp - 7 + 127) << 23);
  return raw * 0.5f;
}

}  // namespace

void dequantize_mxfp4(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockMXFP4*>(src);
  for (int64_t i = 0; i < n / 32; ++i, y += 32)
    store_levels_i8(decode_fp4(load16(b[i].qs)), _mm256_set1_ps(e8m0_half(b[i].e)), _mm256_setzero_ps(), y);
}

void dequantize_nvfp4(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockNVFP4*>(src);
  for (int64_t i = 0; i < n / 64; ++i) {
    for (int pair = 0; pair < 2; ++pair, y += 32) {
      // 16 bytes = two sub-blocks of 16 values; decode_fp4 puts all low nibbles first, so
      // reorder to sub-block order: [lo s0, hi s0, lo s1, hi s1] in 8-byte runs.
      const __m256i levels = decode_fp4(load16(b[i].qs + 16 * pair));
      const __m256i ordered = _mm256_permute4x64_epi64(levels, 0xD8);  // qwords 0,2,1,3
      const __m128i first = _mm256_castsi256_si128(ordered), second = _mm256_extracti128_si256(ordered, 1);
      store16_levels_i8(first, _mm256_set1_ps(ue4m3_half(b[i].d[2 * pair])), y);
      store16_levels_i8(second, _mm256_set1_ps(ue4m3_half(b[i].d[2 * pair + 1])), y + 16);
    }
  }
}

}  // namespace kiln::avx2
