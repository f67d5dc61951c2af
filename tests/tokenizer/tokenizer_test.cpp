// Tokenizer behaviour beyond the reference vectors: special tokens, end-of-generation ids,
// streaming decode, malformed UTF-8, every pre-tokenizer family, the Unicode helpers.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/testdata.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln {
namespace {

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Tokenizer, ControlTokensAreParsedOnlyWhenAsked) {
  KILN_REQUIRE_TESTDATA(path, "tokenizer/vocab/ggml-vocab-llama-bpe.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(path.string());
  const int32_t eot = tok.find_token("<|eot_id|>");
  ASSERT_NE(eot, kNoToken);
  const auto hello = tok.encode("Hello", false);
  EXPECT_EQ(tok.encode("Hello<|eot_id|>", false, true), concat(hello, {eot}));
  const auto plain = tok.encode("Hello<|eot_id|>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  EXPECT_EQ(tok.decode(plain), "Hello<|eot_id|>");
  // Llama 3 adds BOS by default (its pre-tokenizer family says so).
  EXPECT_EQ(tok.encode("Hello", true).front(), tok.special().bos);
  EXPECT_EQ(tok.special().bos, 128000);
  EXPECT_TRUE(tok.is_end_of_generation(eot));
  EXPECT_TRUE(tok.is_end_of_generation(tok.special().eos));
  EXPECT_FALSE(tok.is_end_of_generation(hello.front()));
  // Control tokens vanish from decoded text unless asked for.
  EXPECT_EQ(tok.decode(concat(hello, {eot})), "Hello");
  EXPECT_EQ(tok.decode(concat(hello, {eot}), {.render_special = true}), "Hello<|eot_id|>");
}

TEST(Tokenizer, QwenChatMarkers) {
  KILN_REQUIRE_TESTDATA(path, "tokenizer/vocab/ggml-vocab-qwen2.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(path.string());
  const auto ids = tok.encode("<|im_start|>user\nhi<|im_end|>", false, true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(ids.back(), 151645);
  EXPECT_EQ(concat(concat({151644}, tok.encode("user\nhi", false)), {151645}), ids);
  EXPECT_TRUE(tok.is_end_of_generation(151645));
  EXPECT_TRUE(tok.is_end_of_generation(151643));
  EXPECT_FALSE(tok.encode("x", true).front() == tok.special().bos) << "Qwen2 adds no BOS";
}

TEST(Tokenizer, SentencePieceSpacePrefixAfterSpecialToken) {
  KILN_REQUIRE_TESTDATA(path, "tokenizer/vocab/ggml-vocab-phi-3.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(path.string());
  const int32_t user = tok.find_token("<|user|>");
  ASSERT_EQ(user, 32010);
  // Text after a special token gets the SentencePiece space prefix again, and phi-3's
  // special tokens eat the whitespace after them (llama.cpp's rstrip quirk).
  EXPECT_EQ(tok.encode("<|user|>\nHello", false, true), concat({user}, tok.encode("Hello", false)));
  EXPECT_EQ(tok.encode("Hello", true).front(), 1);  // BOS <s>
  // The leading space that encode added is dropped again by decode, BOS or not.
  EXPECT_EQ(tok.decode(tok.encode("Hello world", true)), "Hello world");
}

TEST(Tokenizer, ByteFallbackStreamsWholeCharacters) {
  KILN_REQUIRE_TESTDATA(path, "tokenizer/vocab/ggml-vocab-llama-spm.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(path.string());
  const std::string text = "Llama \xF0\x9F\xA6\x99 and \xE1\x9E\x80!";  // 🦙 and a Khmer letter
  const auto ids = tok.encode(text, true);
  StreamingDecoder stream(tok);
  std::string streamed;
  int byte_tokens = 0;
  for (int32_t id : ids) {
    byte_tokens += tok.token_type(id) == TokenType::kByte;
    const std::string part = stream.push(id);
    EXPECT_EQ(unicode::complete_prefix_length(part), part.size()) << "half a character after id " << id;
    streamed += part;
  }
  EXPECT_GT(byte_tokens, 0) << "the emoji should need byte fallback";
  EXPECT_EQ(stream.flush(), "");
  EXPECT_EQ(streamed, text);
}

TEST(Tokenizer, MalformedUtf8SurvivesByteLevelBpe) {
  KILN_REQUIRE_TESTDATA(path, "tokenizer/vocab/ggml-vocab-qwen2.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(path.string());
  const std::string text = "ok \xFF\xFE bad \xE2\x82 cut \xC0\xAF end";
  EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
  StreamingDecoder stream(tok);
  std::string streamed;
  for (int32_t id : tok.encode(text, false)) streamed += stream.push(id);
  streamed += stream.flush();
  EXPECT_EQ(streamed, text);
}

TEST(Tokenizer, SurvivesBeingMoved) {
  KILN_REQUIRE_TESTDATA(path, "tokenizer/vocab/ggml-vocab-gpt-2.gguf");
  Tokenizer first = Tokenizer::from_gguf(path.string());
  const auto expected = first.encode("Hello world, moved", false);
  const auto moved = std::make_unique<Tokenizer>(std::move(first));
  EXPECT_EQ(moved->encode("Hello world, moved", false), expected);
}

TEST(Tokenizer, RejectsIdsOutsideTheVocabulary) {
  KILN_REQUIRE_TESTDATA(path, "models/stories260K.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(path.string());
  EXPECT_EQ(tok.vocab_size(), 512u);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{5, 512}), Error);
  EXPECT_THROW(tok.piece(-1), Error);
}

TEST(PreTokenizer, EveryFamilyCompilesAndCoversTheText) {
  const std::string text = "Hello, y'all! 12345 \xE4\xBD\xA0\xE5\xA5\xBD  \n\n\tcaf\xC3\xA9 x";
  for (std::string_view name : pre_tokenizer_names()) {
    const PreTokenizerFamily& family = pre_tokenizer_family(name);
    RegexSplitter splitter(family.patterns);
    std::vector<TextSpan> pieces;
    splitter.split(text, pieces);
    uint32_t expected_offset = 0;
    for (const TextSpan& p : pieces) {
      EXPECT_EQ(p.offset, expected_offset) << name;
      EXPECT_GT(p.length, 0u) << name;
      expected_offset = p.offset + p.length;
    }
    EXPECT_EQ(expected_offset, text.size()) << name;
  }
  EXPECT_THROW(pre_tokenizer_family("no-such-family"), Error);
}

TEST(PreTokenizer, Llama3SplitsLikeTiktoken) {
  RegexSplitter splitter(pre_tokenizer_family("llama-bpe").patterns);
  const std::string text = "I'VE got 12345 apples  \n\nokay";
  std::vector<TextSpan> pieces;
  splitter.split(text, pieces);
  std::vector<std::string> words;
  for (const TextSpan& p : pieces) words.push_back(text.substr(p.offset, p.length));
  const std::vector<std::string> expected = {"I", "'VE", " got", " ", "123", "45", " apples", "  \n\n", "okay"};
  EXPECT_EQ(words, expected);
}

TEST(Unicode, Helpers) {
  EXPECT_EQ(unicode::complete_prefix_length("ab\xE2\x82"), 2u);
  EXPECT_EQ(unicode::complete_prefix_length("ab\xE2\x82\xAC"), 5u);
  EXPECT_EQ(unicode::complete_prefix_length("ab\xF0"), 2u);
  EXPECT_EQ(unicode::complete_prefix_length("ab\x80"), 3u);  // stray continuation: never completes
  std::vector<uint32_t> out;
  unicode::append_lowercase(out, 0xC4);  // Ä
  EXPECT_EQ(out, std::vector<uint32_t>{0xE4});
  out.clear();
  unicode::append_nfd(out, 0xE9);  // é
  EXPECT_EQ(out, (std::vector<uint32_t>{'e', 0x301}));
  out.clear();
  unicode::append_nfd(out, 0xD55C);  // 한
  EXPECT_EQ(out, (std::vector<uint32_t>{0x1112, 0x1161, 0x11AB}));
  EXPECT_TRUE(unicode::is_nonspacing_mark(0x301));
  EXPECT_TRUE(unicode::is_punctuation(0x3002));
  EXPECT_TRUE(unicode::is_control(0x200B) || !unicode::is_whitespace(0x200B));
  EXPECT_TRUE(unicode::is_whitespace(0x3000));
  size_t pos = 0;
  EXPECT_EQ(unicode::decode("\xC0\xAF", pos), unicode::kReplacementChar);  // overlong '/'
  EXPECT_EQ(pos, 1u);
}

TEST(Tokenizer, CleanUpSpaces) {
  EXPECT_EQ(clean_up_spaces("Hello , world ! It 's fine ."), "Hello, world! It's fine.");
}

}  // namespace
}  // namespace kiln
