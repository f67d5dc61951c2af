// 1- and 2-bit formats with one f16 scale per block. q1_0: 128 signs, value = +-d with
// d = mean |x|. q2_0: 64 levels -1, 0, 1, 2 times d = absmax. Layouts in quant/blocks.h.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/blocks.h"
#include "quant/codec.h"
#include "quant/fast_paths.h"

namespace kiln {
namespace lowbit_family {

void q1_0_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ1_0*>(src);
  for (int64_t i = 0; i < n / 128; ++i, y += 128) {
    const float d = f16_to_f32(blocks[i].d);
    for (int j = 0; j < 128; ++j) y[j] = (blocks[i].qs[j / 8] >> (j % 8)) & 1 ? d : -d;
  }
}

void q2_0_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_0*>(src);
  for (int64_t i = 0; i < n / 64; ++i, y += 64) {
    const float d = f16_to_f32(blocks[i].d);
    for (int j = 0; j < 64; ++j) y[j] = float(((blocks[i].qs[j / 4] >> (2 * (j % 4))) & 3) - 1) * d;
  }
}

void q1_0_from_float(const float* x, void* dst, int64_t n, const float*) {
  auto* blocks = static_cast<BlockQ1_0*>(dst);
  for (int64_t i = 0; i < n / 128; ++i, x += 128) {
    float sum_abs = 0.0f;
    for (int j = 0; j < 128; ++j) sum_abs += std::fabs(x[j]);
    blocks[i].d = f32_to_f16(sum_abs / 128);
    std::memset(blocks[i].qs, 0, 16);
    for (int j = 0; j < 128; ++j)
      if (x[j] >= 0.0f) blocks[i].qs[j / 8] |= uint8_t(1 << (j % 8));
  }
}

void q2_0_from_float(const float* x, void* dst, int64_t n, const float*) {
  auto* blocks = static_cast<BlockQ2_0*>(dst);
  for (int64_t i = 0; i < n / 64; ++i, x += 64) {
    float amax = 0.0f;
    for (int j = 0; j < 64; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float id = amax > 0.0f ? 1.0f / amax : 0.0f;
    blocks[i].d = f32_to_f16(amax);
    std::memset(blocks[i].qs, 0, 16);
    for (int j = 0; j < 64; ++j) {
      const int q = std::clamp(int(std::round(x[j] * id)) + 1, 0, 3);
      blocks[i].qs[j / 4] |= uint8_t(q << (2 * (j % 4)));
    }
  }
}

}  // namespace lowbit_family

std::span<const RowCodec> lowbit_codecs() {
  using namespace lowbit_family;
  static const RowCodec codecs[] = {
      {GgmlType::Q1_0, q1_0_to_float, fast_dequantizer(GgmlType::Q1_0), q1_0_from_float},
      {GgmlType::Q2_0, q2_0_to_float, fast_dequantizer(GgmlType::Q2_0), q2_0_from_float},
  };
  return codecs;
}

}  // namespace kiln
