#pragma once
// Helpers shared by the AVX-512 matmul kernels (matmul_avx512.cpp, matmul_decode_avx512.cpp).
// Include only from files compiled with the AVX-512 flags.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/matmul_kernels.h"
#include "quant/types.h"

namespace kiln::cpu::avx512::detail {

inline __mmask16 tail_mask16(int64_t n) { return __mmask16((1u << n) - 1); }

// Symmetric int8 quantization of 32 floats: q = round(x / dx), dx = max|x| / 127.
// Returns dx; writes q and the sums of q over elements 0..15 and 16..31.
inline float quantize_block32(const float* x, int8_t* q, int32_t* sum_lo, int32_t* sum_hi) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float dx = amax / 127.0f;
  const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));  // rounds to nearest even
  const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  *sum_lo = _mm512_reduce_add_epi32(qa);
  *sum_hi = _mm512_reduce_add_epi32(qb);
  return dx;
}

}  // namespace kiln::cpu::avx512::detail
