#pragma once
// Small AVX-512 helpers shared by the quant/*_avx512.cpp kernels (include only from files
// built with -mavx512f/bw/vl/dq). As in simd_avx2.h, results must equal the scalar
// references bit for bit: only exact integers are converted to float, and the reference's
// multiply and subtract are done one by one, never fused.
#include <immintrin.h>

#include <cstdint>

namespace kiln::avx512_util {

// 16 signed 8-bit levels -> float(level) * scale.
inline void store16_i8(__m128i levels, __m512 scale, float* y) {
  _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(levels)), scale));
}

// 16 signed 8-bit levels -> float(level) * scale - offset.
inline void store16_i8(__m128i levels, __m512 scale, __m512 offset, float* y) {
  const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(levels)), scale);
  _mm512_storeu_ps(y, _mm512_sub_ps(v, offset));
}

// 32 signed 8-bit levels (one 256-bit register) -> 32 floats, times scale.
inline void store32_i8(__m256i levels, __m512 scale, float* y) {
  store16_i8(_mm256_castsi256_si128(levels), scale, y);
  store16_i8(_mm256_extracti128_si256(levels, 1), scale, y + 16);
}

// 32 signed 8-bit levels -> 32 floats, times scale, minus offset.
inline void store32_i8(__m256i levels, __m512 scale, __m512 offset, float* y) {
  store16_i8(_mm256_castsi256_si128(levels), scale, offset, y);
  store16_i8(_mm256_extracti128_si256(levels, 1), scale, offset, y + 16);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// The 32 nibbles of 16 packed bytes as bytes: low nibbles (first 16), then high nibbles.
inline __m256i split_nibbles(__m128i packed) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), mask), _mm_and_si128(packed, mask));
}

// As split_nibbles, each nibble then looked up in a 16-entry byte table.
inline __m256i lookup_nibbles(__m128i packed, __m128i table) {
  const __m256i table2 = _mm256_broadcastsi128_si256(table);
  return _mm256_shuffle_epi8(table2, split_nibbles(packed));
}

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

}  // namespace kiln::avx512_util
