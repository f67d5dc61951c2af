#pragma once
// The algorithm behind a Tokenizer: turns one run of plain text (special tokens already
// split out, SentencePiece spaces already escaped) into ids. Internal to src/tokenizer.
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace kiln {

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  // Appends the ids of `text` to `out`. Must be safe to call from several threads.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
};

// Both keep references to `spec` and `index`, which must outlive the model.
std::unique_ptr<TokenizerModel> make_sentencepiece_model(const VocabSpec& spec,
                                                         const TokenIndex& index);
std::unique_ptr<TokenizerModel> make_byte_level_bpe_model(const VocabSpec& spec,
                                                          const TokenIndex& index);
std::unique_ptr<TokenizerModel> make_unigram_model(const VocabSpec& spec, const TokenIndex& index);
std::unique_ptr<TokenizerModel> make_wordpiece_model(const VocabSpec& spec,
                                                     const TokenIndex& index);

}  // namespace kiln
