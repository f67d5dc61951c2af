// AVX-512 kernels of f16_rows.h: 16 elements at a time, masked for the rest.
#include <immintrin.h>

#include "backend/cpu/f16_rows.h"

namespace kiln::cpu::avx512 {

namespace {

__mmask16 first(int64_t n) { return __mmask16((1u << n) - 1); }

__m512 load16(const uint16_t* p, __mmask16 m = 0xffff) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

}  // namespace

void narrow_f16(const float* src, uint16_t* dst, int64_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), kRound));
  if (i < n) {
    const __mmask16 m = first(n - i);
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), kRound));
  }
}

void widen_f16(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16(src + i));
  if (i < n) {
    const __mmask16 m = first(n - i);
    _mm512_mask_storeu_ps(dst + i, m, load16(src + i, m));
  }
}

float dot_f16_f32(const uint16_t* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(load16(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(load16(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : first(n - i);
    s0 = _mm512_fmadd_ps(load16(a + i, m), _mm512_maskz_loadu_ps(m, b + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

}  // namespace kiln::cpu::avx512
