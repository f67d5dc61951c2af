#pragma once
// Runs the normalizer of a Hugging Face tokenizer.json (VocabSpec::normalizer): the text
// rewrites applied to each run of plain text before pre-tokenization. Thread-safe.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace kiln {

class TextNormalizer {
 public:
  explicit TextNormalizer(const std::vector<NormalizeStep>& steps);
  ~TextNormalizer();
  TextNormalizer(const TextNormalizer&) = delete;
  TextNormalizer& operator=(const TextNormalizer&) = delete;

  // `at_text_start`: the run begins the whole text (no special token before it).
  std::string normalize(std::string_view text, bool at_text_start) const;

 private:
  struct Step;
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace kiln
