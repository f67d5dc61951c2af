// K-quant quantizers. Each super-block of 256 is fitted in two stages: every sub-block
// gets its own float scale (and min) from a scale search (quant/scale_search.h), then those
// scales are themselves quantized to 4, 6 or 8 bits against the f16 super-block scale, and
// finally every value is re-rounded against the scale it will actually be decoded with.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/blocks.h"
#include "quant/kquants_quantize.h"
#include "quant/scale_search.h"

namespace kiln {
namespace kquant_quantizers {

constexpr int QK = kSuperBlock;
constexpr float kZeroGroup = 1e-15f;

float mean_square(const float* x, int n) {
  float sum = 0;
  for (int j = 0; j < n; ++j) sum += x[j] * x[j];
  return sum / n;
}

// Weights of one sub-block's squared error under an importance vector,
// importance * sqrt(sigma2 + x^2); returns their sum (the sub-block's weight in the
// search for the scales' own scale).
float sub_block_importance(const float* x, const float* importance, float sigma2, int n, float* weights) {
  for (int l = 0; l < n; ++l) weights[l] = importance[l] * std::sqrt(sigma2 + x[l] * x[l]);
  float sum = 0;
  for (int l = 0; l < n; ++l) sum += weights[l];
  return sum;
}

// Packs 2-bit levels: per 128 values, byte l holds values l, l+32, l+64, l+96.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < QK; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = uint8_t(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// Writes the 6-bit scale ls and min lm of sub-block j into a q4_K/q5_K scales array
// (the inverse of kquant_scale_min).
void put_scale_min(int j, uint8_t ls, uint8_t lm, uint8_t* packed) {
  if (j < 4) {
    packed[j] = ls;
    packed[j + 4] = lm;
  } else {
    packed[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
    packed[j - 4] |= uint8_t((ls >> 4) << 6);
    packed[j] |= uint8_t((lm >> 4) << 6);
  }
}

// Re-rounds values against the decoded scales: level = round((x + dmin*m) / (d*sc)).
template <int kSub, int kMax, typename GetScaleMin>
void requantize_asymmetric(const float* x, float d, float dmin, GetScaleMin scale_min, uint8_t* L) {
  for (int j = 0; j < QK / kSub; ++j) {
    uint8_t sc, m;
    scale_min(j, &sc, &m);
    const float dl = d * sc;
    if (!dl) continue;
    const float ml = dmin * m;
    for (int ii = 0; ii < kSub; ++ii)
      L[kSub * j + ii] = uint8_t(std::clamp(round_to_int((x[kSub * j + ii] + ml) / dl), 0, kMax));
  }
}

// ---- q2_K: 16 sub-blocks of 16, 2-bit levels, 4-bit scales and mins -----------------------

void q2_K_block(const float* x, BlockQ2_K& y, const float* importance) {
  uint8_t L[QK], scratch[16], Ls[16], Lm[16];
  float weights[16], scales[16], mins[16];
  if (!importance) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = fit_scale_min(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], scratch, -0.5f, 0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    std::memset(y.scales, 0, 16);
    y.d = f32_to_f16(0.f);
    y.dmin = f32_to_f16(0.f);
    if (max_scale > 0) {
      const float iscale = 15.f / max_scale;
      for (int j = 0; j < 16; ++j) y.scales[j] = uint8_t(round_to_int(iscale * scales[j]));
      y.d = f32_to_f16(max_scale / 15.f);
    }
    if (max_min > 0) {
      const float iscale = 15.f / max_min;
      for (int j = 0; j < 16; ++j) y.scales[j] |= uint8_t(round_to_int(iscale * mins[j]) << 4);
      y.dmin = f32_to_f16(max_min / 15.f);
    }
  } else {
    float sw[16];
    const float sigma2 = mean_square(x, QK);
    for (int j = 0; j < 16; ++j) {
      sw[j] = sub_block_importance(x + 16 * j, importance + 16 * j, sigma2, 16, weights);
      scales[j] = fit_scale_min_weighted(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], scratch, -0.9f, 0.05f, 36, false);
    }
    const float dm = fit_positive(16, 15, scales, Ls, sw);
    const float mm = fit_positive(16, 15, mins, Lm, sw);
    y.d = f32_to_f16(dm);
    y.dmin = f32_to_f16(mm);
    for (int j = 0; j < 16; ++j) y.scales[j] = uint8_t(Ls[j] | (Lm[j] << 4));
  }
  auto scale_min = [&](int j, uint8_t* sc, uint8_t* m) {
    *sc = y.scales[j] & 0xF;
    *m = y.scales[j] >> 4;
  };
  requantize_asymmetric<16, 3>(x, f16_to_f32(y.d), f16_to_f32(y.dmin), scale_min, L);
  pack_2bit(L, y.qs);
}

// ---- q3_K: 16 sub-blocks of 16, 3-bit symmetric levels, 6-bit signed scales ----------------

void put_q3_scale(int j, int l, uint8_t* packed) {
  if (j < 8) packed[j] = uint8_t(l & 0xF);
  else packed[j - 8] |= uint8_t((l & 0xF) << 4);
  packed[j % 4 + 8] |= uint8_t((l >> 4) << (2 * (j / 4)));
}

void q3_K_block(const float* x, BlockQ3_K& y, const float* importance) {
  int8_t L[QK];
  float scales[16];
  std::memset(y.scales, 0, 12);
  if (!importance) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric_refined(16, 4, x + 16 * j, L + 16 * j, true);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_scale) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int8_t l = int8_t(round_to_int(iscale * scales[j]));
        put_q3_scale(j, std::clamp<int>(l, -32, 31) + 32, y.scales);
      }
      y.d = f32_to_f16(1 / iscale);
    } else {
      y.d = f32_to_f16(0.f);
    }
  } else {
    float weights[16], sw[16];
    int8_t Ls[16];
    const float sigma2 = 2 * mean_square(x, QK);
    for (int j = 0; j < 16; ++j) {
      sw[j] = sub_block_importance(x + 16 * j, importance + 16 * j, sigma2, 16, weights);
      scales[j] = fit_symmetric(16, 4, x + 16 * j, L + 16 * j, 1, weights);
    }
    const float d_block = fit_symmetric(16, 32, scales, Ls, 1, sw);
    for (int j = 0; j < 16; ++j) put_q3_scale(j, Ls[j], y.scales);
    y.d = f32_to_f16(d_block);
  }
  // Re-round every value against its decoded scale.
  int8_t sc[16];
  q3k_unpack_scales(y.scales, sc);
  for (int j = 0; j < 16; ++j) {
    const float d = f16_to_f32(y.d) * sc[j];
    if (!d) continue;
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = int8_t(std::clamp(round_to_int(x[16 * j + ii] / d), -4, 3) + 4);
  }
  // Bit 2 of each level goes to hmask (value j: bit j/32 of byte j%32), the rest to qs.
  std::memset(y.hmask, 0, 32);
  uint8_t low[QK];
  for (int j = 0; j < QK; ++j) {
    if (L[j] > 3) y.hmask[j % 32] |= uint8_t(1 << (j / 32));
    low[j] = uint8_t(L[j] > 3 ? L[j] - 4 : L[j]);
  }
  pack_2bit(low, y.qs);
}

