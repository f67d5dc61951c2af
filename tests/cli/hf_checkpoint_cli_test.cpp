// The kiln binary on Hugging Face checkpoint directories (testdata/arch/hf/<name>/, which
// hold no tokenizer files): `kiln logits -m DIR` reproduces transformers' logits, and
// `kiln run -m DIR` says clearly that it needs a tokenizer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cli/run_kiln.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

std::vector<float> read_floats(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

class CliCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(CliCheckpoint, LogitsOfADirectoryMatchTransformers) {
  KILN_REQUIRE_BINARY();
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(config, "arch/hf/" + name + "/config.json");
  std::ifstream ref_in(ref_path);
  const nlohmann::json ref = nlohmann::json::parse(ref_in);
  KILN_REQUIRE_TESTDATA(expected_path, "arch/" + ref["logits_file"].get<std::string>());
  std::string ids;
  for (int id : ref["ids"]) ids += std::to_string(id) + " ";
  const fs::path out = fs::temp_directory_path() / ("kiln_cli_hf_" + name + std::to_string(::getpid()) + ".f32");
  // In two chunks, so the recurrent state of qwen3next is carried across passes too; an f32
  // cache, as every comparison with transformers' float32 logits.
  const CommandResult r = run_kiln("logits --device cpu --cache-type f32 -b 13 -m " +
                                   shell_quote(config.parent_path().string()) +
                                   " --ids " + shell_quote(ids) + " -o " + shell_quote(out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<float> ours = read_floats(out), theirs = read_floats(expected_path);
  fs::remove(out);
  const int64_t vocab = ref["logits_shape"][1], first = ref["logits_first_position"];
  ASSERT_EQ(int64_t(ours.size()), int64_t(ref["ids"].size()) * vocab);
  for (int64_t row = 0; row < int64_t(ref["logits_shape"][0]); ++row) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double a = ours[size_t((first + row) * vocab + i)], b = theirs[size_t(row * vocab + i)];
      diff += (a - b) * (a - b), norm += b * b;
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-4) << name << " position " << first + row;
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, CliCheckpoint, ::testing::Values("llama", "qwen3moe", "qwen3next"));

TEST(CliCheckpoint, RunWithoutTokenizerFilesSaysWhatToDo) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(config, "arch/hf/llama/config.json");
  const CommandResult r = run_kiln("run --device cpu -n 2 -p hello -m " + shell_quote(config.parent_path().string()));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer.json"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kiln logits"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kiln::testing
