// The K-quants: super-blocks of 256 values cut into 16 or 8 sub-blocks, each with its own
// small integer scale (and min) that is itself scaled by the super-block's f16 d (dmin).
// Layouts in quant/blocks.h; quantizers in quant/kquants_quantize.cpp. Dequantizers do
// ggml's arithmetic in ggml's order: sub-block scale dl = d * scale first, then dl * q - ml.
#include "core/half.h"
#include "quant/blocks.h"
#include "quant/codec.h"
#include "quant/fast_paths.h"
#include "quant/kquants_quantize.h"

namespace kiln {
namespace kquant_family {

constexpr int QK = kSuperBlock;

// q2_K: value = (d * scale) * q - (dmin * min), sub-blocks of 16.
void q2_K_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockQ2_K& b = blocks[i];
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int e = 0; e < QK; e += 16) {
      const int sub = e / 16;
      const float dl = d * float(b.scales[sub] & 0xF), ml = dmin * float(b.scales[sub] >> 4);
      const int half = e / 128, shift = 2 * ((e % 128) / 32);
      for (int l = 0; l < 16; ++l) {
        const int q = (b.qs[32 * half + (e % 32) + l] >> shift) & 3;
        y[e + l] = dl * float(q) - ml;
      }
    }
    y += QK;
  }
}

// q3_K: value = (d * (scale - 32)) * (q - 4), sub-blocks of 16.
void q3_K_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ3_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockQ3_K& b = blocks[i];
    const float d = f16_to_f32(b.d);
    int8_t scales[16];
    q3k_unpack_scales(b.scales, scales);
    for (int e = 0; e < QK; e += 16) {
      const float dl = d * float(scales[e / 16]);
      const int half = e / 128, shift = 2 * ((e % 128) / 32);
      for (int l = 0; l < 16; ++l) {
        const int k = (e % 32) + l;  // byte within the 32-byte lanes
        const int low = (b.qs[32 * half + k] >> shift) & 3;
        const int high = (b.hmask[k] >> (e / 32)) & 1;
        y[e + l] = dl * float(low - (high ? 0 : 4));
      }
    }
    y += QK;
  }
}

// q4_K and q5_K: value = (d * scale) * q - (dmin * min), sub-blocks of 32 with 4-bit
// levels; q5_K (kFifthBit) adds bit `sub` of qh[l] as the level's fifth bit.
template <class Block, bool kFifthBit>
void scale_min_32_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / QK; ++i) {
    const Block& b = blocks[i];
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int sub = 0; sub < 8; ++sub) {
      uint8_t sc, m;
      kquant_scale_min(sub, b.scales, &sc, &m);
      const float dl = d * float(sc), ml = dmin * float(m);
      const uint8_t* q = b.qs + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; ++l) {
        int level = (q[l] >> shift) & 0xF;
        if constexpr (kFifthBit) level += ((b.qh[l] >> sub) & 1) << 4;
        y[32 * sub + l] = dl * float(level) - ml;
      }
    }
    y += QK;
  }
}

void q4_K_to_float(const void* src, float* y, int64_t n) { scale_min_32_to_float<BlockQ4_K, false>(src, y, n); }
void q5_K_to_float(const void* src, float* y, int64_t n) { scale_min_32_to_float<BlockQ5_K, true>(src, y, n); }

// q6_K: value = (d * scale) * (q - 32), sub-blocks of 16.
void q6_K_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i) {
    const BlockQ6_K& b = blocks[i];
    const float d = f16_to_f32(b.d);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b.ql + 64 * half;
      const uint8_t* qh = b.qh + 32 * half;
      const int8_t* sc = b.scales + 8 * half;
      float* out = y + 128 * half;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        out[l] = d * float(sc[is]) * float(q1);
        out[l + 32] = d * float(sc[is + 2]) * float(q2);
        out[l + 64] = d * float(sc[is + 4]) * float(q3);
        out[l + 96] = d * float(sc[is + 6]) * float(q4);
      }
    }
    y += QK;
  }
}

// q8_K: value = d * q with an f32 d.
void q8_K_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / QK; ++i, y += QK)
    for (int j = 0; j < QK; ++j) y[j] = blocks[i].d * float(blocks[i].qs[j]);
}

}  // namespace kquant_family

std::span<const RowCodec> kquant_codecs() {
  using namespace kquant_family;
  static const RowCodec codecs[] = {
      {GgmlType::Q2_K, q2_K_to_float, fast_dequantizer(GgmlType::Q2_K), quantize_q2_K},
      {GgmlType::Q3_K, q3_K_to_float, fast_dequantizer(GgmlType::Q3_K), quantize_q3_K},
      {GgmlType::Q4_K, q4_K_to_float, fast_dequantizer(GgmlType::Q4_K), quantize_q4_K},
      {GgmlType::Q5_K, q5_K_to_float, fast_dequantizer(GgmlType::Q5_K), quantize_q5_K},
      {GgmlType::Q6_K, q6_K_to_float, fast_dequantizer(GgmlType::Q6_K), quantize_q6_K},
      {GgmlType::Q8_K, q8_K_to_float, nullptr, quantize_q8_K},
  };
  return codecs;
}

}  // namespace kiln