// ---- q4_K / q5_K: 8 sub-blocks of 32, asymmetric, 6-bit scales and mins --------------------

template <int kMax, typename Block>
void q45_K_scales(const float* x, Block& y, uint8_t* L, const float* importance) {
  uint8_t scratch[32];
  float weights[32], scales[8], mins[8];
  std::memset(y.scales, 0, 12);
  if (!importance) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
      const float rmin = kMax == 15 ? -1.f : -0.5f;
      const int nstep = kMax == 15 ? 20 : 15;
      scales[j] = fit_scale_min(32, kMax, x + 32 * j, weights, L + 32 * j, &mins[j], scratch, rmin, 0.1f, nstep, false);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; ++j) {
      const uint8_t ls = std::min<uint8_t>(63, uint8_t(round_to_int(inv_scale * scales[j])));
      const uint8_t lm = std::min<uint8_t>(63, uint8_t(round_to_int(inv_min * mins[j])));
      put_scale_min(j, ls, lm, y.scales);
    }
    y.d = f32_to_f16(max_scale / 63.f);
    y.dmin = f32_to_f16(max_min / 63.f);
  } else {
    uint8_t Ls[8], Lm[8];
    float sw[8];
    const float sigma2 = 2 * mean_square(x, QK);
    for (int j = 0; j < 8; ++j) {
      sw[j] = sub_block_importance(x + 32 * j, importance + 32 * j, sigma2, 32, weights);
      scales[j] = fit_scale_min_weighted(32, kMax, x + 32 * j, weights, L + 32 * j, &mins[j], scratch, -0.9f, 0.05f, 36, false);
    }
    const float d_block = fit_positive(8, 63, scales, Ls, sw);
    const float m_block = fit_positive(8, 63, mins, Lm, sw);
    for (int j = 0; j < 8; ++j) put_scale_min(j, std::min<uint8_t>(63, Ls[j]), std::min<uint8_t>(63, Lm[j]), y.scales);
    y.d = f32_to_f16(d_block);
    y.dmin = f32_to_f16(m_block);
  }
  auto scale_min = [&](int j, uint8_t* sc, uint8_t* m) { kquant_scale_min(j, y.scales, sc, m); };
  requantize_asymmetric<32, kMax>(x, f16_to_f32(y.d), f16_to_f32(y.dmin), scale_min, L);
}

