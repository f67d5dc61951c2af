// llama.cpp's tokenizer test vectors: for each ggml-vocab-<name>.gguf, every string of
// <name>.gguf.inp must encode (no BOS, special tokens not parsed) to the ids on the
// matching line of <name>.gguf.out. Also decode(encode(s)) == s where the tokenizer is
// lossless, and the stories260K prompts against llama.cpp's prompt ids.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/testdata.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split(const std::string& text, const std::string& separator) {
  std::vector<std::string> parts;
  size_t pos = 0;
  for (size_t at; (at = text.find(separator, pos)) != std::string::npos; pos = at + separator.size()) {
    parts.push_back(text.substr(pos, at - pos));
  }
  parts.push_back(text.substr(pos));
  return parts;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

struct VectorCase {
  std::vector<std::string> inputs;
  std::vector<std::vector<int32_t>> expected;
};

VectorCase load_vectors(const std::filesystem::path& gguf) {
  VectorCase c;
  c.inputs = split(read_file(gguf.string() + ".inp"), "\n__ggml_vocab_test__\n");
  if (!c.inputs.empty() && c.inputs.back().empty()) c.inputs.pop_back();  // after the last separator
  std::istringstream out(read_file(gguf.string() + ".out"));
  for (std::string line; std::getline(out, line);) {
    std::istringstream ids(line);
    std::vector<int32_t> row;
    for (int32_t id; ids >> id;) row.push_back(id);
    c.expected.push_back(row);
  }
  return c;
}

class VocabVectors : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabVectors, EncodeMatchesLlamaCpp) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(path, "tokenizer/vocab/ggml-vocab-" + name + ".gguf");
  const Tokenizer tok = Tokenizer::from_gguf(path.string());
  const VectorCase c = load_vectors(path);
  ASSERT_EQ(c.inputs.size(), c.expected.size()) << "strings in .inp vs lines in .out";
  int passed = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const std::vector<int32_t> got = tok.encode(c.inputs[i], /*add_special=*/false, /*parse_special=*/false);
    if (got == c.expected[i]) {
      ++passed;
    } else {
      ADD_FAILURE() << name << " string " << i << ": '" << c.inputs[i] << "'\n  expected: "
                    << join_ids(c.expected[i]) << "\n  got:      " << join_ids(got);
    }
  }
  std::printf("[ vocab    ] %s: %d/%zu strings match\n", name.c_str(), passed, c.inputs.size());
}

TEST_P(VocabVectors, DecodeInvertsEncode) {
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(path, "tokenizer/vocab/ggml-vocab-" + name + ".gguf");
  const Tokenizer tok = Tokenizer::from_gguf(path.string());
  if (tok.kind() == TokenizerKind::kWordPiece) GTEST_SKIP() << "WordPiece normalization is lossy";
  const VectorCase c = load_vectors(path);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const std::string& s = c.inputs[i];
    const std::string back = tok.decode(tok.encode(s, false, false));
    EXPECT_EQ(back, s) << name << " string " << i;
    // Streaming gives the same text in complete characters.
    StreamingDecoder stream(tok);
    std::string streamed;
    for (int32_t id : tok.encode(s, true, false)) {
      const std::string part = stream.push(id);
      EXPECT_EQ(unicode::complete_prefix_length(part), part.size()) << name << " string " << i;
      streamed += part;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, s) << name << " string " << i << " (streamed, with BOS)";
  }
}

INSTANTIATE_TEST_SUITE_P(Ggml, VocabVectors,
                         ::testing::Values("llama-spm", "llama-bpe", "qwen2", "gpt-2", "phi-3", "bert-bge"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

TEST(Stories260K, PromptIdsMatchLlamaCpp) {
  KILN_REQUIRE_TESTDATA(model, "models/stories260K.gguf");
  KILN_REQUIRE_TESTDATA(jsonl, "models/stories260K.greedy.jsonl");
  const Tokenizer tok = Tokenizer::from_gguf(model.string());
  std::ifstream in(jsonl);
  int cases = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    const std::string prompt = j.at("prompt");
    const auto expected = j.at("prompt_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(join_ids(tok.encode(prompt, true)), join_ids(expected)) << "prompt '" << prompt << "'";
    // The continuation decodes to llama.cpp's text.
    const auto ids = j.at("ids").get<std::vector<int32_t>>();
    std::string text;
    for (int32_t id : ids) text += tok.piece(id);
    EXPECT_EQ(text, j.at("text").get<std::string>()) << "continuation of '" << prompt << "'";
    ++cases;
  }
  EXPECT_GT(cases, 0);
}

}  // namespace
}  // namespace kiln
