#pragma once
// The fixed tables of ggml's i-quant formats: the lattice grids that iq1/iq2/iq3 weights
// index into, the sign-byte rule of iq2/iq3, and the 16 non-linear levels of iq4.
//
// A grid row holds the magnitudes of 8 (iq1, iq2) or 4 (iq3) consecutive weights; the
// rows are in ggml's order, so a stored index selects the same row as in ggml.
#include <array>
#include <bit>
#include <cstdint>

namespace kiln::iquant {

using GridRow8 = std::array<uint8_t, 8>;
using GridRow4 = std::array<uint8_t, 4>;
using SignedGridRow8 = std::array<int8_t, 8>;

extern const std::array<GridRow8, 256> kIq2xxsGrid;       // levels 8, 25, 43
extern const std::array<GridRow8, 512> kIq2xsGrid;        // levels 8, 25, 43
extern const std::array<GridRow8, 1024> kIq2sGrid;        // levels 8, 25, 43
extern const std::array<GridRow4, 256> kIq3xxsGrid;       // levels 4, 12, .., 52, 62
extern const std::array<GridRow4, 512> kIq3sGrid;         // levels 1, 3, .., 15
extern const std::array<SignedGridRow8, 2048> kIq1sGrid;  // levels -1, 0, 1 (iq1_s and iq1_m)

// iq2/iq3 store 7 sign bits per 8 weights; the 8th is implied: the number of negative
// weights in the group is even. Returns the full 8-bit mask (bit j set: weight j negative).
constexpr uint8_t sign_mask_from7(uint32_t seven_bits) {
  const uint32_t s = seven_bits & 0x7fu;
  return uint8_t(s | ((std::popcount(s) & 1u) << 7));
}

// The 16 levels of iq4_nl and iq4_xs (ggml's kvalues_iq4nl), ascending.
inline constexpr std::array<int8_t, 16> kIq4Levels = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The constant offset iq1_s and iq1_m add to every grid level (IQ1S_DELTA, IQ1M_DELTA).
inline constexpr float kIq1Delta = 0.125f;

}  // namespace kiln::iquant
