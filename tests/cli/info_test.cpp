// `kiln info` on every GGUF of the reference data, and on corrupted copies of one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "cli/run_kiln.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

std::vector<char> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_all(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

TEST(CliInfo, ReadsEveryReferenceGguf) {
  KILN_REQUIRE_BINARY();
  const fs::path root = testdata_root();
  if (root.empty()) GTEST_SKIP() << "reference data absent";
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".gguf") continue;
    ++files;
    const CommandResult text = run_kiln("info " + shell_quote(entry.path().string()));
    EXPECT_EQ(text.exit_code, 0) << entry.path() << "\n" << text.output;
    EXPECT_NE(text.output.find("architecture:"), std::string::npos) << entry.path();
    const CommandResult json = run_kiln("info --json " + shell_quote(entry.path().string()));
    EXPECT_EQ(json.exit_code, 0) << entry.path() << "\n" << json.output;
    EXPECT_NE(json.output.find("\"tensors\""), std::string::npos) << entry.path();
  }
  EXPECT_GT(files, 20);
}

TEST(CliInfo, ShowsFactsOfStories260K) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(model, "models/stories260K.gguf");
  const CommandResult r = run_kiln("info " + shell_quote(model.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Facts stated by the reference data's README: 5 layers, 8 heads, 4 KV heads, FFN 172, vocab 512.
  EXPECT_NE(r.output.find("llama.block_count                            5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("llama.feed_forward_length                    172"), std::string::npos);
  EXPECT_NE(r.output.find("llama.attention.head_count_kv                4"), std::string::npos);
  EXPECT_NE(r.output.find("[512 x string]"), std::string::npos);
}

TEST(CliInfo, CorruptFilesFailWithAMessage) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(model, "models/stories260K.gguf");
  const std::vector<char> good = read_all(model);
  const fs::path dir = fs::temp_directory_path() / ("kiln-info-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);

  struct Case { const char* name; std::vector<char> bytes; const char* expect; };
  std::vector<Case> cases;
  cases.push_back({"truncated-header.gguf", {good.begin(), good.begin() + 100}, "truncated"});
  cases.push_back({"truncated-data.gguf", {good.begin(), good.end() - 1000}, "past the end"});
  std::vector<char> magic = good;
  magic[0] = 'X';
  cases.push_back({"bad-magic.gguf", magic, "not a GGUF file"});
  std::vector<char> version = good;
  version[4] = 9;
  cases.push_back({"bad-version.gguf", version, "unknown GGUF version 9"});
  std::vector<char> count = good;
  count[15] = 0x7f;  // tensor count ~ 2^62
  cases.push_back({"absurd-count.gguf", count, "cannot fit"});
  cases.push_back({"empty.gguf", {}, "truncated"});

  for (const Case& c : cases) {
    const fs::path p = dir / c.name;
    write_all(p, c.bytes);
    const CommandResult r = run_kiln("info " + shell_quote(p.string()));
    EXPECT_EQ(r.exit_code, 1) << c.name << "\n" << r.output;
    EXPECT_NE(r.output.find("kiln: error:"), std::string::npos) << c.name << "\n" << r.output;
    EXPECT_NE(r.output.find(c.name), std::string::npos) << "message should name the file: " << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.name << ": expected '" << c.expect << "' in\n" << r.output;
  }
  const CommandResult missing = run_kiln("info " + shell_quote((dir / "absent.gguf").string()));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("cannot open"), std::string::npos) << missing.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::testing
