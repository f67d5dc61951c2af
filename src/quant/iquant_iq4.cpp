// iq4_nl and iq4_xs: 4-bit indices into 16 non-linear levels (kIq4Levels), with one
// half-precision scale per block of 32 (iq4_nl), or a half super-block scale and 6-bit
// group scales (iq4_xs). Scalar reference dequantizers, and the quantizer, which follows
// ggml's algorithm (quantize_iq4_nl / quantize_iq4_xs) step for step so that it produces
// the same bytes.
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/iquant_blocks.h"
#include "quant/iquant_grids.h"
#include "quant/iquant_kernels.h"

namespace kiln::iquant {
namespace {

// Below this, a group is treated as all zeros (ggml's GROUP_MAX_EPS).
constexpr float kIq4ZeroGroup = 1e-15f;
// The scale search tries the scales that map the group's extreme weight to the lowest
// level shifted by -7..7.
constexpr int kIq4ScaleTries = 7;

// Index of the level nearest to x; ties go to the upper level. Compares 2x with the sum of
// neighbouring levels, both exact in float, by binary search over the 15 midpoints.
inline int nearest_iq4_level(float x) {
  const float twice = x + x;
  int index = 0;
  for (int step = 8; step > 0; step /= 2) {
    const int upper = index + step;
    if (twice >= float(kIq4Levels[upper - 1] + kIq4Levels[upper])) index = upper;
  }
  return index;
}

// Rounds half to even, as ggml's nearest_int (valid for |x| < 2^22).
inline int round_half_even(float x) { return int(std::nearbyint(x)); }

// One super-block (`size` weights, groups of 32) of the iq4 quantizer.
// Out: `d` (half), per-group scale codes when there are several groups, 4-bit indices.
struct Iq4Encoded {
  uint16_t d = 0;
  uint16_t scales_h = 0;
  uint8_t scales_l[kSuperBlock / 64] = {};
  uint8_t qs[kSuperBlock / 2] = {};
};

// Weighted least-squares scale of one group for the levels chosen at inverse scale `inv`:
// returns sum(w q x) and sum(w q q) over the group.
struct GroupFit {
  float sum_qx = 0;
  float sum_qq = 0;
};

GroupFit fit_group(const float* x, const float* weight, float inv, uint8_t* levels_out) {
  GroupFit fit;
  for (int j = 0; j < kGroup; ++j) {
    const int l = nearest_iq4_level(inv * x[j]);
    if (levels_out) levels_out[j] = uint8_t(l);
    const float q = kIq4Levels[l];
    fit.sum_qx += weight[j] * q * x[j];
    fit.sum_qq += weight[j] * q * q;
  }
  return fit;
}

// The best scale of one group of 32: start from the scale that maps the extreme weight to
// the lowest level, then try 2 * kIq4ScaleTries + 1 nearby inverse scales and keep the one
// with the largest sum(wqx)^2 / sum(wqq) (smallest weighted squared error).
float best_group_scale(const float* x, const float* weight) {
  float amax = 0, extreme = 0;  // largest |x|, and x there (its first occurrence)
  for (int j = 0; j < kGroup; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      extreme = x[j];
    }
  }
  if (amax < kIq4ZeroGroup) return 0.f;
  const float lowest = kIq4Levels[0];
  GroupFit fit = fit_group(x, weight, 1 / (-extreme / lowest), nullptr);
  float scale = fit.sum_qq > 0 ? fit.sum_qx / fit.sum_qq : 0.f;
  float best = scale * fit.sum_qx;
  for (int t = -kIq4ScaleTries; t <= kIq4ScaleTries; ++t) {
    const float inv = float(t + kIq4Levels[0]) / extreme;
    fit = fit_group(x, weight, inv, nullptr);
    if (fit.sum_qq > 0 && fit.sum_qx * fit.sum_qx > best * fit.sum_qq) {
      scale = fit.sum_qx / fit.sum_qq;
      best = scale * fit.sum_qx;
    }
  }
  return scale;
}

// Quantizes `size` weights (32 for iq4_nl, 256 for iq4_xs). `importance` may be null.
Iq4Encoded encode_iq4(const float* x, int size, const float* importance) {
  const int groups = size / kGroup;
  // Weights of the squared error: with an importance vector, importance * sqrt(sigma2 + x^2)
  // (sigma2 = twice the mean square); without, x^2.
  float sigma2 = 0;
  for (int j = 0; j < size; ++j) sigma2 += x[j] * x[j];
  sigma2 *= 2.f / size;

  float scales[kSuperBlock / kGroup];
  float max_scale = 0, amax_scale = 0;  // the group scale of largest magnitude, signed
  for (int g = 0; g < groups; ++g) {
    const float* xg = x + g * kGroup;
    float weight[kGroup];
    for (int j = 0; j < kGroup; ++j)
      weight[j] = importance ? importance[g * kGroup + j] * std::sqrt(sigma2 + xg[j] * xg[j])
                             : xg[j] * xg[j];
    scales[g] = best_group_scale(xg, weight);
    if (std::fabs(scales[g]) > amax_scale) {
      amax_scale = std::fabs(scales[g]);
      max_scale = scales[g];
    }
  }

  Iq4Encoded out;
  uint8_t levels[kSuperBlock];
  if (groups > 1) {
    // Group scales become 6-bit multiples of d = -max_scale / 32, in [-32, 31]; the
    // indices are then chosen again for the scale actually stored.
    const float d = -max_scale / 32;
    out.d = f32_to_f16(d);
    const float inv_d = d ? 1 / d : 0.f;
    for (int g = 0; g < groups; ++g) {
      int l = round_half_even(inv_d * scales[g]);
      l = l < -32 ? -32 : (l > 31 ? 31 : l);
      const float group_d = d * l;
      const float inv = group_d ? 1 / group_d : 0.f;
      for (int j = 0; j < kGroup; ++j)
        levels[g * kGroup + j] = uint8_t(nearest_iq4_level(inv * x[g * kGroup + j]));
      const uint32_t code = uint32_t(l + 32);
      out.scales_l[g / 2] |= uint8_t((code & 0xfu) << (4 * (g % 2)));
      out.scales_h |= uint16_t((code >> 4) << (2 * g));
    }
  } else {
    out.d = f32_to_f16(scales[0]);
    const float inv = scales[0] ? 1 / scales[0] : 0.f;
    for (int j = 0; j < size; ++j) levels[j] = uint8_t(nearest_iq4_level(inv * x[j]));
  }
  for (int g = 0; g < groups; ++g)
    for (int j = 0; j < kGroup / 2; ++j)
      out.qs[16 * g + j] = uint8_t(levels[32 * g + j] | (levels[32 * g + 16 + j] << 4));
  return out;
}

}  // namespace

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kIq4nlBlock; ++b) {
    const auto block = load_block<BlockIq4nl>(src, b);
    const float d = f16_to_f32(block.d);
    for (int j = 0; j < kIq4nlBlock / 2; ++j) {
      dst[j] = d * kIq4Levels[block.qs[j] & 0xf];
      dst[j + kIq4nlBlock / 2] = d * kIq4Levels[block.qs[j] >> 4];
    }
    dst += kIq4nlBlock;
  }
}

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const auto block = load_block<BlockIq4xs>(src, b);
    const float d = f16_to_f32(block.d);
    for (int g = 0; g < kSuperBlock / kGroup; ++g) {
      const int code = ((block.scales_l[g / 2] >> (4 * (g % 2))) & 0xf) |
                       (((block.scales_h >> (2 * g)) & 3) << 4);
      const float scale = d * float(code - 32);
      const uint8_t* qs = block.qs + 16 * g;
      for (int j = 0; j < 16; ++j) {
        dst[j] = scale * kIq4Levels[qs[j] & 0xf];
        dst[j + 16] = scale * kIq4Levels[qs[j] >> 4];
      }
      dst += kGroup;
    }
  }
}

void quantize_iq4_nl(const float* src, void* dst, int64_t n, const float* importance) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / kIq4nlBlock; ++b) {
    const int64_t first = b * kIq4nlBlock;
    const Iq4Encoded e = encode_iq4(src + first, kIq4nlBlock, importance ? importance + first : nullptr);
    BlockIq4nl block;
    block.d = e.d;
    std::memcpy(block.qs, e.qs, sizeof(block.qs));
    std::memcpy(out + b * sizeof(BlockIq4nl), &block, sizeof(block));
  }
}

void quantize_iq4_xs(const float* src, void* dst, int64_t n, const float* importance) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const int64_t first = b * kSuperBlock;
    const Iq4Encoded e = encode_iq4(src + first, kSuperBlock, importance ? importance + first : nullptr);
    BlockIq4xs block;
    block.d = e.d;
    block.scales_h = e.scales_h;
    std::memcpy(block.scales_l, e.scales_l, sizeof(block.scales_l));
    std::memcpy(block.qs, e.qs, sizeof(block.qs));
    std::memcpy(out + b * sizeof(BlockIq4xs), &block, sizeof(block));
  }
}

}  // namespace kiln::iquant
