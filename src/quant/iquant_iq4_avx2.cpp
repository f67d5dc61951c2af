// AVX2 dequantization of iq4_nl and iq4_xs. The 16 levels sit in one register and the
// nibbles index them with a byte shuffle; each weight is then scale * float(level), the
// same single rounding as the scalar reference, so results are identical bit for bit.
#include <immintrin.h>

#include <cstddef>
#include <cstring>

#include "core/half.h"
#include "quant/iquant_blocks.h"
#include "quant/iquant_grids.h"
#include "quant/iquant_kernels.h"

namespace kiln::iquant {
namespace {

// Writes the 32 weights of one group: `packed` holds 16 bytes of nibbles (byte j: weight j
// low, weight j + 16 high), `levels` the 16 levels as bytes.
inline void expand_iq4_group_avx2(const uint8_t* packed, float scale, __m128i levels, float* dst) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i low_nibbles = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
  const __m128i high_nibbles = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
  const __m128i first = _mm_shuffle_epi8(levels, low_nibbles);    // weights 0..15
  const __m128i second = _mm_shuffle_epi8(levels, high_nibbles);  // weights 16..31
  const __m256 s = _mm256_set1_ps(scale);
  auto store8 = [&](__m128i eight_levels, float* out) {
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight_levels));
    _mm256_storeu_ps(out, _mm256_mul_ps(s, v));
  };
  store8(first, dst);
  store8(_mm_srli_si128(first, 8), dst + 8);
  store8(second, dst + 16);
  store8(_mm_srli_si128(second, 8), dst + 24);
}

inline __m128i iq4_levels_register() {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Levels.data()));
}

}  // namespace

void dequantize_iq4_nl_avx2(const void* src, float* dst, int64_t n) {
  const __m128i levels = iq4_levels_register();
  // Read d and the nibbles in place: copying each 18-byte block out first (load_block)
  // cost more than the arithmetic.
  const auto* bytes = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n / kIq4nlBlock; ++b, bytes += sizeof(BlockIq4nl)) {
    uint16_t d;
    std::memcpy(&d, bytes + offsetof(BlockIq4nl, d), sizeof(d));
    expand_iq4_group_avx2(bytes + offsetof(BlockIq4nl, qs), _cvtsh_ss(d), levels, dst + b * kIq4nlBlock);
  }
}

void dequantize_iq4_xs_avx2(const void* src, float* dst, int64_t n) {
  const __m128i levels = iq4_levels_register();
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq4xs>(src, b);
    const float d = f16_to_f32(block.d);
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      const int code = ((block.scales_l[g / 2] >> (4 * (g % 2))) & 0xf) |
                       (((block.scales_h >> (2 * g)) & 3) << 4);
      expand_iq4_group_avx2(block.qs + 16 * g, d * float(code - 32), levels,
                            dst + b * kSuperBlock + g * kGroup);
    }
  }
}

}  // namespace kiln::iquant
