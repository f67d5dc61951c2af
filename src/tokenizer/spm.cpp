// SentencePiece-style BPE, as llama.cpp's SPM tokenizer does it.
//
// The text (spaces already replaced by U+2581) starts as one symbol per UTF-8 character.
// Every adjacent pair whose concatenation is a vocabulary token is a candidate, ranked by
// that token's score (higher first; ties: the leftmost pair). The best candidate is merged
// and the new neighbours become candidates, until none is left. A final symbol that is not
// a token is written as byte tokens <0xNN> (or <unk> when the vocabulary has none).
//
// Hugging Face's BPE with SentencePiece spaces (tokenizer.json with byte_fallback, e.g.
// Llama 2 as converted by transformers) ranks a pair by its position in the merge list
// instead: when the spec has merges, a candidate's priority is minus the rank of the pair
// (left token, right token), and a pair not in the list never merges. Its pre-tokenizer
// split rules, if any, cut the text into words merged one by one; without byte_fallback
// an unknown character becomes one <unk> (consecutive ones fused, as HF's fuse_unk).
//
// Speed: when no token has a U+2581 right after another character (true of SentencePiece
// vocabularies trained with split_by_whitespace), no merge can cross the start of a word,
// so each word is merged on its own: same result, small queues.
#include <algorithm>
#include <cstdio>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_model.h"
#include "tokenizer/unicode.h"

