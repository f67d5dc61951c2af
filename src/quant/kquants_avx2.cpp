// AVX2 dequantizers of the K-quants (references in quant/kquants.cpp). Sub-block scales
// are combined in scalar float exactly as the reference does (dl = d * scale), then each
// level vector is converted and multiplied (and the min subtracted) one operation at a time.
#include <immintrin.h>

#include "quant/blocks.h"
#include "quant/fast_paths.h"
#include "quant/kquant_levels_simd.h"
#include "quant/simd_avx2.h"

namespace kiln::avx2 {
namespace {

using namespace avx2_util;
using namespace kquant_levels;

constexpr int QK = kSuperBlock;

}  // namespace

void dequantize_q2_K(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockQ2_K& b = blocks[i];
    const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
    for (int half = 0; half < 2; ++half) {
      const __m256i q = load32(b.qs + 32 * half);
      for (int j = 0; j < 4; ++j) {
        const __m256i levels = bit_pair(q, 2 * j);
        for (int part = 0; part < 2; ++part) {  // two sub-blocks of 16 per 32 bytes
          const uint8_t sc = b.scales[8 * half + 2 * j + part];
          const __m256 dl = _mm256_set1_ps(d * float(sc & 0xF)), ml = _mm256_set1_ps(dmin * float(sc >> 4));
          const __m128i l16 = half_of(levels, part);
          store16_levels_i8(l16, dl, ml, y + 128 * half + 32 * j + 16 * part);
        }
      }
    }
    y += QK;
  }
}

void dequantize_q3_K(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ3_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockQ3_K& b = blocks[i];
    const float d = half_to_float(b.d);
    int8_t scales[16];
    q3k_unpack_scales(b.scales, scales);
    const __m256i hmask = load32(b.hmask);
    for (int half = 0; half < 2; ++half) {
      const __m256i q = load32(b.qs + 32 * half);
      for (int j = 0; j < 4; ++j) {
        // Level = low two bits - 4 unless the high bit (bit 4*half + j of hmask) is set.
        const __m256i bit = _mm256_set1_epi8(char(1 << (4 * half + j)));
        const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), _mm256_setzero_si256());
        const __m256i levels = _mm256_sub_epi8(bit_pair(q, 2 * j), _mm256_and_si256(clear, _mm256_set1_epi8(4)));
        for (int part = 0; part < 2; ++part) {
          const int e = 128 * half + 32 * j + 16 * part;
          const __m256 dl = _mm256_set1_ps(d * float(scales[e / 16]));
          const __m128i l16 = half_of(levels, part);
          store16_levels_i8(l16, dl, y + e);
        }
      }
    }
    y += QK;
  }
}

void dequantize_q4_K(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockQ4_K& b = blocks[i];
    const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
    for (int pair = 0; pair < 4; ++pair) {
      const __m256i q = load32(b.qs + 32 * pair);
      for (int k = 0; k < 2; ++k) {
        const int sub = 2 * pair + k;
        uint8_t sc, m;
        kquant_scale_min(sub, b.scales, &sc, &m);
        const __m256 dl = _mm256_set1_ps(d * float(sc)), ml = _mm256_set1_ps(dmin * float(m));
        store_levels_i8(k ? high_nibbles(q) : low_nibbles(q), dl, ml, y + 32 * sub);
      }
    }
    y += QK;
  }
}

void dequantize_q5_K(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockQ5_K& b = blocks[i];
    const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
    const __m256i qh = load32(b.qh);
    for (int pair = 0; pair < 4; ++pair) {
      const __m256i q = load32(b.qs + 32 * pair);
      for (int k = 0; k < 2; ++k) {
        const int sub = 2 * pair + k;
        uint8_t sc, m;
        kquant_scale_min(sub, b.scales, &sc, &m);
        const __m256 dl = _mm256_set1_ps(d * float(sc)), ml = _mm256_set1_ps(dmin * float(m));
        const __m256i bit = _mm256_set1_epi8(char(1 << sub));
        const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(16));
        store_levels_i8(_mm256_or_si256(k ? high_nibbles(q) : low_nibbles(q), high), dl, ml, y + 32 * sub);
      }
    }
    y += QK;
  }
}

void dequantize_q6_K(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  const __m256i thirty_two = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < n / QK; ++i) {
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
          const __m256 dl = _mm256_set1_ps(d * float(b.scales[sub]));
          const __m128i l16 = half_of(levels, part);
          store16_levels_i8(l16, dl, y + 128 * half + 32 * g + 16 * part);
        }
      }
    }
    y += QK;
  }
}

}  // namespace kiln::avx2
