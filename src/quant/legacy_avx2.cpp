// AVX2 dequantizers of the legacy formats (references in quant/legacy.cpp): unpack a
// block's 32 levels into bytes, widen to int32, convert, and scale.
#include <immintrin.h>

#include "quant/blocks.h"
#include "quant/fast_paths.h"
#include "quant/simd_avx2.h"

namespace kiln::avx2 {
namespace {

using namespace avx2_util;

// 32 nibble levels of a q4 block: low nibbles are values 0..15, high nibbles 16..31.
__m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i q = load16(qs);
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

// The fifth bits of a q5 block, as 0x10 bytes: byte j gets bit j of the 32-bit word.
__m256i expand_high_bits(const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  // Broadcast the word, move byte j/8 into lane j, then test bit j%8 of it.
  const __m256i word = _mm256_set1_epi32(int(qh));
  const __m256i spread = _mm256_shuffle_epi8(
      word, _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

}  // namespace

void dequantize_q4_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t i = 0; i < n / 32; ++i, y += 32) {
    const __m256 d = _mm256_set1_ps(half_to_float(b[i].d));
    store_levels_i8(_mm256_sub_epi8(unpack_nibbles(b[i].qs), eight), d, _mm256_setzero_ps(), y);
  }
}

void dequantize_q4_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / 32; ++i, y += 32) {
    const __m256 d = _mm256_set1_ps(half_to_float(b[i].d));
    // value = q * d + m: store_levels_i8 subtracts, so pass -m (exact negation).
    const __m256 neg_m = _mm256_set1_ps(-half_to_float(b[i].m));
    store_levels_i8(unpack_nibbles(b[i].qs), d, neg_m, y);
  }
}

void dequantize_q5_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int64_t i = 0; i < n / 32; ++i, y += 32) {
    const __m256 d = _mm256_set1_ps(half_to_float(b[i].d));
    const __m256i levels = _mm256_or_si256(unpack_nibbles(b[i].qs), expand_high_bits(b[i].qh));
    store_levels_i8(_mm256_sub_epi8(levels, sixteen), d, _mm256_setzero_ps(), y);
  }
}

void dequantize_q5_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / 32; ++i, y += 32) {
    const __m256 d = _mm256_set1_ps(half_to_float(b[i].d));
    // value = q * d + m, written as q * d - (-m): the same sum (IEEE defines x - y as x + -y).
    const __m256 neg_m = _mm256_set1_ps(-half_to_float(b[i].m));
    const __m256i levels = _mm256_or_si256(unpack_nibbles(b[i].qs), expand_high_bits(b[i].qh));
    store_levels_i8(levels, d, neg_m, y);
  }
}

void dequantize_q8_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / 32; ++i, y += 32) {
    const __m256 d = _mm256_set1_ps(half_to_float(b[i].d));
    store_levels_i8(load32(b[i].qs), d, _mm256_setzero_ps(), y);
  }
}

void dequantize_q8_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_1*>(src);  // the sum s is not needed here
  for (int64_t i = 0; i < n / 32; ++i, y += 32) {
    const __m256 d = _mm256_set1_ps(half_to_float(b[i].d));
    store_levels_i8(load32(b[i].qs), d, _mm256_setzero_ps(), y);
  }
}

}  // namespace kiln::avx2
