// The original ggml formats: blocks of 32 values with one f16 scale (and a min for the _1
// kinds). Layouts in quant/blocks.h. Dequantizers do ggml's arithmetic in ggml's order
// (int level converted to float, times d, plus m), so results match ggml bit for bit.
// Quantizers follow ggml's reference rounding; with an importance vector, the 4- and 5-bit
// kinds search their scale (and min) for the least importance-weighted error.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/blocks.h"
#include "quant/codec.h"
#include "quant/fast_paths.h"
#include "quant/scale_search.h"

namespace kiln {
namespace legacy_family {

constexpr int kBlock = 32;

template <typename Block>
const Block* blocks_of(const void* src) { return static_cast<const Block*>(src); }
template <typename Block>
Block* blocks_of(void* dst) { return static_cast<Block*>(dst); }

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- dequantizers ------------------------------------------------------------------------

void q4_0_to_float(const void* src, float* y, int64_t n) {
  const auto* b = blocks_of<BlockQ4_0>(src);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = float((b[i].qs[j] & 0xF) - 8) * d;
      y[j + 16] = float((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void q4_1_to_float(const void* src, float* y, int64_t n) {
  const auto* b = blocks_of<BlockQ4_1>(src);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = float(b[i].qs[j] & 0xF) * d + m;
      y[j + 16] = float(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void q5_0_to_float(const void* src, float* y, int64_t n) {
  const auto* b = blocks_of<BlockQ5_0>(src);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int hi0 = int((qh >> j) & 1) << 4, hi1 = int((qh >> (j + 16)) & 1) << 4;
      y[j] = float(((b[i].qs[j] & 0xF) | hi0) - 16) * d;
      y[j + 16] = float(((b[i].qs[j] >> 4) | hi1) - 16) * d;
    }
  }
}

void q5_1_to_float(const void* src, float* y, int64_t n) {
  const auto* b = blocks_of<BlockQ5_1>(src);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int hi0 = int((qh >> j) & 1) << 4, hi1 = int((qh >> (j + 16)) & 1) << 4;
      y[j] = float((b[i].qs[j] & 0xF) | hi0) * d + m;
      y[j + 16] = float((b[i].qs[j] >> 4) | hi1) * d + m;
    }
  }
}

void q8_0_to_float(const void* src, float* y, int64_t n) {
  const auto* b = blocks_of<BlockQ8_0>(src);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kBlock; ++j) y[j] = float(b[i].qs[j]) * d;
  }
}

void q8_1_to_float(const void* src, float* y, int64_t n) {
  const auto* b = blocks_of<BlockQ8_1>(src);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kBlock; ++j) y[j] = float(b[i].qs[j]) * d;
  }
}

// ---- quantizers ---------------------------------------------------------------------------

// The signed value of largest magnitude (the first one on ties).
float signed_absmax(const float* x, int n) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return max;
}

