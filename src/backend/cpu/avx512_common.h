#pragma once
// Helpers shared by the AVX-512 matmul kernels (matmul_avx512.cpp, matmul_decode_avx512.cpp).
// Include only from files compiled with the AVX-512 flags.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/matmul_kernels.h"
#include "quant/types.h"

namespace kiln::cpu::avx512::detail {

inline __mmask16 tail_mask16(int64_t n) { return __mmask16((1u << n) - 1); }

// One line of a Prefetch, into L2.
inline void prefetch_step(Prefetch& pf) {
  if (pf.lines > 0) {
    _mm_prefetch(reinterpret_cast<const char*>(pf.next), _MM_HINT_T1);
    pf.next += 64;
    --pf.lines;
  }
}

// The 8 six-bit scales and 8 mins of a q4_K super-block (12 packed bytes at `packed`, which
// may be read 16 bytes wide), as 16 bytes: scales in 0..7, mins in 8..15.
inline __m128i q4k_scales_mins(const uint8_t* packed) {
  const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  // Low parts: scale j<4: s[j] & 63, j>=4: s[j+4] & 15; min j<4: s[j+4] & 63, j>=4: s[j+4] >> 4.
  const __m128i low_src = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i shifted = _mm_blend_epi16(low_src, _mm_srli_epi16(low_src, 4), 0xC0);  // min j>=4: >> 4
  const __m128i low = _mm_and_si128(shifted, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
  // High parts (j>=4): scale: s[j-4] >> 6, min: s[j] >> 6, moved to bits 4-5.
  const __m128i high_src = _mm_shuffle_epi8(s, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i high = _mm_and_si128(_mm_srli_epi16(high_src, 2), _mm_set1_epi8(0x30));
  return _mm_or_si128(low, high);
}

}  // namespace kiln::cpu::avx512::detail
