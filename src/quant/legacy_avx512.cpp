// AVX-512 dequantizers of q4_0 and q8_0 (references in quant/legacy.cpp): a block's 32
// levels as bytes, widened 16 at a time to int32, converted (exact) and scaled.
#include <immintrin.h>

#include "quant/blocks.h"
#include "quant/fast_paths.h"
#include "quant/simd_avx512.h"

namespace kiln::avx512 {

using namespace avx512_util;

void dequantize_q4_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t i = 0; i < n / 32; ++i, y += 32) {
    const __m512 d = _mm512_set1_ps(half_to_float(b[i].d));
    store32_i8(_mm256_sub_epi8(split_nibbles(load16(b[i].qs)), eight), d, y);
  }
}

void dequantize_q8_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / 32; ++i, y += 32) {
    const __m512 d = _mm512_set1_ps(half_to_float(b[i].d));
    store16_i8(load16(b[i].qs), d, y);
    store16_i8(load16(b[i].qs + 16), d, y + 16);
  }
}

}  // namespace kiln::avx512
