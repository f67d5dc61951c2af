// AVX2 dequantizers of the lattice i-quants (references in quant/iquant_lattice.cpp). Each
// run of 8 weights is one grid row (or two rows of 4) loaded as 8 bytes, widened to int32,
// converted (exact) and multiplied by the group scale; the group scale itself is computed
// in scalar float exactly as the reference does.
//
// Signs: the reference multiplies by -1.f or 1.f, which only flips the sign bit, so XOR
// with the sign bit gives the same bits (NaNs aside, whose sign the tests do not compare).
#include <immintrin.h>

#include <cstring>

#include "core/half.h"
#include "quant/fast_paths.h"
#include "quant/iquant_blocks.h"
#include "quant/iquant_grids.h"

namespace kiln::avx2 {
namespace {

using namespace iquant;

// The sign bits of 8 floats from an 8-bit mask (bit j set: weight j negative).
inline __m256 sign_bits(uint32_t mask) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(mask)), bit), bit);
  return _mm256_castsi256_ps(_mm256_slli_epi32(set, 31));
}

// 8 unsigned grid levels (8 bytes at `row`) as floats.
inline __m256 grid_levels(const uint8_t* row) {
  uint64_t bytes;
  std::memcpy(&bytes, row, 8);
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(bytes))));
}

// Two rows of 4 unsigned levels as 8 floats.
inline __m256 grid_levels(const uint8_t* first, const uint8_t* second) {
  uint32_t a, b;
  std::memcpy(&a, first, 4);
  std::memcpy(&b, second, 4);
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(a | (uint64_t(b) << 32)))));
}

// (scale * level) * (+-1), 8 weights.
inline void store_signed(__m256 scale, __m256 levels, uint32_t sign_mask, float* dst) {
  _mm256_storeu_ps(dst, _mm256_xor_ps(_mm256_mul_ps(scale, levels), sign_bits(sign_mask)));
}

inline float iq2_group_scale(float d, uint32_t s) { return d * (0.5f + float(s)) * 0.25f; }

// scale * (level + delta) for 8 signed ternary levels of the iq1 grid.
inline void store_iq1(const SignedGridRow8& row, float scale, float delta, float* dst) {
  uint64_t bytes;
  std::memcpy(&bytes, row.data(), 8);
  const __m256 levels = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(int64_t(bytes))));
  _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_set1_ps(scale), _mm256_add_ps(levels, _mm256_set1_ps(delta))));
}

}  // namespace

void dequantize_iq2_xxs(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq2xxs>(src, b);
    const float d = f16_to_f32(block.d);
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      uint32_t words[2];  // [0]: 4 grid indices; [1]: 4 x 7 sign bits, scale on top
      std::memcpy(words, block.qs + 4 * g, sizeof(words));
      const __m256 scale = _mm256_set1_ps(iq2_group_scale(d, words[1] >> 28));
      for (int l = 0; l < 4; ++l, dst += 8)
        store_signed(scale, grid_levels(kIq2xxsGrid[(words[0] >> (8 * l)) & 0xffu].data()),
                     sign_mask_from7(words[1] >> (7 * l)), dst);
    }
  }
}

void dequantize_iq2_xs(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq2xs>(src, b);
    const float d = f16_to_f32(block.d);
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      const __m256 scales[2] = {_mm256_set1_ps(iq2_group_scale(d, block.scales[g] & 0xfu)),
                                _mm256_set1_ps(iq2_group_scale(d, block.scales[g] >> 4))};
      for (int l = 0; l < 4; ++l, dst += 8) {
        const uint16_t packed = block.qs[4 * g + l];  // 9-bit index, 7 sign bits
        store_signed(scales[l / 2], grid_levels(kIq2xsGrid[packed & 511u].data()),
                     sign_mask_from7(packed >> 9), dst);
      }
    }
  }
}

