// Ternary formats (BitNet b1.58, TriLM): every value is -d, 0 or +d with one f16 d per 256
// values (d = absmax of the block). tq1_0 packs 5 trits per byte (1.69 bits/value),
// tq2_0 2 bits per trit. Layouts in quant/blocks.h.
#include <algorithm>
#include <cmath>

#include "core/half.h"
#include "quant/blocks.h"
#include "quant/codec.h"
#include "quant/fast_paths.h"

namespace kiln {
namespace ternary_family {

constexpr int QK = kSuperBlock;
constexpr uint8_t kPow3[6] = {1, 3, 9, 27, 81, 243};

// Trit n (0 = most significant) of a tq1_0 byte: multiplying by 3^n shifts the base-3
// fraction left by n trits (mod 256); the next trit is then the top of byte * 3.
int trit(uint8_t packed, int n) {
  const uint8_t shifted = uint8_t(packed * kPow3[n]);
  return (shifted * 3) >> 8;
}

void tq1_0_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockTQ1_0*>(src);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockTQ1_0& b = blocks[i];
    const float d = f16_to_f32(b.d);
    for (int t = 0; t < 5; ++t)
      for (int m = 0; m < 32; ++m) *y++ = float(trit(b.qs[m], t) - 1) * d;
    for (int t = 0; t < 5; ++t)
      for (int m = 0; m < 16; ++m) *y++ = float(trit(b.qs[32 + m], t) - 1) * d;
    for (int t = 0; t < 4; ++t)
      for (int m = 0; m < 4; ++m) *y++ = float(trit(b.qh[m], t) - 1) * d;
  }
}

void tq2_0_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockTQ2_0*>(src);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockTQ2_0& b = blocks[i];
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < 64; j += 32)
      for (int shift = 0; shift < 8; shift += 2)
        for (int m = 0; m < 32; ++m) *y++ = float(((b.qs[j + m] >> shift) & 3) - 1) * d;
  }
}

// d = absmax; returns 1/d (0 for an all-zero block).
float absmax_scale(const float* x, uint16_t* d_out) {
  float amax = 0;
  for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
  *d_out = f32_to_f16(amax);
  return amax ? 1.0f / amax : 0.0f;
}

// -1, 0, +1 -> 0, 1, 2.
int to_trit(float x, float id) { return int(std::lround(x * id)) + 1; }

// Packs `count` trits (first most significant, padded to 5 by `pad` extra x3) into a byte
// holding ceil(N * 256 / 243), the base-3 fraction scaled to a byte.
uint8_t pack_trits(const int* trits, int count) {
  int q = 0;
  for (int t = 0; t < count; ++t) q = q * 3 + trits[t];
  for (int t = count; t < 5; ++t) q *= 3;
  return uint8_t((q * 256 + 242) / 243);
}

void tq1_0_from_float(const float* x, void* dst, int64_t n, const float*) {
  auto* blocks = static_cast<BlockTQ1_0*>(dst);
  for (int64_t i = 0; i < n / QK; ++i, x += QK) {
    BlockTQ1_0& b = blocks[i];
    const float id = absmax_scale(x, &b.d);
    int trits[5];
    for (int m = 0; m < 32; ++m) {
      for (int t = 0; t < 5; ++t) trits[t] = to_trit(x[m + 32 * t], id);
      b.qs[m] = pack_trits(trits, 5);
    }
    for (int m = 0; m < 16; ++m) {
      for (int t = 0; t < 5; ++t) trits[t] = to_trit(x[160 + m + 16 * t], id);
      b.qs[32 + m] = pack_trits(trits, 5);
    }
    for (int m = 0; m < 4; ++m) {
      for (int t = 0; t < 4; ++t) trits[t] = to_trit(x[240 + m + 4 * t], id);
      b.qh[m] = pack_trits(trits, 4);
    }
  }
}

void tq2_0_from_float(const float* x, void* dst, int64_t n, const float*) {
  auto* blocks = static_cast<BlockTQ2_0*>(dst);
  for (int64_t i = 0; i < n / QK; ++i, x += QK) {
    BlockTQ2_0& b = blocks[i];
    const float id = absmax_scale(x, &b.d);
    for (int j = 0; j < 64; j += 32)
      for (int m = 0; m < 32; ++m) {
        int q = 0;
        for (int t = 0; t < 4; ++t) q |= (to_trit(x[4 * j + m + 32 * t], id) & 3) << (2 * t);
        b.qs[j + m] = uint8_t(q);
      }
  }
}

}  // namespace ternary_family

std::span<const RowCodec> ternary_codecs() {
  using namespace ternary_family;
  static const RowCodec codecs[] = {
      {GgmlType::TQ1_0, tq1_0_to_float, fast_dequantizer(GgmlType::TQ1_0), tq1_0_from_float},
      {GgmlType::TQ2_0, tq2_0_to_float, fast_dequantizer(GgmlType::TQ2_0), tq2_0_from_float},
  };
  return codecs;
}

}  // namespace kiln
