// `--cpu-weights map|copy`: copying the weights into huge-page memory at load must not
// change what the model computes (greedy text and logits identical to reading them from the
// file: stories260K's 131 KB token embedding is above the copy threshold, so the copied and
// the mapped paths both run), and an unknown mode is refused with the choices.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "run_kiln.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

// The generated text: the output up to the timing summary ("kiln: load ...", stderr).
std::string generated_text(const std::string& output) { return output.substr(0, output.rfind("kiln: load")); }

TEST(KilnCpuWeights, CopyGivesTheSameGreedyTextAsMap) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(model, "models/stories260K.gguf");
  const std::string base = "run --device cpu --temp 0 -n 24 -p 'Once upon a time' -m " + shell_quote(model.string());
  const CommandResult mapped = run_kiln(base + " --cpu-weights map");
  const CommandResult copied = run_kiln(base + " --cpu-weights copy");
  ASSERT_EQ(mapped.exit_code, 0) << mapped.output;
  ASSERT_EQ(copied.exit_code, 0) << copied.output;
  EXPECT_GT(generated_text(mapped.output).size(), 20u) << mapped.output;
  EXPECT_EQ(generated_text(copied.output), generated_text(mapped.output));
}

// kiln logits, bit for bit, on a GGUF file and on a checkpoint directory (whose tensors are
// copied where they load as views of the files).
TEST(KilnCpuWeights, CopyGivesTheSameLogitsAsMap) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(gguf_model, "models/stories260K.gguf");
  KILN_REQUIRE_TESTDATA(hf_model, "arch/hf/llama");
  for (const auto& model : {gguf_model, hf_model}) {
    SCOPED_TRACE(model.string());
    std::string logits[2];
    for (int copy = 0; copy < 2; ++copy) {
      const std::string out = ::testing::TempDir() + "kiln_cpu_weights_" + std::to_string(copy) + ".f32";
      const CommandResult r = run_kiln("logits --device cpu --ids '1 2 3 4 5' -o " + shell_quote(out) +
                                       (copy ? " --cpu-weights copy" : " --cpu-weights map") + " -m " +
                                       shell_quote(model.string()));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      std::ifstream in(out, std::ios::binary);
      logits[copy].assign(std::istreambuf_iterator<char>(in), {});
    }
    EXPECT_GT(logits[0].size(), 0u);
    EXPECT_TRUE(logits[0] == logits[1]) << "the logits differ between --cpu-weights map and copy";
  }
}

TEST(KilnCpuWeights, UnknownModeIsRefused) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(model, "models/stories260K.gguf");
  const CommandResult r =
      run_kiln("run --device cpu -n 2 -p hi --cpu-weights huge -m " + shell_quote(model.string()) + " 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("map,copy"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kiln::testing
