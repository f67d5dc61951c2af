// AVX2 dequantizers of the ternary (tq1_0, tq2_0) and sign / 2-bit (q1_0, q2_0) formats
// (references in quant/ternary.cpp and quant/lowbit.cpp). Levels are small exact integers,
// so each value is the reference's single rounding: float(level) * d (or +-d for q1_0).
#include <immintrin.h>

#include "quant/blocks.h"
#include "quant/fast_paths.h"
#include "quant/simd_avx2.h"

namespace kiln::avx2 {
namespace {

using namespace avx2_util;

constexpr int QK = kSuperBlock;

// 8 int32 levels -> float(level) * d.
inline void store8_scaled(__m256i levels, __m256 d, float* y) {
  _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(levels), d));
}

// 16 trits of tq1_0 bytes, minus 1: lane k holds byte bytes[k] (16-bit) and multiplier
// pow3[k] = 3^n for the trit n wanted. (byte * 3^n) mod 256 shifts the base-3 fraction
// left by n trits; the top trit of that is then (x * 3) >> 8.
inline __m256i trits_minus_one(__m256i bytes16, __m256i pow3_16) {
  const __m256i shifted = _mm256_and_si256(_mm256_mullo_epi16(bytes16, pow3_16), _mm256_set1_epi16(0xFF));
  const __m256i trit = _mm256_srli_epi16(_mm256_mullo_epi16(shifted, _mm256_set1_epi16(3)), 8);
  return _mm256_sub_epi16(trit, _mm256_set1_epi16(1));
}

// 16 int16 levels -> 16 floats times d.
inline void store16_i16_scaled(__m256i levels16, __m256 d, float* y) {
  store8_scaled(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(levels16)), d, y);
  store8_scaled(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(levels16, 1)), d, y + 8);
}

constexpr int16_t kPow3[5] = {1, 3, 9, 27, 81};

}  // namespace

void dequantize_tq1_0(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockTQ1_0*>(src);
  // The last 16 values: lane 4t + m is trit t of qh[m].
  const __m256i qh_pow3 = _mm256_setr_epi16(1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockTQ1_0& b = blocks[i];
    const __m256 d = _mm256_set1_ps(half_to_float(b.d));
    const __m256i lo = _mm256_cvtepu8_epi16(load16(b.qs)), hi = _mm256_cvtepu8_epi16(load16(b.qs + 16));
    for (int t = 0; t < 5; ++t, y += 32) {  // values 32t + m from qs[0..31]
      const __m256i p = _mm256_set1_epi16(kPow3[t]);
      store16_i16_scaled(trits_minus_one(lo, p), d, y);
      store16_i16_scaled(trits_minus_one(hi, p), d, y + 16);
    }
    const __m256i tail = _mm256_cvtepu8_epi16(load16(b.qs + 32));
    for (int t = 0; t < 5; ++t, y += 16)  // values 160 + 16t + m from qs[32..47]
      store16_i16_scaled(trits_minus_one(tail, _mm256_set1_epi16(kPow3[t])), d, y);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    const __m256i qh16 = _mm256_cvtepu8_epi16(_mm_set1_epi32(int(qh)));  // qh[0..3] four times
    store16_i16_scaled(trits_minus_one(qh16, qh_pow3), d, y);
    y += 16;
  }
}

void dequantize_tq2_0(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockTQ2_0*>(src);
  const __m256i one = _mm256_set1_epi8(1), three = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockTQ2_0& b = blocks[i];
    const __m256 d = _mm256_set1_ps(half_to_float(b.d));
    for (int j = 0; j < 64; j += 32) {
      const __m256i q = load32(b.qs + j);
      for (int shift = 0; shift < 8; shift += 2, y += 32) {
        const __m256i t = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift)), three);
        store_levels_i8(_mm256_sub_epi8(t, one), d, _mm256_setzero_ps(), y);
      }
    }
  }
}

void dequantize_q1_0(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ1_0*>(src);
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (int64_t i = 0; i < n / 128; ++i) {
    const float d = half_to_float(blocks[i].d);
    const __m256 plus = _mm256_set1_ps(d), minus = _mm256_set1_ps(-d);
    for (int k = 0; k < 16; ++k, y += 8) {  // byte k: values 8k .. 8k+7
      const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(blocks[i].qs[k]), bit), bit);
      _mm256_storeu_ps(y, _mm256_blendv_ps(minus, plus, _mm256_castsi256_ps(set)));
    }
  }
}

void dequantize_q2_0(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_0*>(src);
  // Value k of a 16-bit word is bits 2k..2k+1.
  const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i three = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1);
  for (int64_t i = 0; i < n / 64; ++i) {
    const __m256 d = _mm256_set1_ps(half_to_float(blocks[i].d));
    for (int k = 0; k < 8; ++k, y += 8) {
      uint16_t word;
      std::memcpy(&word, blocks[i].qs + 2 * k, 2);
      const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), three);
      store8_scaled(_mm256_sub_epi32(q, one), d, y);
    }
  }
}

}  // namespace kiln::avx2
