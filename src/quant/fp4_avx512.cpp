// AVX-512 dequantizer of mxfp4 (reference in quant/fp4.cpp): codes looked up in the
// doubled E2M1 table with a byte shuffle, widened 16 at a time, times the halved E8M0 scale.
#include <immintrin.h>

#include <bit>

#include "quant/blocks.h"
#include "quant/fast_paths.h"
#include "quant/simd_avx512.h"

namespace kiln::avx512 {
namespace {

using namespace avx512_util;

// 2^(e - 128), built exactly as the reference builds it.
float e8m0_half(uint8_t e) {
  return std::bit_cast<float>(e < 2 ? uint32_t(0x00200000) << e : uint32_t(e - 1) << 23);
}

}  // namespace

void dequantize_mxfp4(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const BlockMXFP4*>(src);
  const __m128i table = load16(kFp4Doubled);
  for (int64_t i = 0; i < n / 32; ++i, y += 32)
    store32_i8(lookup_nibbles(load16(b[i].qs), table), _mm512_set1_ps(e8m0_half(b[i].e)), y);
}

}  // namespace kiln::avx512
