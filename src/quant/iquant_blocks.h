#pragma once
// On-disk block layouts of ggml's i-quant types, byte for byte (little-endian). Scales
// named `d` are IEEE halves (core/half.h). All types but iq4_nl cover a super-block of
// 256 weights, processed as 8 groups of 32.
//
// Kernels copy a block out of the row with memcpy before reading it: rows inside a
// mapped file need not be aligned for the uint16 fields.
#include <cstdint>
#include <cstring>

namespace kiln::iquant {

inline constexpr int kSuperBlock = 256;  // ggml's QK_K
inline constexpr int kGroup = 32;        // weights per sub-block scale
inline constexpr int kIq4nlBlock = 32;   // ggml's QK4_NL

// 2.06 bits/weight. Per group of 32: two uint32 words; the first holds 4 grid indices
// (one byte per 8 weights), the second 4 x 7 sign bits and a 4-bit scale on top.
struct BlockIq2xxs {
  uint16_t d;
  uint16_t qs[kSuperBlock / 8];
};

// 2.31 bits/weight. One uint16 per 8 weights: 9-bit grid index, 7 sign bits on top.
// One byte of scales per group: low nibble for its first 16 weights, high for the rest.
struct BlockIq2xs {
  uint16_t d;
  uint16_t qs[kSuperBlock / 8];
  uint8_t scales[kSuperBlock / 32];
};

// 2.56 bits/weight. qs: 32 low bytes of 10-bit grid indices, then 32 sign bytes (all 8
// signs stored). qh: the 2 high index bits of each group's 4 indices. Scales as iq2_xs.
struct BlockIq2s {
  uint16_t d;
  uint8_t qs[kSuperBlock / 4];
  uint8_t qh[kSuperBlock / 32];
  uint8_t scales[kSuperBlock / 32];
};

// 3.06 bits/weight. qs: 64 grid indices (one byte per 4 weights), then per group one
// uint32 of 4 x 7 sign bits and a 4-bit scale on top.
struct BlockIq3xxs {
  uint16_t d;
  uint8_t qs[3 * kSuperBlock / 8];
};

// 3.44 bits/weight. 9-bit grid indices (one per 4 weights): low bytes in qs, the 9th bits
// in qh (one byte per group); all 8 signs per 8 weights stored; one 4-bit scale per group.
struct BlockIq3s {
  uint16_t d;
  uint8_t qs[kSuperBlock / 4];
  uint8_t qh[kSuperBlock / 32];
  uint8_t signs[kSuperBlock / 8];
  uint8_t scales[kSuperBlock / 64];
};

// 1.56 bits/weight. 11-bit indices into the ternary grid: low bytes in qs; per group a
// uint16 with 4 x 3 high index bits, a 3-bit scale (bits 12-14) and the delta sign (bit 15).
struct BlockIq1s {
  uint16_t d;
  uint8_t qs[kSuperBlock / 8];
  uint16_t qh[kSuperBlock / 32];
};

// 1.75 bits/weight. As iq1_s, but each qh byte carries for two groups of 8 weights the
// 3 high index bits and the delta sign (bit 3 / bit 7); scales: 3 bits per 16 weights,
// and the half-precision super-block scale spread over the top nibbles of the 4 uint16.
struct BlockIq1m {
  uint8_t qs[kSuperBlock / 8];
  uint8_t qh[kSuperBlock / 16];
  uint8_t scales[kSuperBlock / 32];
};

// 4.5 bits/weight, blocks of 32. Nibble indices into kIq4Levels: byte j holds weight j
// (low nibble) and weight j + 16 (high nibble).
struct BlockIq4nl {
  uint16_t d;
  uint8_t qs[kIq4nlBlock / 2];
};

// 4.25 bits/weight. Per group a 6-bit scale (stored minus 32): low 4 bits in scales_l
// (two groups per byte), high 2 bits in scales_h; nibbles packed as in iq4_nl per group.
struct BlockIq4xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kSuperBlock / 64];
  uint8_t qs[kSuperBlock / 2];
};

// Block `index` of a row starting at `row` (any alignment).
template <typename Block>
Block load_block(const void* row, int64_t index) {
  Block block;
  std::memcpy(&block, static_cast<const uint8_t*>(row) + index * int64_t(sizeof(Block)),
              sizeof(Block));
  return block;
}

static_assert(sizeof(BlockIq2xxs) == 66);
static_assert(sizeof(BlockIq2xs) == 74);
static_assert(sizeof(BlockIq2s) == 82);
static_assert(sizeof(BlockIq3xxs) == 98);
static_assert(sizeof(BlockIq3s) == 110);
static_assert(sizeof(BlockIq1s) == 50);
static_assert(sizeof(BlockIq1m) == 56);
static_assert(sizeof(BlockIq4nl) == 18);
static_assert(sizeof(BlockIq4xs) == 136);

}  // namespace kiln::iquant
