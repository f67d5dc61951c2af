// SentencePiece unigram, as Hugging Face's Unigram model does it.
//
// Every way to cut the text into vocabulary pieces is a path through a lattice; the
// tokenization is the path whose pieces' scores (log-probabilities) sum highest, found
// by Viterbi: best[end] = max over pieces ending at `end` of best[start] + score(piece).
// A position where no one-character piece starts gets an "unknown" edge over one
// character, scored min(score) - 10 (HF's unknown penalty). On equal sums the first path
// found wins: the one whose last piece starts earliest (HF compares with a strict >).
// Unknown stretches come out as one <unk> (HF's fuse_unk), or with byte_fallback as their
// <0xNN> byte tokens when the vocabulary has all of them.
// Control and unused pieces never match text (special tokens are split out before).
// Split rules (the Metaspace pre-tokenizer) cut the text into words solved one by one.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_model.h"
#include "tokenizer/unicode.h"

namespace kiln {

namespace {

constexpr double kUnknownPenalty = 10.0;

class UnigramModel final : public TokenizerModel {
 public:
  UnigramModel(const VocabSpec& spec, const TokenIndex& index) : spec_(spec), index_(index) {
    KILN_CHECK(spec.scores.size() == spec.tokens.size(), "unigram: {} scores for {} pieces", spec.scores.size(),
               spec.tokens.size());
    double min_score = std::numeric_limits<double>::max();
    for (size_t id = 0; id < spec.tokens.size(); ++id) {
      min_score = std::min(min_score, double(spec.scores[id]));
      max_piece_bytes_ = std::max(max_piece_bytes_, spec.tokens[id].size());
    }
    unknown_score_ = min_score - kUnknownPenalty;
    char name[8];
    for (int b = 0; b < 256; ++b) {
      snprintf(name, sizeof(name), "<0x%02X>", b);
      const auto it = index_.find(std::string_view(name));
      byte_tokens_[b] = it != index_.end() ? it->second : kNoToken;
    }
    if (!spec.split_rules.empty()) splitter_ = std::make_unique<RegexSplitter>(spec.split_rules);
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    if (!splitter_) {
      encode_word(text, out);
      return;
    }
    std::vector<TextSpan> words;
    splitter_->split(text, words);
    for (const TextSpan w : words) encode_word(text.substr(w.offset, w.length), out);
  }

 private:
  struct Best {
    double score = -std::numeric_limits<double>::infinity();
    uint32_t start = 0;           // byte where the last piece of the best path starts
    int32_t id = kNoToken;        // that piece, or kNoToken for an unknown character
    bool reached = false;
  };

  void encode_word(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    KILN_CHECK(text.size() < (size_t{1} << 31), "unigram: text of {} bytes is too long", text.size());
    std::vector<Best> best(text.size() + 1);
    best[0].score = 0.0;
    best[0].reached = true;
    const auto offer = [&](size_t start, size_t end, double score, int32_t id) {
      Best& b = best[end];
      const double total = best[start].score + score;
      if (!b.reached || total > b.score) b = {total, uint32_t(start), id, true};
    };
    for (size_t start = 0; start < text.size();) {
      const size_t char_len = std::min(unicode::sequence_length(uint8_t(text[start])), text.size() - start);
      if (best[start].reached) {
        bool single_char_piece = false;
        // Pieces are tried from short to long, so on a tie the earlier start stays.
        for (size_t end = start + char_len; end <= std::min(text.size(), start + max_piece_bytes_);) {
          const auto it = index_.find(text.substr(start, end - start));
          if (it != index_.end() && in_lattice(it->second)) {
            offer(start, end, spec_.scores[it->second], it->second);
            if (end == start + char_len) single_char_piece = true;
          }
          if (end == text.size()) break;
          end += unicode::sequence_length(uint8_t(text[end]));
        }
        if (!single_char_piece) offer(start, start + char_len, unknown_score_, kNoToken);
      }
      start += char_len;
    }

    // Walk back from the end, then write the pieces in order.
    struct Step {
      uint32_t start, end;
      int32_t id;
    };
    std::vector<Step> path;
    for (size_t end = text.size(); end > 0;) {
      const Best& b = best[end];
      path.push_back({b.start, uint32_t(end), b.id});
      end = b.start;
    }
    std::reverse(path.begin(), path.end());
    for (size_t i = 0; i < path.size();) {
      if (path[i].id != kNoToken) {
        out.push_back(path[i++].id);
        continue;
      }
      size_t j = i;  // fuse the run of unknown characters
      while (j < path.size() && path[j].id == kNoToken) ++j;
      write_unknown(text.substr(path[i].start, path[j - 1].end - path[i].start), out);
      i = j;
    }
  }

  // Control and unused tokens (and added tokens beyond the model's pieces, which are
  // control or user-defined) stand for no text of their own, as in SentencePiece.
  bool in_lattice(int32_t id) const {
    const TokenType t = spec_.types[id];
    return t != TokenType::kControl && t != TokenType::kUnused;
  }

  void write_unknown(std::string_view text, std::vector<int32_t>& out) const {
    if (spec_.byte_fallback) {
      const bool all_bytes = std::all_of(text.begin(), text.end(),
                                         [&](char c) { return byte_tokens_[uint8_t(c)] != kNoToken; });
      if (all_bytes) {
        for (char c : text) out.push_back(byte_tokens_[uint8_t(c)]);
        return;
      }
    }
    KILN_CHECK(spec_.special.unk != kNoToken, "unigram: unknown text and the vocabulary has no unk_id");
    out.push_back(spec_.special.unk);
  }

  const VocabSpec& spec_;
  const TokenIndex& index_;
  size_t max_piece_bytes_ = 0;
  double unknown_score_ = 0.0;
  int32_t byte_tokens_[256];
  std::unique_ptr<RegexSplitter> splitter_;
};

}  // namespace

std::unique_ptr<TokenizerModel> make_unigram_model(const VocabSpec& spec, const TokenIndex& index) {
  return std::make_unique<UnigramModel>(spec, index);
}

}  // namespace kiln
