// `kiln bench`: llama-bench's JSON records (one per test, in its order: every -p value, then
// every -n value), their fields and their arithmetic, the markdown table's rows, and errors
// for arguments that measure nothing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "run_kiln.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

nlohmann::json bench_json(const std::string& model, const std::string& args) {
  const CommandResult r = run_kiln("bench -m " + shell_quote(model) + " " + args + " -o json 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output, nullptr, /*allow_exceptions=*/false);
}

TEST(KilnBench, JsonRecordsFollowTheListsInLlamaBenchOrder) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(model, "models/stories260K.gguf");
  const nlohmann::json records = bench_json(model.string(), "-p 8,16 -n 0,4 -r 2 --cache-type f32");
  ASSERT_TRUE(records.is_array()) << records.dump();
  ASSERT_EQ(records.size(), 3u);
  const int want[3][2] = {{8, 0}, {16, 0}, {0, 4}};
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& r = records[i];
    EXPECT_EQ(r["n_prompt"].get<int>(), want[i][0]) << "record " << i;
    EXPECT_EQ(r["n_gen"].get<int>(), want[i][1]) << "record " << i;
    EXPECT_EQ(r["type_k"].get<std::string>(), "f32");
    const std::vector<double> samples = r["samples_ts"].get<std::vector<double>>();
    ASSERT_EQ(samples.size(), 2u) << "record " << i;
    for (double s : samples) EXPECT_GT(s, 0.0);
    const double mean = std::accumulate(samples.begin(), samples.end(), 0.0) / double(samples.size());
    EXPECT_NEAR(r["avg_ts"].get<double>(), mean, 1e-9 * mean) << "record " << i;
    EXPECT_GE(r["stddev_ts"].get<double>(), 0.0);
    EXPECT_EQ(r["samples_ns"].size(), 2u);
  }
  EXPECT_EQ(records[2]["tg_tokens"].get<std::string>(), "device");
  EXPECT_FALSE(records[0].contains("tg_tokens"));

  const nlohmann::json host = bench_json(model.string(), "-p 0 -n 4 -r 1 --host-tokens");
  ASSERT_TRUE(host.is_array() && host.size() == 1u) << host.dump();
  EXPECT_EQ(host[0]["tg_tokens"].get<std::string>(), "host");
}

TEST(KilnBench, MarkdownTableHasOneRowPerTest) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(model, "models/stories260K.gguf");
  const CommandResult r = run_kiln("bench -m " + shell_quote(model.string()) + " -p 8 -n 2,3 -r 1 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* test : {" pp8 |", " tg2 |", " tg3 |"}) EXPECT_NE(r.output.find(test), std::string::npos) << test;
  EXPECT_EQ(r.output.find(" tg128 |"), std::string::npos);
}

TEST(KilnBench, ArgumentsThatMeasureNothingAreErrors) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(model, "models/stories260K.gguf");
  const CommandResult none = run_kiln("bench -m " + shell_quote(model.string()) + " -p 0 -n 0");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("nothing to measure"), std::string::npos) << none.output;
  const CommandResult negative = run_kiln("bench -m " + shell_quote(model.string()) + " -p 8,-4 -n 0");
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_NE(negative.output.find("cannot be negative"), std::string::npos) << negative.output;
}

}  // namespace
}  // namespace kiln::testing
