#pragma once
// Text to token ids and back, the way the model's own tokenizer does it.
//
// One Tokenizer class over four algorithms, chosen by the vocabulary:
//   SentencePiece-style BPE ("llama"): spm.cpp
//   byte-level BPE ("gpt2") with per-family pre-tokenizer regexes: bpe.cpp, pretokenizer.cpp
//   WordPiece ("bert"): wordpiece.cpp
//   SentencePiece unigram (Hugging Face tokenizer.json "Unigram"): unigram.cpp
// Special tokens are split out of the text first (special_tokens.cpp), as llama.cpp and
// Hugging Face do: control tokens only when asked (parse_special), user-defined tokens
// always. A Tokenizer is immutable after construction and safe to share between threads.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace kiln {

namespace gguf {
class File;
}

class TokenizerModel;  // the algorithm behind a Tokenizer (tokenizer_model.h)
class TextNormalizer;  // tokenizer.json normalizers (normalizer.h)

struct DecodeOptions {
  bool render_special = false;  // write control/unknown tokens' text instead of nothing
  bool clean_spaces = false;    // HF clean_up_tokenization_spaces (" ." -> "." ...)
};

class Tokenizer {
 public:
  explicit Tokenizer(VocabSpec spec);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // From the tokenizer.ggml.* metadata of a GGUF file.
  static Tokenizer from_gguf(const gguf::File& file);
  static Tokenizer from_gguf(const std::string& path);

  // add_special: BOS/EOS (WordPiece: CLS/SEP) as the model's flags say.
  // parse_special: text equal to a control token becomes that token.
  std::vector<int32_t> encode(std::string_view text, bool add_special = true,
                              bool parse_special = false) const;
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options = {}) const;

  // The bytes a token stands for (spaces restored, byte tokens as their byte, byte-level
  // BPE decoded); control tokens give their text.
  const std::string& piece(int32_t id) const;
  // The token's text as the vocabulary stores it.
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // The id whose stored text is exactly `text`, or kNoToken.
  int32_t find_token(std::string_view text) const;

  size_t vocab_size() const { return vocab_->spec.tokens.size(); }
  TokenizerKind kind() const { return vocab_->spec.kind; }
  const std::string& pre_tokenizer() const { return vocab_->spec.pre; }
  const SpecialIds& special() const { return vocab_->spec.special; }
  bool adds_bos() const { return vocab_->spec.add_bos; }
  bool adds_eos() const { return vocab_->spec.add_eos; }
  bool is_end_of_generation(int32_t id) const;
  const std::vector<int32_t>& end_of_generation_ids() const { return eog_ids_; }

 private:
  friend class StreamingDecoder;
  struct SpecialToken {
    int32_t id;
    bool lstrip;  // eat whitespace before it
    bool rstrip;  // eat whitespace after it
  };
  struct Fragment {
    std::string_view text;  // raw text, when id == kNoToken
    int32_t id = kNoToken;
  };

  void check_id(int32_t id) const;
  void build_pieces();
  void build_special_tokens();
  void build_end_of_generation();
  std::vector<Fragment> split_special(std::string_view text, bool parse_special) const;
  // Whether a decoded piece is written at this point of a decode.
  bool renders(int32_t id, bool render_special) const;

  // The vocabulary lives on the heap so that the model's references to it survive a
  // move of the Tokenizer.
  struct Vocabulary {
    VocabSpec spec;
    TokenIndex index;  // stored text -> id
  };
  std::unique_ptr<Vocabulary> vocab_;
  std::vector<std::string> pieces_;        // id -> bytes
  std::vector<SpecialToken> special_tokens_;  // longest text first
  std::vector<int32_t> eog_ids_;           // sorted
  std::unique_ptr<TokenizerModel> model_;
  std::unique_ptr<TextNormalizer> normalizer_;  // only when the spec has normalizer steps
};

// Turns ids into text one at a time, returning only whole UTF-8 characters: a character
// split over several byte tokens comes out when its last byte arrives.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, DecodeOptions options = {});
  // The text that became complete with this id (often empty or one piece).
  std::string push(int32_t id);
  // Whatever is still held back (an unfinished UTF-8 sequence at the end of the stream).
  std::string flush();
  void reset();

 private:
  const Tokenizer& tokenizer_;
  DecodeOptions options_;
  std::string pending_;
  bool at_start_ = true;
};

// HF's clean_up_tokenization_spaces: removes the space before . , ! ? and before the
// contractions 's 'm 're 've and n't, and around a lone apostrophe.
std::string clean_up_spaces(std::string_view text);

}  // namespace kiln
