#pragma once
// Pre-tokenizers of byte-level BPE vocabularies: the regular expressions that cut text
// into words before merging, one family per tokenizer.ggml.pre name (llama.cpp's names),
// and a splitter that runs them with PCRE2 (UTF + Unicode properties, JIT-compiled).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace kiln {

struct PreTokenizerFamily {
  std::vector<std::string_view> names;     // tokenizer.ggml.pre values that select it
  std::vector<std::string_view> patterns;  // applied in turn, see RegexSplitter
  bool ignore_merges = false;              // a pre-token that is a token stays whole
  bool add_bos = false;                    // the family adds BOS by default
  bool clean_spaces = true;                // HF clean_up_tokenization_spaces default
};

// The family of a tokenizer.ggml.pre name; throws kiln::Error naming it when unknown.
const PreTokenizerFamily& pre_tokenizer_family(std::string_view name);
// Every known name, for error messages and tests.
std::vector<std::string_view> pre_tokenizer_names();

// A byte range of the text.
struct TextSpan {
  uint32_t offset;
  uint32_t length;
};

// Splits text with a list of rules: the first cuts the whole text into its matches and
// the runs between them; each next rule cuts every piece of the previous step the same
// way. With SplitBehavior::kIsolated (the patterns-only constructor) matches and runs
// between them are all kept as pieces of their own; the other behaviors are HF's (see
// SplitBehavior). Malformed UTF-8 never matches and so ends up in the in-between pieces,
// byte for byte. Thread-safe.
class RegexSplitter {
 public:
  explicit RegexSplitter(const std::vector<std::string_view>& patterns);
  explicit RegexSplitter(const std::vector<SplitRule>& rules);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Replaces `pieces` with the split of `text`.
  void split(std::string_view text, std::vector<TextSpan>& pieces) const;

 private:
  struct Compiled;
  void compile(std::string_view pattern, SplitBehavior behavior, bool invert);
  std::vector<std::unique_ptr<Compiled>> compiled_;
};

}  // namespace kiln