void q4_K_block(const float* x, BlockQ4_K& y, const float* importance) {
  uint8_t L[QK];
  q45_K_scales<15>(x, y, L, importance);
  for (int j = 0; j < QK; j += 64)
    for (int l = 0; l < 32; ++l) y.qs[j / 2 + l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
}

void q5_K_block(const float* x, BlockQ5_K& y, const float* importance) {
  uint8_t L[QK];
  q45_K_scales<31>(x, y, L, importance);
  std::memset(y.qh, 0, 32);
  for (int j = 0; j < QK; j += 64) {
    const int bit = j / 32;  // sub-block index of the first 32 of these 64
    for (int l = 0; l < 32; ++l) {
      const uint8_t l1 = L[j + l], l2 = L[j + l + 32];
      y.qh[l] |= uint8_t(((l1 >> 4) << bit) | ((l2 >> 4) << (bit + 1)));
      y.qs[j / 2 + l] = uint8_t((l1 & 0xF) | ((l2 & 0xF) << 4));
    }
  }
}

// ---- q6_K: 16 sub-blocks of 16, 6-bit symmetric levels, 8-bit scales ----------------------

void q6_K_block(const float* x, BlockQ6_K& y, const float* importance) {
  int8_t L[QK];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int j = 0; j < 16; ++j) {
    const float* qw = importance ? importance + 16 * j : nullptr;
    scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j, 1, qw);
    if (std::fabs(scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  if (max_abs_scale < kZeroGroup) {
    std::memset(&y, 0, sizeof(y));
    return;
  }
  const float iscale = -128.f / max_scale;
  y.d = f32_to_f16(1 / iscale);
  for (int j = 0; j < 16; ++j) y.scales[j] = int8_t(std::min(127, round_to_int(iscale * scales[j])));
  for (int j = 0; j < 16; ++j) {
    const float d = f16_to_f32(y.d) * y.scales[j];
    if (!d) continue;
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = int8_t(std::clamp(round_to_int(x[16 * j + ii] / d), -32, 31) + 32);
  }
  for (int half = 0; half < 2; ++half) {
    const int8_t* Lh = L + 128 * half;
    uint8_t* ql = y.ql + 64 * half;
    uint8_t* qh = y.qh + 32 * half;
    for (int l = 0; l < 32; ++l) {
      ql[l] = uint8_t((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
      ql[l + 32] = uint8_t((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
      qh[l] = uint8_t((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
    }
  }
}

// ---- q8_K: f32 scale, q = round(-127 * x / max) -------------------------------------------

void q8_K_block(const float* x, BlockQ8_K& y) {
  float max = 0, amax = 0;
  for (int j = 0; j < QK; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  if (!amax) {
    std::memset(&y, 0, sizeof(y));
    return;
  }
  // 127 rather than 128 keeps every level in -127..127 (symmetric for the SIMD dot products).
  const float iscale = -127.f / max;
  for (int j = 0; j < QK; ++j) y.qs[j] = int8_t(std::min(127, round_to_int(iscale * x[j])));
  for (int j = 0; j < 16; ++j) {
    int sum = 0;
    for (int ii = 0; ii < 16; ++ii) sum += y.qs[16 * j + ii];
    y.bsums[j] = int16_t(sum);
  }
  y.d = 1 / iscale;
}

template <typename Block, typename Fn>
void each_block(const float* src, void* dst, int64_t n, const float* importance, Fn fn) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / QK; ++i)
    fn(src + i * QK, blocks[i], importance ? importance + i * QK : nullptr);
}

}  // namespace kquant_quantizers

void quantize_q2_K(const float* src, void* dst, int64_t n, const float* importance) {
  kquant_quantizers::each_block<BlockQ2_K>(src, dst, n, importance, kquant_quantizers::q2_K_block);
}
void quantize_q3_K(const float* src, void* dst, int64_t n, const float* importance) {
  kquant_quantizers::each_block<BlockQ3_K>(src, dst, n, importance, kquant_quantizers::q3_K_block);
}
void quantize_q4_K(const float* src, void* dst, int64_t n, const float* importance) {
  kquant_quantizers::each_block<BlockQ4_K>(src, dst, n, importance, kquant_quantizers::q4_K_block);
}
void quantize_q5_K(const float* src, void* dst, int64_t n, const float* importance) {
  kquant_quantizers::each_block<BlockQ5_K>(src, dst, n, importance, kquant_quantizers::q5_K_block);
}
void quantize_q6_K(const float* src, void* dst, int64_t n, const float* importance) {
  kquant_quantizers::each_block<BlockQ6_K>(src, dst, n, importance, kquant_quantizers::q6_K_block);
}
void quantize_q8_K(const float* src, void* dst, int64_t n, const float*) {
  kquant_quantizers::each_block<BlockQ8_K>(src, dst, n, nullptr,
                                           [](const float* x, BlockQ8_K& y, const float*) { kquant_quantizers::q8_K_block(x, y); });
}

}  // namespace kiln
