// kiln's quantizers on the zoo's source matrix (16 x 512, row 7 all zeros): the round trip
// (quantize, then the reference dequantizer) must come within 2% of ggml's own round-trip
// RMSE for the type, and for the types where kiln reproduces ggml's bytes exactly, that is
// asserted too so a regression shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "quant/quant.h"
#include "quant/zoo.h"
#include "support/testdata.h"

namespace kiln {
namespace {

using testing::ZooEntry;

// RMSE tolerance: kiln may be at most this much worse than ggml.
constexpr double kRmseSlack = 1.02;

// Types whose quantized bytes equal ggml's <type>.q exactly.
const std::set<std::string> kByteIdentical = {
    "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K",
    "q5_K", "q6_K", "tq1_0", "tq2_0", "mxfp4", "nvfp4", "q1_0", "q2_0",
};

std::vector<ZooEntry> entries_or_placeholder() {
  std::vector<ZooEntry> entries = testing::zoo_index();
  if (entries.empty()) entries.push_back(ZooEntry{.name = "absent"});
  return entries;
}

class ZooQuantize : public ::testing::TestWithParam<ZooEntry> {};

TEST_P(ZooQuantize, RoundTripMeetsGgmlRmse) {
  const ZooEntry& e = GetParam();
  KILN_REQUIRE_TESTDATA(src_path, "quant/zoo/src.f32");
  KILN_REQUIRE_TESTDATA(imatrix_path, "quant/zoo/imatrix.f32");
  KILN_REQUIRE_TESTDATA(q_path, "quant/zoo/" + e.name + ".q");
  const std::optional<TypeTraits> traits = type_traits(e.id);
  ASSERT_TRUE(traits) << "unknown ggml type id " << e.id;
  const GgmlType type = traits->type;
  if (!can_quantize(type)) GTEST_SKIP() << "kiln cannot quantize into " << e.name << " (yet)";

  const std::vector<float> src = testing::read_floats(src_path);
  const std::vector<float> imatrix = testing::read_floats(imatrix_path);
  const std::vector<uint8_t> ggml_bytes = testing::read_bytes(q_path);
  ASSERT_EQ(src.size(), size_t(e.rows * e.cols));
  ASSERT_EQ(imatrix.size(), size_t(e.cols));
  const size_t row_size = *row_bytes(type, e.cols);
  std::vector<float> back;
  const std::vector<uint8_t> bytes =
      testing::quantize_round_trip(type, src, e.rows, e.cols, e.uses_imatrix ? imatrix.data() : nullptr, &back);
  double sum = 0;
  for (size_t i = 0; i < src.size(); ++i) sum += (double(back[i]) - src[i]) * (double(back[i]) - src[i]);
  const double rmse = std::sqrt(sum / double(src.size()));

  size_t first_diff = bytes.size();
  for (size_t i = 0; i < bytes.size() && i < ggml_bytes.size(); ++i)
    if (bytes[i] != ggml_bytes[i]) {
      first_diff = i;
      break;
    }
  const bool identical = bytes.size() == ggml_bytes.size() && first_diff == bytes.size();
  std::printf("  %-8s rmse %.6g  ggml %.6g  ratio %.4f  bytes %s\n", e.name.c_str(), rmse, e.rmse,
              rmse / e.rmse, identical ? "identical to ggml" : "differ");

  EXPECT_LE(rmse, e.rmse * kRmseSlack) << e.name << ": kiln's round-trip RMSE vs ggml's";
  if (kByteIdentical.count(e.name)) {
    EXPECT_TRUE(identical) << e.name << ": quantized bytes differ from ggml's, first at byte " << first_diff
                           << " (row " << first_diff / row_size << ", block "
                           << (first_diff % row_size) / traits->type_size << "): kiln "
                           << int(bytes[first_diff]) << ", ggml " << int(ggml_bytes[first_diff]);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ZooQuantize, ::testing::ValuesIn(entries_or_placeholder()),
                         [](const auto& info) { return testing::test_name_of(info.param.name); });

}  // namespace
}  // namespace kiln
