#pragma once
// Small AVX2 helpers shared by the quant/*_avx2.cpp kernels (include only from files built
// with -mavx2 -mfma -mf16c). Results must equal the scalar references bit for bit, so the
// kernels only ever convert exact integers to float and do the reference's multiplies and
// adds one by one (never fused: a*b+c rounds twice in the reference).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kiln::avx2_util {

// Stores 32 signed 8-bit levels, times `scale`, minus `offset`, as 32 floats.
inline void store_levels_i8(__m256i levels, __m256 scale, __m256 offset, float* y) {
  const __m128i halves[2] = {_mm256_castsi256_si128(levels), _mm256_extracti128_si256(levels, 1)};
  for (int h = 0; h < 2; ++h) {
    const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[h]));
    const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(halves[h], 8)));
    _mm256_storeu_ps(y + 16 * h, _mm256_sub_ps(_mm256_mul_ps(a, scale), offset));
    _mm256_storeu_ps(y + 16 * h + 8, _mm256_sub_ps(_mm256_mul_ps(b, scale), offset));
  }
}

// 16 signed 8-bit levels times `scale` (no offset), as 16 floats.
inline void store16_levels_i8(__m128i levels, __m256 scale, float* y) {
  const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(levels));
  const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(levels, 8)));
  _mm256_storeu_ps(y, _mm256_mul_ps(a, scale));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(b, scale));
}

// 16 levels times scale, minus offset.
inline void store16_levels_i8(__m128i levels, __m256 scale, __m256 offset, float* y) {
  const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(levels));
  const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(levels, 8)));
  _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(a, scale), offset));
  _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(b, scale), offset));
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

}  // namespace kiln::avx2_util
