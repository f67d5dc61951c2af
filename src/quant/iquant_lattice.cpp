// Scalar dequantizers of the lattice i-quants: iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s,
// iq1_s, iq1_m. Each group of 8 (or 4) weights is one grid row times a scale, with signs
// (iq2, iq3) or a shifted ternary level (iq1).
//
// Bit-exactness with ggml: every weight is formed with the same float operations in the
// same order as ggml's dequantize_row_iq*, e.g. ((d * (0.5f + s)) * 0.25f) * level * (+-1).
#include <cstring>

#include "core/half.h"
#include "quant/iquant_blocks.h"
#include "quant/iquant_grids.h"
#include "quant/iquant_kernels.h"

namespace kiln::iquant {
namespace {

// ggml multiplies by -1.f or 1.f rather than negating; kept, so that even NaN scales from a
// corrupt file give the same bits.
inline float lattice_sign(uint8_t sign_mask, int j) {
  return (sign_mask >> j) & 1u ? -1.f : 1.f;
}

// The scale of a 4-bit sub-block scale `s` in iq2 types: d * (s + 1/2) / 4.
inline float iq2_group_scale(float d, uint32_t s) { return d * (0.5f + float(s)) * 0.25f; }

// iq3: eight weights from two 4-wide grid rows under one 8-bit sign mask (bits 0-3 for
// the first row, 4-7 for the second).
inline void put_two_signed_rows(float scale, const GridRow4& first, const GridRow4& second, uint8_t signs,
                                float* dst) {
  for (int j = 0; j < 4; ++j) {
    dst[j] = scale * first[j] * lattice_sign(signs, j);
    dst[j + 4] = scale * second[j] * lattice_sign(signs, j + 4);
  }
}

}  // namespace

void dequantize_iq2_xxs(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq2xxs>(src, b);
    const float d = f16_to_f32(block.d);
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      uint32_t words[2];  // [0]: 4 grid indices; [1]: 4 x 7 sign bits, scale in bits 28-31
      std::memcpy(words, block.qs + 4 * g, sizeof(words));
      const float scale = iq2_group_scale(d, words[1] >> 28);
      for (int l = 0; l < 4; ++l) {
        const GridRow8& row = kIq2xxsGrid[(words[0] >> (8 * l)) & 0xffu];
        const uint8_t signs = sign_mask_from7(words[1] >> (7 * l));
        for (int j = 0; j < 8; ++j) *dst++ = scale * row[j] * lattice_sign(signs, j);
      }
    }
  }
}

void dequantize_iq2_xs(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq2xs>(src, b);
    const float d = f16_to_f32(block.d);
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      const float scales[2] = {iq2_group_scale(d, block.scales[g] & 0xfu),
                               iq2_group_scale(d, block.scales[g] >> 4)};
      for (int l = 0; l < 4; ++l) {
        const uint16_t packed = block.qs[4 * g + l];  // 9-bit index, 7 sign bits
        const GridRow8& row = kIq2xsGrid[packed & 511u];
        const uint8_t signs = sign_mask_from7(packed >> 9);
        for (int j = 0; j < 8; ++j) *dst++ = scales[l / 2] * row[j] * lattice_sign(signs, j);
      }
    }
  }
}

void dequantize_iq2_s(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq2s>(src, b);
    const float d = f16_to_f32(block.d);
    const uint8_t* index_low = block.qs;
    const uint8_t* sign_bytes = block.qs + kSuperBlock / 8;
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      const float scales[2] = {iq2_group_scale(d, block.scales[g] & 0xfu),
                               iq2_group_scale(d, block.scales[g] >> 4)};
      for (int l = 0; l < 4; ++l) {
        const uint32_t index = index_low[4 * g + l] | (((block.qh[g] >> (2 * l)) & 3u) << 8);
        const GridRow8& row = kIq2sGrid[index];
        const uint8_t signs = sign_bytes[4 * g + l];
        for (int j = 0; j < 8; ++j) *dst++ = scales[l / 2] * row[j] * lattice_sign(signs, j);
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
      const float scale = d * (0.5f + float(word >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = sign_mask_from7(word >> (7 * l));
        put_two_signed_rows(scale, kIq3xxsGrid[indices[8 * g + 2 * l]], kIq3xxsGrid[indices[8 * g + 2 * l + 1]],
                            signs, dst);
        dst += 8;
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
      const float scale = d * float(1 + 2 * s);
      const uint8_t high_bits = block.qh[g];  // 9th index bit of the group's 8 indices
      for (int l = 0; l < 4; ++l) {
        const uint32_t i0 = block.qs[8 * g + 2 * l] | (((high_bits >> (2 * l)) & 1u) << 8);
        const uint32_t i1 = block.qs[8 * g + 2 * l + 1] | (((high_bits >> (2 * l + 1)) & 1u) << 8);
        put_two_signed_rows(scale, kIq3sGrid[i0], kIq3sGrid[i1], block.signs[4 * g + l], dst);
        dst += 8;
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
      for (int l = 0; l < 4; ++l) {
        const uint32_t index = block.qs[4 * g + l] | (((high >> (3 * l)) & 7u) << 8);
        const SignedGridRow8& row = kIq1sGrid[index];
        for (int j = 0; j < 8; ++j) *dst++ = scale * (float(row[j]) + delta);
      }
    }
  }
}

void dequantize_iq1_m(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq1m>(src, b);
    uint16_t packed[4];  // 4 x (3 + 3 + 3 + 3 scale bits, one nibble of the half scale)
    std::memcpy(packed, block.scales, sizeof(packed));
    const uint16_t d_bits = uint16_t((packed[0] >> 12) | ((packed[1] >> 8) & 0x00f0u) |
                                     ((packed[2] >> 4) & 0x0f00u) | (packed[3] & 0xf000u));
    const float d = f16_to_f32(d_bits);
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      const uint32_t s = packed[g / 2] >> (6 * (g % 2));
      const float scales[2] = {d * float(2 * (s & 7u) + 1), d * float(2 * ((s >> 3) & 7u) + 1)};
      for (int l = 0; l < 4; ++l) {
        const uint8_t high = block.qh[2 * g + l / 2] >> (4 * (l % 2));  // index bits, delta sign
        const uint32_t index = block.qs[4 * g + l] | ((high & 7u) << 8);
        const float delta = (high & 0x08u) ? -kIq1Delta : kIq1Delta;
        const SignedGridRow8& row = kIq1sGrid[index];
        for (int j = 0; j < 8; ++j) *dst++ = scales[l / 2] * (float(row[j]) + delta);
      }
    }
  }
}

}  // namespace kiln::iquant
