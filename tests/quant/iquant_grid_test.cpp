// The i-quant tables against entries read from ggml-common.h (iq2xxs_grid, iq2xs_grid,
// iq2s_grid, iq3xxs_grid, iq3s_grid, iq1s_grid as ggml writes them: the row's bytes as one
// little-endian integer), the sign rule against ksigns_iq2xs, and the iq4 levels.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>

#include "quant/iquant_grids.h"

namespace kiln::iquant {
namespace {

template <typename Row>
uint64_t row_as_integer(const Row& row) {
  uint64_t v = 0;
  for (size_t j = 0; j < row.size(); ++j) v |= uint64_t(uint8_t(row[j])) << (8 * j);
  return v;
}

struct GridSample {
  int index;
  uint64_t ggml_value;
};

template <typename Grid>
void expect_rows(const Grid& grid, std::initializer_list<GridSample> samples, const char* name) {
  for (const GridSample& s : samples)
    EXPECT_EQ(row_as_integer(grid.at(s.index)), s.ggml_value)
        << name << "[" << s.index << "]: kiln 0x" << std::hex << row_as_integer(grid.at(s.index))
        << ", ggml 0x" << s.ggml_value;
}

TEST(IquantGrids, MatchGgmlSamples) {
  expect_rows(kIq2xxsGrid, {{0, 0x0808080808080808}, {1, 0x080808080808082b},
                            {17, 0x080808082b080808}, {255, 0x2b2b2b1908081908}},
              "iq2xxs_grid");
  expect_rows(kIq2xsGrid, {{0, 0x0808080808080808}, {7, 0x080808080819192b},
                           {19, 0x0808080819191919}},
              "iq2xs_grid");
  expect_rows(kIq2sGrid, {{984, 0x2b2b080808191908}, {1020, 0x2b2b2b2b082b082b},
                          {1023, 0x2b2b2b2b2b2b2b2b}},
              "iq2s_grid");
  expect_rows(kIq3xxsGrid, {{0, 0x04040404}, {5, 0x04040c3e}, {120, 0x14141404},
                            {255, 0x3e341c04}},
              "iq3xxs_grid");
  expect_rows(kIq3sGrid, {{0, 0x01010101}, {3, 0x0101010b}, {504, 0x0f090307},
                          {511, 0x0f0f0101}},
              "iq3s_grid");
  expect_rows(kIq1sGrid, {{0, 0xffffffffffffffff}, {2044, 0x010101010101ffff},
                          {2047, 0x0101010101010101}},
              "iq1s_grid");
}

TEST(IquantGrids, SignRuleMatchesGgmlTable) {
  // ggml's ksigns_iq2xs at a few indices.
  const std::pair<uint32_t, uint8_t> samples[] = {{0, 0}, {1, 129}, {3, 3}, {7, 135},
                                                  {64, 192}, {126, 126}, {127, 255}};
  for (auto [bits, want] : samples) EXPECT_EQ(sign_mask_from7(bits), want) << "index " << bits;
  for (uint32_t bits = 0; bits < 128; ++bits)
    EXPECT_EQ(std::popcount(unsigned(sign_mask_from7(bits))) % 2, 0) << "index " << bits;
}

TEST(IquantGrids, Iq4LevelsAscend) {
  for (size_t i = 1; i < kIq4Levels.size(); ++i) EXPECT_LT(kIq4Levels[i - 1], kIq4Levels[i]);
}

}  // namespace
}  // namespace kiln::iquant
