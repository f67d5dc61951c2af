// WordPiece (BERT), as Hugging Face's BertNormalizer + BertPreTokenizer + WordPiece do it.
//
// Normalize: drop NUL, U+FFFD and control characters; whitespace becomes a space; CJK
// ideographs are isolated; with strip_accents, NFD then drop nonspacing marks; lowercase.
// Pre-tokenize: split on whitespace and isolate every punctuation character (Unicode P*
// and ASCII symbols). Model: per word, greedy longest match from the left; pieces after
// the first are continuations. GGUF vocabularies (llama.cpp's converter) spell a word
// start as U+2581 + text and a continuation as the bare text ("##" dropped), so the word
// is matched as "▁word". A word with no full match, or over 100 characters, is [UNK].
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer_model.h"
#include "tokenizer/unicode.h"

namespace kiln {

namespace {

constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581
constexpr size_t kMaxWordChars = 100;                    // HF's max_input_chars_per_word

bool is_bert_punctuation(uint32_t cp) {
  const bool ascii_punct = (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) ||
                           (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126);
  return ascii_punct || unicode::is_punctuation(cp);
}

class WordPieceModel final : public TokenizerModel {
 public:
  WordPieceModel(const VocabSpec& spec, const TokenIndex& index) : spec_(spec), index_(index) {
    for (const auto& token : spec.tokens) max_token_bytes_ = std::max(max_token_bytes_, token.size());
    KILN_CHECK(spec.special.unk != kNoToken, "wordpiece: the vocabulary has no [UNK] token");
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<uint32_t> normalized;
    normalize(text, normalized);
    std::string word(kWordStart);
    size_t word_chars = 0;
    const auto finish_word = [&] {
      if (word_chars > 0) encode_word(word, word_chars, out);
      word.assign(kWordStart);
      word_chars = 0;
    };
    for (uint32_t cp : normalized) {
      if (unicode::is_whitespace(cp)) {
        finish_word();
      } else if (is_bert_punctuation(cp) || unicode::is_cjk_ideograph(cp)) {
        finish_word();
        unicode::append_utf8(word, cp);
        word_chars = 1;
        finish_word();
      } else {
        unicode::append_utf8(word, cp);
        ++word_chars;
      }
    }
    finish_word();
  }

 private:
  void normalize(std::string_view text, std::vector<uint32_t>& out) const {
    std::vector<uint32_t> decomposed;
    for (size_t pos = 0; pos < text.size();) {
      const uint32_t cp = unicode::decode(text, pos);
      if (cp == 0 || cp == unicode::kReplacementChar || unicode::is_control(cp)) continue;
      if (unicode::is_whitespace(cp)) {
        out.push_back(' ');
        continue;
      }
      decomposed.clear();
      if (spec_.strip_accents) {
        unicode::append_nfd(decomposed, cp);
      } else {
        decomposed.push_back(cp);
      }
      for (uint32_t c : decomposed) {
        if (spec_.strip_accents && unicode::is_nonspacing_mark(c)) continue;
        if (spec_.lowercase) {
          unicode::append_lowercase(out, c);
        } else {
          out.push_back(c);
        }
      }
    }
  }

  // `word` is "▁" + the word's text.
  void encode_word(const std::string& word, size_t chars, std::vector<int32_t>& out) const {
    if (chars > kMaxWordChars) {
      out.push_back(spec_.special.unk);
      return;
    }
    const size_t first_output = out.size();
    const std::string_view all(word);
    size_t start = 0;
    while (start < all.size()) {
      // A continuation never starts with the word-start mark, so skip it after the first.
      size_t end = std::min(all.size(), start + max_token_bytes_);
      int32_t found = kNoToken;
      for (; end > start; --end) {
        const auto it = index_.find(all.substr(start, end - start));
        if (it != index_.end()) {
          found = it->second;
          break;
        }
      }
      if (found == kNoToken) {
        out.resize(first_output);
        out.push_back(spec_.special.unk);
        return;
      }
      out.push_back(found);
      start = end;
    }
  }

  const VocabSpec& spec_;
  const TokenIndex& index_;
  size_t max_token_bytes_ = 0;
};

}  // namespace

std::unique_ptr<TokenizerModel> make_wordpiece_model(const VocabSpec& spec, const TokenIndex& index) {
  return std::make_unique<WordPieceModel>(spec, index);
}

}  // namespace kiln
