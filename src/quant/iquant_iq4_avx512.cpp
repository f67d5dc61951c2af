// AVX-512 dequantizers of iq4_nl and iq4_xs (references in quant/iquant_iq4.cpp): nibbles
// index the 16 levels with a byte shuffle; each weight is scale * float(level), the same
// single rounding as the reference.
#include <immintrin.h>

#include "quant/fast_paths.h"
#include "quant/iquant_blocks.h"
#include "quant/iquant_grids.h"
#include "quant/simd_avx512.h"

namespace kiln::avx512 {

using namespace avx512_util;
using namespace iquant;

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  const __m128i levels = load16(kIq4Levels.data());
  const auto* bytes = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n / kIq4nlBlock; ++b, bytes += sizeof(BlockIq4nl), dst += kIq4nlBlock) {
    uint16_t d;
    std::memcpy(&d, bytes, 2);
    store32_i8(lookup_nibbles(load16(bytes + 2), levels), _mm512_set1_ps(half_to_float(d)), dst);
  }
}

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  const __m128i levels = load16(kIq4Levels.data());
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq4xs>(src, b);
    const float d = half_to_float(block.d);
    for (int g = 0; g < kSuperBlock / kGroup; ++g, dst += kGroup) {
      const int code = ((block.scales_l[g / 2] >> (4 * (g % 2))) & 0xf) | (((block.scales_h >> (2 * g)) & 3) << 4);
      store32_i8(lookup_nibbles(load16(block.qs + 16 * g), levels), _mm512_set1_ps(d * float(code - 32)), dst);
    }
  }
}

}  // namespace kiln::avx512
