// Dequantization of every type in the zoo against ggml's own output, bit for bit, through
// the public API: both the scalar reference and dequantize_row (the SIMD path where one
// exists). A type kiln has no codec for fails, naming itself.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "quant/codec.h"
#include "quant/quant.h"
#include "quant/zoo.h"
#include "support/testdata.h"

namespace kiln {
namespace {

using testing::ZooEntry;

// Same bits, or both NaN (ggml and kiln may differ in NaN payloads).
bool same_float(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}

std::vector<ZooEntry> entries_or_placeholder() {
  std::vector<ZooEntry> entries = testing::zoo_index();
  if (entries.empty()) entries.push_back(ZooEntry{.name = "absent"});
  return entries;
}

class ZooDequant : public ::testing::TestWithParam<ZooEntry> {};

TEST_P(ZooDequant, MatchesGgmlBitForBit) {
  const ZooEntry& e = GetParam();
  KILN_REQUIRE_TESTDATA(index, "quant/zoo/index.tsv");
  KILN_REQUIRE_TESTDATA(q_path, "quant/zoo/" + e.name + ".q");
  KILN_REQUIRE_TESTDATA(deq_path, "quant/zoo/" + e.name + ".deq.f32");

  const std::optional<TypeTraits> traits = type_traits(e.id);
  ASSERT_TRUE(traits) << "kiln does not know ggml type id " << e.id << " (" << e.name << ")";
  ASSERT_EQ(traits->name, e.name);
  const GgmlType type = traits->type;
  ASSERT_NE(find_codec(type), nullptr) << "no codec for " << e.name;

  const std::vector<uint8_t> q = testing::read_bytes(q_path);
  const std::vector<float> expected = testing::read_floats(deq_path);
  const size_t row_size = *row_bytes(type, e.cols);
  ASSERT_EQ(q.size(), row_size * e.rows);
  ASSERT_EQ(expected.size(), size_t(e.rows * e.cols));

  for (const bool fast : {false, true}) {
    std::vector<float> got(expected.size());
    for (int64_t r = 0; r < e.rows; ++r) {
      float* out = got.data() + r * e.cols;
      if (fast) dequantize_row(type, q.data() + r * row_size, out, e.cols);
      else dequantize_row_reference(type, q.data() + r * row_size, out, e.cols);
    }
    int mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (same_float(got[i], expected[i])) continue;
      if (mismatches++ == 0)
        ADD_FAILURE() << e.name << (fast ? " dequantize_row" : " reference") << ": first mismatch at row "
                      << i / e.cols << " col " << i % e.cols << ": kiln " << got[i] << " (0x" << std::hex
                      << std::bit_cast<uint32_t>(got[i]) << "), ggml " << std::dec << expected[i] << " (0x"
                      << std::hex << std::bit_cast<uint32_t>(expected[i]) << std::dec << ")";
    }
    EXPECT_EQ(mismatches, 0) << e.name << (fast ? " dequantize_row" : " reference") << ": values differing";
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ZooDequant, ::testing::ValuesIn(entries_or_placeholder()),
                         [](const auto& info) { return testing::test_name_of(info.param.name); });

}  // namespace
}  // namespace kiln
