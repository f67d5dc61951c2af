// Hugging Face tokenizer files must give the same ids as llama.cpp's GGUF conversion of
// the same tokenizer, on every llama.cpp test string.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/testdata.h"
#include "tokenizer/hf_files.h"

namespace kiln {
namespace {

std::vector<std::string> test_strings(const std::filesystem::path& inp) {
  std::ifstream in(inp, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> parts;
  size_t pos = 0;
  for (size_t at; (at = text.find(separator, pos)) != std::string::npos; pos = at + separator.size()) {
    parts.push_back(text.substr(pos, at - pos));
  }
  return parts;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

struct Pair {
  const char* hf;    // under tokenizer/hf/
  const char* gguf;  // ggml-vocab-<name>.gguf
};

class HfMatchesGguf : public ::testing::TestWithParam<Pair> {};

TEST_P(HfMatchesGguf, SameIdsOnEveryTestString) {
  const Pair p = GetParam();
  KILN_REQUIRE_TESTDATA(hf, std::string("tokenizer/hf/") + p.hf);
  KILN_REQUIRE_TESTDATA(gguf, std::string("tokenizer/vocab/ggml-vocab-") + p.gguf + ".gguf");
  const Tokenizer from_hf = load_tokenizer(hf);
  const Tokenizer from_gguf = load_tokenizer(gguf);
  EXPECT_EQ(from_hf.kind(), from_gguf.kind());
  const auto strings = test_strings(gguf.string() + ".inp");
  ASSERT_FALSE(strings.empty());
  int same = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const auto a = from_hf.encode(strings[i], false, false);
    const auto b = from_gguf.encode(strings[i], false, false);
    if (a == b) {
      ++same;
    } else {
      ADD_FAILURE() << p.hf << " string " << i << ": '" << strings[i] << "'\n  gguf: " << join(b)
                    << "\n  hf:   " << join(a);
    }
  }
  // With special tokens added as each model's settings say.
  EXPECT_EQ(from_hf.encode("Hello world", true), from_gguf.encode("Hello world", true)) << p.hf;
  std::printf("[ hf       ] %s vs %s: %d/%zu strings match\n", p.hf, p.gguf, same, strings.size());
}

INSTANTIATE_TEST_SUITE_P(Vocab, HfMatchesGguf,
                         ::testing::Values(Pair{"llama3", "llama-bpe"}, Pair{"qwen2", "qwen2"},
                                           Pair{"llama2", "llama-spm"}, Pair{"gpt2", "gpt-2"}),
                         [](const auto& info) { return std::string(info.param.hf); });

TEST(HfFiles, MistralV3SentencePieceRoundTrips) {
  KILN_REQUIRE_TESTDATA(model, "tokenizer/hf/mistral-v3/tokenizer.model");
  KILN_REQUIRE_TESTDATA(inp, "tokenizer/vocab/ggml-vocab-llama-spm.gguf.inp");
  const Tokenizer tok = load_tokenizer(model);
  EXPECT_EQ(tok.kind(), TokenizerKind::kSentencePiece);
  EXPECT_EQ(tok.vocab_size(), 32768u);
  EXPECT_EQ(tok.special().bos, 1);
  EXPECT_EQ(tok.special().eos, 2);
  for (const std::string& s : test_strings(inp)) {
    EXPECT_EQ(tok.decode(tok.encode(s, true)), s);
  }
}

TEST(HfFiles, Llama3SpecialTokens) {
  KILN_REQUIRE_TESTDATA(model, "tokenizer/hf/llama3/tokenizer.model");
  const Tokenizer tok = load_tokenizer(model);
  EXPECT_EQ(tok.vocab_size(), 128256u);
  EXPECT_EQ(tok.find_token("<|eot_id|>"), 128009);
  EXPECT_EQ(tok.find_token("<|reserved_special_token_247|>"), 128255);
  EXPECT_TRUE(tok.is_end_of_generation(128009));
  const auto ids = tok.encode("<|start_header_id|>user<|end_header_id|>", true, true);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[0], 128000);
  EXPECT_EQ(ids[1], 128006);
  EXPECT_EQ(ids[3], 128007);
}

TEST(HfFiles, RejectsWhatItCannotRead) {
  KILN_REQUIRE_TESTDATA(dir, "tokenizer/hf/qwen2");
  EXPECT_THROW(load_tokenizer(dir / "tokenizer_config.json"), Error);
  EXPECT_THROW(load_tokenizer(dir / "no-such-file"), Error);
}

}  // namespace
}  // namespace kiln
