// AVX-512 widening of f16 and bf16 rows (reference: quant/float_types.cpp). 32 values per
// step; the tail goes through masked loads and stores, so any n works.
#include <immintrin.h>

#include "quant/fast_paths.h"

namespace kiln::avx512 {
namespace {

inline __m256i load16_halves(const uint16_t* h) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)); }

// The mask of the first `count` (< 16) lanes.
inline __mmask16 first_lanes(int64_t count) { return __mmask16((1u << count) - 1); }

inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

}  // namespace

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(load16_halves(h + i)));
    _mm512_storeu_ps(dst + i + 16, _mm512_cvtph_ps(load16_halves(h + i + 16)));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : first_lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + i)));
  }
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_ps(dst + i, widen_bf16(load16_halves(h + i)));
    _mm512_storeu_ps(dst + i + 16, widen_bf16(load16_halves(h + i + 16)));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : first_lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, m, widen_bf16(_mm256_maskz_loadu_epi16(m, h + i)));
  }
}

}  // namespace kiln::avx512
