#pragma once
// Unpacking K-quant levels as bytes, 32 at a time with 256-bit integer operations: shared
// by the AVX2 and the AVX-512 K-quant kernels (quant/kquants_avx2.cpp, kquants_avx512.cpp;
// include only from files built with at least -mavx2).
//
// The functions are in an unnamed namespace on purpose: each including file is compiled
// for a different instruction set, and an ordinary inline function would be one symbol
// that the linker may take from the AVX-512 file for the AVX2 kernels too.
#include <immintrin.h>

namespace kiln::kquant_levels {
namespace {

__m256i low_nibbles(__m256i q) { return _mm256_and_si256(q, _mm256_set1_epi8(0x0F)); }
__m256i high_nibbles(__m256i q) { return _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0F)); }

// Bit pair `shift` (0, 2, 4, 6) of each byte.
__m256i bit_pair(__m256i q, int shift) {
  return _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(3));
}

// Bytes 0-15 (part 0) or 16-31 (part 1).
__m128i half_of(__m256i v, int part) { return part ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v); }

// q6_K: the four groups of 32 values of one half super-block (128 values) from its 64 ql
// bytes (ql0, ql1) and 32 qh bytes, each low nibble or high nibble with its two top bits;
// levels 0..63, not yet offset by -32.
void q6_K_groups(__m256i ql0, __m256i ql1, __m256i qh, __m256i groups[4]) {
  groups[0] = _mm256_or_si256(low_nibbles(ql0), _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4));
  groups[1] = _mm256_or_si256(low_nibbles(ql1), _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2));
  groups[2] = _mm256_or_si256(high_nibbles(ql0), _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
  groups[3] =
      _mm256_or_si256(high_nibbles(ql1), _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(char(0xC0))), 2));
}

}  // namespace
}  // namespace kiln::kquant_levels
