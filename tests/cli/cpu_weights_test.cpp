// `--cpu-weights map|copy`: copying the weights into huge-page memory at load must not
// change what the model computes (greedy text identical to reading them from the file:
// stories260K's 131 KB token embedding is above the copy threshold, so the copied and the
// mapped paths both run), and an unknown mode is refused with the choices.
#include <gtest/gtest.h>

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
