// 4-bit float formats: every value is an E2M1 code (kFp4Doubled, twice the E2M1 value so
// all levels are integers) times a block scale that carries the compensating 1/2.
// mxfp4 (OCP microscaling): 32 values, one E8M0 power-of-two scale. nvfp4: 64 values in
// sub-blocks of 16, each with an unsigned E4M3 scale (ggml keeps NVFP4's per-tensor f32
// scale outside the blocks). Layouts in quant/blocks.h.
#include <algorithm>
#include <bit>
#include <cmath>

#include "quant/blocks.h"
#include "quant/codec.h"
#include "quant/fast_paths.h"

namespace kiln {
namespace fp4_family {

// 2^(e - 128): half the E8M0 value 2^(e - 127). e = 0 and 1 are f32 subnormals.
float e8m0_half(uint8_t e) {
  return std::bit_cast<float>(e < 2 ? uint32_t(0x00200000) << e : uint32_t(e - 1) << 23);
}

// Half the value of an unsigned E4M3 byte (4 exponent bits, bias 7, 3 mantissa bits; bit 7
// ignored). 0x00 and 0x7F (E4M3's NaN) decode as 0.
float ue4m3_half(uint8_t x) {
  if (x == 0 || x == 0x7F) return 0.0f;
  const int exp = (x >> 3) & 0xF, man = x & 7;
  const float raw = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return raw * 0.5f;
}

// Nearest unsigned E4M3 to x (> 0), mantissa rounded half up, saturating at 448.
uint8_t to_ue4m3(float x) {
  if (!(x > 0.0f)) return 0;
  x = std::min(x, 448.0f);
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  int exp = int((bits >> 23) & 0xFF) - 127 + 7;
  if (exp <= 0) {  // subnormal E4M3: man * 2^-9
    const int man = std::min(7, int(x * 512.0f + 0.5f));
    return man < 1 ? 0 : uint8_t(man);
  }
  if (exp >= 15) return 0x7E;
  int man = int((bits >> 20) & 7) + int((bits >> 19) & 1);
  if (man > 7) {
    man = 0;
    if (++exp >= 15) return 0x7E;
  }
  return uint8_t((exp << 3) | man);
}

// The code whose scaled value is nearest x (the lowest code on ties).
uint8_t nearest_fp4(float x, float scale) {
  int best = 0;
  float best_err = std::fabs(kFp4Doubled[0] * scale - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(kFp4Doubled[i] * scale - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return uint8_t(best);
}

void mxfp4_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockMXFP4*>(src);
  for (int64_t i = 0; i < n / 32; ++i, y += 32) {
    const float d = e8m0_half(blocks[i].e);
    for (int j = 0; j < 16; ++j) {
      y[j] = float(kFp4Doubled[blocks[i].qs[j] & 0xF]) * d;
      y[j + 16] = float(kFp4Doubled[blocks[i].qs[j] >> 4]) * d;
    }
  }
}

void nvfp4_to_float(const void* src, float* y, int64_t n) {
  const auto* blocks = static_cast<const BlockNVFP4*>(src);
  for (int64_t i = 0; i < n / 64; ++i)
    for (int s = 0; s < 4; ++s, y += 16) {
      const float d = ue4m3_half(blocks[i].d[s]);
      const uint8_t* q = blocks[i].qs + 8 * s;
      for (int j = 0; j < 8; ++j) {
        y[j] = float(kFp4Doubled[q[j] & 0xF]) * d;
        y[j + 8] = float(kFp4Doubled[q[j] >> 4]) * d;
      }
    }
}

// mxfp4: the scale exponent is floor(log2 absmax) - 2, so the largest code (6 = 2^2 * 1.5)
// covers the absmax.
void mxfp4_from_float(const float* x, void* dst, int64_t n, const float*) {
  auto* blocks = static_cast<BlockMXFP4*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    uint8_t e = 0;
    if (amax > 0.0f) {
      // Clamped so absurdly small or large blocks stay representable.
      const float biased = std::floor(std::log2(amax)) - 2 + 127;
      e = uint8_t(std::clamp(biased, 0.0f, 254.0f));
    }
    const float d = e8m0_half(e);
    blocks[i].e = e;
    for (int j = 0; j < 16; ++j)
      blocks[i].qs[j] = uint8_t(nearest_fp4(x[j], d) | (nearest_fp4(x[j + 16], d) << 4));
  }
}

// nvfp4: each sub-block's scale maps its absmax to the largest code (6).
void nvfp4_from_float(const float* x, void* dst, int64_t n, const float*) {
  auto* blocks = static_cast<BlockNVFP4*>(dst);
  for (int64_t i = 0; i < n / 64; ++i)
    for (int s = 0; s < 4; ++s, x += 16) {
      float amax = 0;
      for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[j]));
      const uint8_t code = to_ue4m3(amax / 6.0f);
      blocks[i].d[s] = code;
      const float d = ue4m3_half(code);
      for (int j = 0; j < 8; ++j)
        blocks[i].qs[8 * s + j] = uint8_t(nearest_fp4(x[j], d) | (nearest_fp4(x[j + 8], d) << 4));
    }
}

}  // namespace fp4_family

std::span<const RowCodec> fp4_codecs() {
  using namespace fp4_family;
  static const RowCodec codecs[] = {
      {GgmlType::MXFP4, mxfp4_to_float, fast_dequantizer(GgmlType::MXFP4), mxfp4_from_float},
      {GgmlType::NVFP4, nvfp4_to_float, fast_dequantizer(GgmlType::NVFP4), nvfp4_from_float},
  };
  return codecs;
}

}  // namespace kiln
