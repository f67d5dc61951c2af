// AVX-512 dequantizers of the K-quants (references in quant/kquants.cpp). Levels are built
// as bytes 32 at a time (as in kquants_avx2.cpp); each sub-block of 16 values is then one
// 512-bit vector: widened, converted (exact), times the sub-block scale dl = d * scale that
// is computed in scalar exactly as the reference does, and the min subtracted.
#include <immintrin.h>

#include "quant/blocks.h"
#include "quant/fast_paths.h"
#include "quant/kquant_levels_simd.h"
#include "quant/simd_avx512.h"

namespace kiln::avx512 {
namespace {

using namespace avx512_util;
using namespace kquant_levels;

constexpr int QK = kSuperBlock;

}  // namespace

void dequantize_q2_K(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const BlockQ2_K& b = blocks[i];
    const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
    for (int half = 0; half < 2; ++half) {
      const __m256i q = load32(b.qs + 32 * half);
      for (int j = 0; j < 4; ++j) {
        const __m256i levels = bit_pair(q, 2 * j);
        for (int part = 0; part < 2; ++part) {  // two sub-blocks of 16 per 32 bytes
          const uint8_t sc = b.scales[8 * half + 2 * j + part];
          const __m512 dl = _mm512_set1_ps(d * float(sc & 0xF)), ml = _mm512_set1_ps(dmin * float(sc >> 4));
          store16_i8(half_of(levels, part), dl, ml, y + 128 * half + 32 * j + 16 * part);
        }
      }
    }
  }
}

void dequantize_q3_K(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ3_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const BlockQ3_K& b = blocks[i];
    const float d = half_to_float(b.d);
    int8_t scales[16];
    q3k_unpack_scales(b.scales, scales);
    const __m256i hmask = load32(b.hmask);
    for (int half = 0; half < 2; ++half) {
      const __m256i q = load32(b.qs + 32 * half);
      for (int j = 0; j < 4; ++j) {
        // Level = low two bits, minus 4 where the high bit (bit 4*half + j of hmask) is clear.
        const __mmask32 clear = _mm256_testn_epi8_mask(hmask, _mm256_set1_epi8(char(1 << (4 * half + j))));
        const __m256i levels = _mm256_mask_sub_epi8(bit_pair(q, 2 * j), clear, bit_pair(q, 2 * j), _mm256_set1_epi8(4));
        for (int part = 0; part < 2; ++part) {
          const int e = 128 * half + 32 * j + 16 * part;
          store16_i8(half_of(levels, part), _mm512_set1_ps(d * float(scales[e / 16])), y + e);
        }
      }
    }
  }
}

void dequantize_q4_K(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const BlockQ4_K& b = blocks[i];
    const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
    for (int pair = 0; pair < 4; ++pair) {
      const __m256i q = load32(b.qs + 32 * pair);
      for (int k = 0; k < 2; ++k) {
        const int sub = 2 * pair + k;
        uint8_t sc, m;
        kquant_scale_min(sub, b.scales, &sc, &m);
        const __m512 dl = _mm512_set1_ps(d * float(sc)), ml = _mm512_set1_ps(dmin * float(m));
        store32_i8(k ? high_nibbles(q) : low_nibbles(q), dl, ml, y + 32 * sub);
      }
    }
  }
}

void dequantize_q5_K(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const BlockQ5_K& b = blocks[i];
    const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
    const __m256i qh = load32(b.qh);
    for (int pair = 0; pair < 4; ++pair) {
      const __m256i q = load32(b.qs + 32 * pair);
      for (int k = 0; k < 2; ++k) {
        const int sub = 2 * pair + k;
        uint8_t sc, m;
        kquant_scale_min(sub, b.scales, &sc, &m);
        const __m512 dl = _mm512_set1_ps(d * float(sc)), ml = _mm512_set1_ps(dmin * float(m));
        const __m256i nibbles = k ? high_nibbles(q) : low_nibbles(q);
        const __mmask32 high = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(char(1 << sub)));
        store32_i8(_mm256_mask_add_epi8(nibbles, high, nibbles, sixteen), dl, ml, y + 32 * sub);
      }
    }
  }
}

void dequantize_q6_K(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  const __m256i thirty_two = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < n / QK; ++i, y += QK) {
    const BlockQ6_K& b = blocks[i];
    const float d = half_to_float(b.d);
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = load32(b.ql + 64 * half), ql1 = load32(b.ql + 64 * half + 32);
      const __m256i qh = load32(b.qh + 32 * half);
      __m256i groups[4];
      q6_K_groups(ql0, ql1, qh, groups);
      for (int g = 0; g < 4; ++g) {
        const __m256i levels = _mm256_sub_epi8(groups[g], thirty_two);
        for (int part = 0; part < 2; ++part) {
          const int sub = 8 * half + 2 * g + part;
          // The reference computes (d * scale) * q: same order here.
          store16_i8(half_of(levels, part), _mm512_set1_ps(d * float(b.scales[sub])), y + 128 * half + 32 * g + 16 * part);
        }
      }
    }
  }
}

}  // namespace kiln::avx512
