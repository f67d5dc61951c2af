#pragma once
// The on-disk block layouts of the ggml quantized types kiln reads and writes (all but
// the i-quants, which live beside their codecs). Each struct is exactly the bytes of one
// block, little-endian, with no padding; `half` fields hold IEEE f16 bits (core/half.h).
// The comment on each struct says what a value is made of; the family files hold the
// arithmetic.
#include <cstdint>

namespace kiln {

inline constexpr int kSuperBlock = 256;  // QK_K: elements of every K-quant super-block

// ---- legacy formats: blocks of 32 -------------------------------------------------------

// q4_0: value = (q - 8) * d, q in 0..15. qs[j] holds element j (low nibble) and j + 16.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
// q4_1: value = q * d + m, q in 0..15; nibbles as in q4_0.
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[16];
};
// q5_0: value = (q - 16) * d, q in 0..31: low 4 bits as in q4_0, bit 4 of element j is
// bit j of the little-endian 32-bit word qh.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
// q5_1: value = q * d + m, bits as in q5_0.
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
// q8_0: value = q * d, q signed 8-bit.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
// q8_1: as q8_0, plus s = d * sum(q) (f16) for the dot products' min correction.
struct BlockQ8_1 {
  uint16_t d, s;
  int8_t qs[32];
};

// ---- K-quants: super-blocks of 256 ------------------------------------------------------

// q2_K: 16 sub-blocks of 16. scales[i]: low nibble = scale, high nibble = min of sub-block
// i. value = d * scale * q - dmin * min, q in 0..3. qs: for each half of 128 elements,
// byte l (0..31) holds elements l, l+32, l+64, l+96 in bit pairs 0-1, 2-3, 4-5, 6-7.
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};
// q3_K: 16 sub-blocks of 16. value = d * (scale - 32) * (q - 4), q in 0..7: two low bits
// packed as in q2_K, the high bit of element j is bit (j / 32) of hmask[j % 32]. The 16
// 6-bit scales: low 4 bits in nibbles of scales[0..7] (low nibble: sub-blocks 0..7, high
// nibble: 8..15), high 2 bits of sub-block i in bits 2*(i/4) of scales[8 + i%4].
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
// q4_K: 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min packed in 12 bytes
// (see kquant_scale_min). value = d * scale * q - dmin * min, q in 0..15. qs: for each
// 64 elements, 32 bytes: low nibbles hold the first 32, high nibbles the next 32.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
// q5_K: as q4_K with q in 0..31; bit 4 of element 64*g + l (+32) is bit 2g (2g+1) of qh[l].
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// q6_K: 16 sub-blocks of 16 with signed 8-bit scales. value = d * scale * (q - 32), q in
// 0..63. Per half of 128: ql[l] low nibble = element l, high = l+64; ql[l+32] low = l+32,
// high = l+96; qh[l] bit pairs 0,2,4,6 are the top bits of elements l, l+32, l+64, l+96.
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
// q8_K: activation format of the K-quant dot products. value = q * d with an f32 d;
// bsums[i] = sum of q over elements 16i..16i+15.
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

// ---- ternary (BitNet b1.58 / TriLM): value = (t - 1) * d, t in 0..2 ----------------------

// tq1_0: trits packed 5 per byte as a base-3 fraction: byte = ceil(N * 256 / 243) where N
// is the 5-trit number (first trit most significant); trit n is ((byte * 3^n mod 256) * 3)
// >> 8. qs[0..31] cover elements 0..159 (trit n of byte m = element 32n + m), qs[32..47]
// cover 160..239 (element 160 + 16n + m), qh[0..3] hold 4 trits each for 240..255
// (element 240 + 4n + j).
struct BlockTQ1_0 {
  uint8_t qs[48];
  uint8_t qh[4];
  uint16_t d;
};
// tq2_0: 2 bits per trit; per 128 elements, byte m holds elements m, m+32, m+64, m+96.
struct BlockTQ2_0 {
  uint8_t qs[64];
  uint16_t d;
};

// ---- 4-bit floats (E2M1 codes, table kFp4Doubled) ---------------------------------------

// mxfp4: 32 values; e is an E8M0 power of two 2^(e-127); value = kFp4Doubled[q] * 2^(e-128)
// (the table is twice E2M1). qs[j]: low nibble = element j, high nibble = element j + 16.
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[16];
};
// nvfp4: 64 values in 4 sub-blocks of 16, each scaled by an unsigned E4M3 d[s];
// value = kFp4Doubled[q] * ue4m3(d[s]) / 2. Sub-block s uses qs[8s..8s+7]: low nibble =
// element j, high nibble = element j + 8.
struct BlockNVFP4 {
  uint8_t d[4];
  uint8_t qs[32];
};

// ---- sign and 2-bit formats --------------------------------------------------------------

// q1_0: 128 values; bit j of the little-endian bit string qs set -> +d, clear -> -d.
struct BlockQ1_0 {
  uint16_t d;
  uint8_t qs[16];
};
// q2_0: 64 values; value = (q - 1) * d with q in 0..3 (-d, 0, d, 2d); element j is bits
// 2*(j%4) of qs[j/4].
struct BlockQ2_0 {
  uint16_t d;
  uint8_t qs[16];
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockTQ1_0) == 54 && sizeof(BlockTQ2_0) == 66);
static_assert(sizeof(BlockMXFP4) == 17 && sizeof(BlockNVFP4) == 36);
static_assert(sizeof(BlockQ1_0) == 18 && sizeof(BlockQ2_0) == 18);

// E2M1 code -> twice its value (so every level is an integer): 0 .5 1 1.5 2 3 4 6 doubled,
// then the same negated (code 8 is -0, stored as 0).
inline constexpr int8_t kFp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// The 6-bit scale and min of sub-block j (0..7) of a q4_K / q5_K super-block. Sub-blocks
// 0..3 keep them in the low 6 bits of bytes j and j+4; sub-blocks 4..7 keep their low 4 bits
// in the nibbles of byte j+4 and their top 2 bits in the spare top bits of bytes j-4 and j.
inline void kquant_scale_min(int j, const uint8_t* packed, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = uint8_t((packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4));
    *min = uint8_t((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
  }
}

// The 16 signed 6-bit scales of a q3_K super-block, unpacked (already minus 32).
inline void q3k_unpack_scales(const uint8_t* packed, int8_t* out) {
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? (packed[i] & 0xF) : (packed[i - 8] >> 4);
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    out[i] = int8_t((low | (high << 4)) - 32);
  }
}

}  // namespace kiln