// Packs 5-bit levels: low nibbles as in q4, bit 4 of element j into bit j of qh.
void pack_5bit(const uint8_t* L, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = uint8_t((L[j] & 0xF) | ((L[j + 16] & 0xF) << 4));
    qh |= uint32_t((L[j] >> 4) & 1) << j;
    qh |= uint32_t((L[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh_bytes, &qh, 4);
}

// sigma^2 of a row: the importance-weighted searches weight each value by
// importance * sqrt(sigma^2 + x^2).
float mean_square(const float* x, int64_t n) {
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += x[j] * x[j];
  return sum / n;
}

void importance_weights(const float* x, const float* importance, float sigma2, float* w) {
  for (int j = 0; j < kBlock; ++j) w[j] = importance[j] * std::sqrt(sigma2 + x[j] * x[j]);
}

// Symmetric 2^bits levels, the extreme value mapped to the lowest level.
template <int kBits>
void symmetric_levels(const float* x, uint8_t* L, float* d_out) {
  constexpr int half = 1 << (kBits - 1), top = (1 << kBits) - 1;
  const float d = signed_absmax(x, kBlock) / -half;
  const float id = d ? 1.0f / d : 0.0f;
  for (int j = 0; j < kBlock; ++j)
    L[j] = uint8_t(std::min(top, int(int8_t(x[j] * id + (half + 0.5f)))));
  *d_out = d;
}

// Levels 0..2^bits-1 between the block's min and max.
template <int kBits>
void min_max_levels(const float* x, uint8_t* L, float* d_out, float* min_out) {
  constexpr int top = (1 << kBits) - 1;
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < kBlock; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / top;
  const float id = d ? 1.0f / d : 0.0f;
  for (int j = 0; j < kBlock; ++j) {
    const float v = (x[j] - min) * id;
    L[j] = kBits == 4 ? uint8_t(std::min(top, int(int8_t(v + 0.5f)))) : uint8_t(v + 0.5f);
  }
  *d_out = d;
  *min_out = min;
}

// One block of a symmetric kind (q4_0, q5_0): its levels, and the scale it returns. With
// the block's importance row, the scale is searched for the least weighted error;
// without (nullptr), ggml's reference rounding.
template <int kBits>
float symmetric_block(const float* x, const float* importance, float sigma2, uint8_t* L) {
  float d;
  if (importance) {
    float w[kBlock];
    importance_weights(x, importance, sigma2, w);
    d = fit_symmetric(kBlock, 1 << (kBits - 1), x, reinterpret_cast<int8_t*>(L), 1, w);
  } else {
    symmetric_levels<kBits>(x, L, &d);
  }
  return d;
}

// One block of a kind with a min (q4_1, q5_1): levels, the min in *min_out, the scale
// returned; searched with an importance row, ggml's reference rounding without.
template <int kBits>
float min_max_block(const float* x, const float* importance, float sigma2, uint8_t* L, float* min_out) {
  float d;
  if (importance) {
    float w[kBlock], neg_min;
    uint8_t scratch[kBlock];
    importance_weights(x, importance, sigma2, w);
    d = fit_scale_min_weighted(kBlock, (1 << kBits) - 1, x, w, L, &neg_min, scratch, -0.9f, 0.05f, 36, false);
    *min_out = -neg_min;
  } else {
    min_max_levels<kBits>(x, L, &d, min_out);
  }
  return d;
}

void q4_0_from_float(const float* x, void* dst, int64_t n, const float* importance) {
  auto* b = blocks_of<BlockQ4_0>(dst);
  const float sigma2 = importance ? mean_square(x, n) : 0;
  for (int64_t i = 0; i < n / kBlock; ++i, x += kBlock) {
    uint8_t L[kBlock];
    const float d = symmetric_block<4>(x, importance ? importance + i * kBlock : nullptr, sigma2, L);
    b[i].d = f32_to_f16(d);
    for (int j = 0; j < 16; ++j) b[i].qs[j] = uint8_t(L[j] | (L[j + 16] << 4));
  }
}

void q4_1_from_float(const float* x, void* dst, int64_t n, const float* importance) {
  auto* b = blocks_of<BlockQ4_1>(dst);
  const float sigma2 = importance ? mean_square(x, n) : 0;
  for (int64_t i = 0; i < n / kBlock; ++i, x += kBlock) {
    uint8_t L[kBlock];
    float min;
    const float d = min_max_block<4>(x, importance ? importance + i * kBlock : nullptr, sigma2, L, &min);
    b[i].d = f32_to_f16(d);
    b[i].m = f32_to_f16(min);
    for (int j = 0; j < 16; ++j) b[i].qs[j] = uint8_t(L[j] | (L[j + 16] << 4));
  }
}

void q5_0_from_float(const float* x, void* dst, int64_t n, const float* importance) {
  auto* b = blocks_of<BlockQ5_0>(dst);
  const float sigma2 = importance ? mean_square(x, n) : 0;
  for (int64_t i = 0; i < n / kBlock; ++i, x += kBlock) {
    uint8_t L[kBlock];
    const float d = symmetric_block<5>(x, importance ? importance + i * kBlock : nullptr, sigma2, L);
    b[i].d = f32_to_f16(d);
    pack_5bit(L, b[i].qs, b[i].qh);
  }
}

void q5_1_from_float(const float* x, void* dst, int64_t n, const float* importance) {
  auto* b = blocks_of<BlockQ5_1>(dst);
  const float sigma2 = importance ? mean_square(x, n) : 0;
  for (int64_t i = 0; i < n / kBlock; ++i, x += kBlock) {
    uint8_t L[kBlock];
    float min;
    const float d = min_max_block<5>(x, importance ? importance + i * kBlock : nullptr, sigma2, L, &min);
    b[i].d = f32_to_f16(d);
    b[i].m = f32_to_f16(min);
    pack_5bit(L, b[i].qs, b[i].qh);
  }
}

// q8: d = absmax / 127, q = round(x / d) (halves away from zero).
float q8_scale_and_levels(const float* x, int8_t* q) {
  float amax = 0;
  for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d ? 1.0f / d : 0.0f;
  for (int j = 0; j < kBlock; ++j) q[j] = int8_t(std::round(x[j] * id));
  return d;
}

void q8_0_from_float(const float* x, void* dst, int64_t n, const float*) {
  auto* b = blocks_of<BlockQ8_0>(dst);
  for (int64_t i = 0; i < n / kBlock; ++i, x += kBlock) b[i].d = f32_to_f16(q8_scale_and_levels(x, b[i].qs));
}

void q8_1_from_float(const float* x, void* dst, int64_t n, const float*) {
  auto* b = blocks_of<BlockQ8_1>(dst);
  for (int64_t i = 0; i < n / kBlock; ++i, x += kBlock) {
    const float d = q8_scale_and_levels(x, b[i].qs);
    int sum = 0;
    for (int j = 0; j < kBlock; ++j) sum += b[i].qs[j];
    b[i].d = f32_to_f16(d);
    b[i].s = f32_to_f16(float(sum) * d);
  }
}

}  // namespace legacy_family

std::span<const RowCodec> legacy_codecs() {
  using namespace legacy_family;
  static const RowCodec codecs[] = {
      {GgmlType::Q4_0, q4_0_to_float, fast_dequantizer(GgmlType::Q4_0), q4_0_from_float},
      {GgmlType::Q4_1, q4_1_to_float, fast_dequantizer(GgmlType::Q4_1), q4_1_from_float},
      {GgmlType::Q5_0, q5_0_to_float, fast_dequantizer(GgmlType::Q5_0), q5_0_from_float},
      {GgmlType::Q5_1, q5_1_to_float, fast_dequantizer(GgmlType::Q5_1), q5_1_from_float},
      {GgmlType::Q8_0, q8_0_to_float, fast_dequantizer(GgmlType::Q8_0), q8_0_from_float},
      {GgmlType::Q8_1, q8_1_to_float, fast_dequantizer(GgmlType::Q8_1), q8_1_from_float},
  };
  return codecs;
}

}  // namespace kiln
