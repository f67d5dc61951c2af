#pragma once
// IEEE half (f16) and bfloat16 conversions, bit-exact with the hardware instructions and
// with ggml's scalar code: f32->f16 rounds to nearest even; f32->bf16 rounds to nearest
// even and keeps NaNs quiet.
#include <bit>
#include <cstdint>
#include <cstring>

namespace kiln {

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: value = mant * 2^-24, exact in f32.
    const float v = float(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // nan
  if (abs >= 0x477ff000u) {
    // >= 65520 rounds to inf (65504 is the largest half).
    return uint16_t(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: round abs * 2^24 to an integer, nearest even.
    const float v = std::bit_cast<float>(abs) * 0x1p24f;
    // v < 1024, so adding 2^23 rounds to integer with the current (nearest-even) mode.
    const float r = (v + 0x1p23f) - 0x1p23f;
    return uint16_t(sign | uint32_t(r));
  }
  // Normal: rebias exponent, round mantissa to 10 bits, nearest even.
  uint32_t m = abs + 0xc8000000u;                // exponent - 112
  m += 0x0fffu + ((m >> 13) & 1u);
  return uint16_t(sign | (m >> 13));
}

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 64);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

}  // namespace kiln