void dequantize_iq2_s(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq2s>(src, b);
    const float d = f16_to_f32(block.d);
    const uint8_t* sign_bytes = block.qs + kSuperBlock / 8;
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      const __m256 scales[2] = {_mm256_set1_ps(iq2_group_scale(d, block.scales[g] & 0xfu)),
                                _mm256_set1_ps(iq2_group_scale(d, block.scales[g] >> 4))};
      for (int l = 0; l < 4; ++l, dst += 8) {
        const uint32_t index = block.qs[4 * g + l] | (((block.qh[g] >> (2 * l)) & 3u) << 8);
        store_signed(scales[l / 2], grid_levels(kIq2sGrid[index].data()), sign_bytes[4 * g + l], dst);
      }
    }
  }
}

void dequantize_iq3_xxs(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq3xxs>(src, b);
    const float d = f16_to_f32(block.d);
    const uint8_t* indices = block.qs;
    const uint8_t* scales_and_signs = block.qs + kSuperBlock / 4;
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      uint32_t word;  // 4 x 7 sign bits, scale in bits 28-31
      std::memcpy(&word, scales_and_signs + 4 * g, sizeof(word));
      const __m256 scale = _mm256_set1_ps(d * (0.5f + float(word >> 28)) * 0.5f);
      for (int l = 0; l < 4; ++l, dst += 8) {
        const __m256 levels = grid_levels(kIq3xxsGrid[indices[8 * g + 2 * l]].data(),
                                          kIq3xxsGrid[indices[8 * g + 2 * l + 1]].data());
        store_signed(scale, levels, sign_mask_from7(word >> (7 * l)), dst);
      }
    }
  }
}

void dequantize_iq3_s(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq3s>(src, b);
    const float d = f16_to_f32(block.d);
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      const int s = (block.scales[g / 2] >> (4 * (g % 2))) & 0xf;
      const __m256 scale = _mm256_set1_ps(d * float(1 + 2 * s));
      const uint32_t high_bits = block.qh[g];  // 9th index bit of the group's 8 indices
      for (int l = 0; l < 4; ++l, dst += 8) {
        const uint32_t i0 = block.qs[8 * g + 2 * l] | (((high_bits >> (2 * l)) & 1u) << 8);
        const uint32_t i1 = block.qs[8 * g + 2 * l + 1] | (((high_bits >> (2 * l + 1)) & 1u) << 8);
        store_signed(scale, grid_levels(kIq3sGrid[i0].data(), kIq3sGrid[i1].data()), block.signs[4 * g + l], dst);
      }
    }
  }
}

void dequantize_iq1_s(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq1s>(src, b);
    const float d = f16_to_f32(block.d);
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      const uint16_t high = block.qh[g];
      const float scale = d * float(2 * ((high >> 12) & 7) + 1);
      const float delta = (high & 0x8000u) ? -kIq1Delta : kIq1Delta;
      for (int l = 0; l < 4; ++l, dst += 8) {
        const uint32_t index = block.qs[4 * g + l] | (((high >> (3 * l)) & 7u) << 8);
        store_iq1(kIq1sGrid[index], scale, delta, dst);
      }
    }
  }
}

void dequantize_iq1_m(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq1m>(src, b);
    uint16_t packed[4];  // 4 x (12 scale bits, one nibble of the half super-block scale)
    std::memcpy(packed, block.scales, sizeof(packed));
    const uint16_t d_bits = uint16_t((packed[0] >> 12) | ((packed[1] >> 8) & 0x00f0u) |
                                     ((packed[2] >> 4) & 0x0f00u) | (packed[3] & 0xf000u));
    const float d = f16_to_f32(d_bits);
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      const uint32_t s = packed[g / 2] >> (6 * (g % 2));
      const float scales[2] = {d * float(2 * (s & 7u) + 1), d * float(2 * ((s >> 3) & 7u) + 1)};
      for (int l = 0; l < 4; ++l, dst += 8) {
        const uint8_t high = block.qh[2 * g + l / 2] >> (4 * (l % 2));  // index bits, delta sign
        const uint32_t index = block.qs[4 * g + l] | ((high & 7u) << 8);
        store_iq1(kIq1sGrid[index], scales[l / 2], (high & 0x08u) ? -kIq1Delta : kIq1Delta, dst);
      }
    }
  }
}

}  // namespace kiln::avx2