namespace kiln {

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581

// Whether the U+2581 at byte `at` (> 0) follows a character other than U+2581.
bool starts_word(std::string_view text, size_t at) {
  return at < kSpaceMark.size() || text.substr(at - kSpaceMark.size(), kSpaceMark.size()) != kSpaceMark;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t offset;  // into the text
  uint32_t length;  // bytes; 0 once merged into its left neighbour
};

struct Candidate {
  float score;
  int32_t left;
  int32_t right;
  uint32_t length;  // of the merged text, to detect a stale candidate
};

struct CandidateOrder {
  bool operator()(const Candidate& a, const Candidate& b) const {
    // The heap keeps the "largest" on top: highest score, then the smallest left index.
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class SentencePieceModel final : public TokenizerModel {
 public:
  SentencePieceModel(const VocabSpec& spec, const TokenIndex& index) : spec_(spec), index_(index) {
    split_words_ = std::none_of(spec.tokens.begin(), spec.tokens.end(), [](const std::string& token) {
      for (size_t at = token.find(kSpaceMark, 1); at != std::string::npos; at = token.find(kSpaceMark, at + 1)) {
        if (starts_word(token, at)) return true;
      }
      return false;
    });
    char name[8];
    for (int b = 0; b < 256; ++b) {
      snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = index_.find(std::string_view(name));
      if (it == index_.end()) it = index_.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
      byte_tokens_[b] = it != index_.end() ? it->second : spec_.special.unk;
    }
    std::string joined;
    for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
      const auto& [left, right] = spec.merges[rank];
      const auto l = index_.find(left), r = index_.find(right);
      joined.assign(left).append(right);
      if (l == index_.end() || r == index_.end() || index_.find(joined) == index_.end()) continue;
      merge_ranks_.emplace(pair_key(l->second, r->second), int32_t(rank));  // the first listing wins
    }
    if (!spec.split_rules.empty()) splitter_ = std::make_unique<RegexSplitter>(spec.split_rules);
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    if (text.empty()) return;
    KILN_CHECK(text.size() < (size_t{1} << 31), "sentencepiece: text of {} bytes is too long",
               text.size());
    Scratch scratch;
    if (splitter_) {
      std::vector<TextSpan> words;
      splitter_->split(text, words);
      for (const TextSpan w : words) encode_run(text.substr(w.offset, w.length), scratch, out);
      return;
    }
    if (!split_words_) {
      encode_run(text, scratch, out);
      return;
    }
    // Cut before every U+2581 that follows another character.
    size_t start = 0;
    for (size_t at = text.find(kSpaceMark, 1); at != std::string_view::npos;
         at = text.find(kSpaceMark, at + kSpaceMark.size())) {
      if (!starts_word(text, at)) continue;  // inside a run of spaces
      encode_run(text.substr(start, at - start), scratch, out);
      start = at;
    }
    encode_run(text.substr(start), scratch, out);
  }

 private:
  struct Scratch {
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  void encode_run(std::string_view text, Scratch& scratch, std::vector<int32_t>& out) const {
    std::vector<Symbol>& symbols = scratch.symbols;
    symbols.clear();
    for (size_t pos = 0; pos < text.size();) {
      const size_t len = std::min(unicode::sequence_length(static_cast<uint8_t>(text[pos])),
                                  text.size() - pos);
      const int32_t i = static_cast<int32_t>(symbols.size());
      symbols.push_back({i - 1, pos + len == text.size() ? -1 : i + 1, static_cast<uint32_t>(pos),
                         static_cast<uint32_t>(len)});
      pos += len;
    }

    std::vector<Candidate>& heap = scratch.heap;
    heap.clear();
    const auto consider = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const Symbol& a = symbols[left];
      const Symbol& b = symbols[right];
      const std::string_view merged = text.substr(a.offset, a.length + b.length);
      const auto it = index_.find(merged);
      if (it == index_.end()) return;
      float score = spec_.scores.empty() ? 0.0f : spec_.scores[it->second];
      if (!merge_ranks_.empty()) {
        const auto l = index_.find(text.substr(a.offset, a.length));
        const auto r = index_.find(text.substr(b.offset, b.length));
        if (l == index_.end() || r == index_.end()) return;
        const auto rank = merge_ranks_.find(pair_key(l->second, r->second));
        if (rank == merge_ranks_.end()) return;
        score = -float(rank->second);  // exact: ranks stay far below 2^24
      }
      heap.push_back({score, left, right, static_cast<uint32_t>(merged.size())});
      std::push_heap(heap.begin(), heap.end(), CandidateOrder{});
    };
    for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) consider(i - 1, i);

    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), CandidateOrder{});
      const Candidate c = heap.back();
      heap.pop_back();
      Symbol& left = symbols[c.left];
      Symbol& right = symbols[c.right];
      if (left.length == 0 || right.length == 0 || left.length + right.length != c.length) continue;
      left.length += right.length;
      right.length = 0;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = c.left;
      consider(left.prev, c.left);
      consider(c.left, left.next);
    }

    bool unknown_before = false;  // the last id written was an unknown character's <unk>
    for (int32_t i = 0; i != -1; i = symbols[i].next) {
      const Symbol& s = symbols[i];
      const std::string_view piece = text.substr(s.offset, s.length);
      const auto it = index_.find(piece);
      if (it != index_.end()) {
        out.push_back(it->second);
        unknown_before = false;
        continue;
      }
      if (!spec_.byte_fallback) {
        KILN_CHECK(spec_.special.unk != kNoToken, "sentencepiece: unknown text and the vocabulary has no <unk>");
        if (!unknown_before) out.push_back(spec_.special.unk);
        unknown_before = true;
        continue;
      }
      for (unsigned char byte : piece) {
        const int32_t id = byte_tokens_[byte];
        KILN_CHECK(id != kNoToken,
                   "sentencepiece: byte 0x{:02X} has no token and the vocabulary has no <unk>", byte);
        out.push_back(id);
      }
    }
  }

  const VocabSpec& spec_;
  const TokenIndex& index_;
  int32_t byte_tokens_[256];
  bool split_words_ = false;
  std::unordered_map<uint64_t, int32_t> merge_ranks_;  // (left id, right id) -> rank
  std::unique_ptr<RegexSplitter> splitter_;
};

}  // namespace

std::unique_ptr<TokenizerModel> make_sentencepiece_model(const VocabSpec& spec,
                                                         const TokenIndex& index) {
  return std::make_unique<SentencePieceModel>(spec, index);
}

}  // namespace kiln
