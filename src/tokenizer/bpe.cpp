// Byte-level BPE (GPT-2, Llama 3, Qwen2, ...), as llama.cpp's BPE tokenizer does it.
//
// The pre-tokenizer regexes cut the text into words. Each word starts as one symbol per
// byte (the token spelling that byte); the adjacent pair with the lowest merge rank is
// merged (ties: the leftmost), repeatedly, until no adjacent pair has a merge. Ranks are
// kept per pair of token ids, so merging needs no string work at all.
// `ignore_merges` (Llama 3): a word that is itself a token is emitted whole.
// The words come from the `pre` family's regexes, or from the spec's split rules
// (tokenizer.json pre-tokenizers).
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/byte_alphabet.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_model.h"

namespace kiln {

namespace {

constexpr int32_t kMerged = -2;  // a symbol absorbed by its left neighbour

struct Symbol {
  int32_t id;  // token id; kNoToken for a byte the vocabulary lacks (never merges)
  int32_t prev;
  int32_t next;
};

struct Candidate {
  int32_t rank;
  int32_t left;      // symbol index
  int32_t left_id;   // both symbols' ids when queued: a symbol's id changes whenever
  int32_t right_id;  // it merges, so a changed id marks a stale candidate
  int32_t result;    // merged token id
};

// std heap functions keep the "largest" on top: lowest rank, then the leftmost symbol.
struct CandidateOrder {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

struct Merge {
  int32_t rank;
  int32_t result;
};

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

class ByteLevelBpeModel final : public TokenizerModel {
 public:
  ByteLevelBpeModel(const VocabSpec& spec, const TokenIndex& index)
      : index_(index),
        splitter_(spec.split_rules.empty() ? RegexSplitter(pre_tokenizer_family(spec.pre).patterns)
                                           : RegexSplitter(spec.split_rules)),
        ignore_merges_(spec.ignore_merges) {
    for (int b = 0; b < 256; ++b) {
      const auto it = index_.find(byte_alphabet::spelling_of(uint8_t(b)));
      byte_tokens_[b] = it != index_.end() ? it->second : kNoToken;
    }
    merges_.reserve(spec.merges.size());
    std::string joined;
    for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
      const auto& [left, right] = spec.merges[rank];
      joined.assign(left).append(right);
      const auto l = index_.find(left), r = index_.find(right), m = index_.find(joined);
      // A merge whose parts or result are not tokens can never apply to token ids.
      if (l == index_.end() || r == index_.end() || m == index_.end()) continue;
      const int32_t merge_rank = spec.merge_ranks.empty() ? int32_t(rank) : spec.merge_ranks.at(rank);
      merges_.emplace(pair_key(l->second, r->second), Merge{merge_rank, m->second});
    }
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<TextSpan> words;
    splitter_.split(text, words);
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
    std::string spelled;
    for (const TextSpan span : words) {
      const std::string_view word = text.substr(span.offset, span.length);
      if (word.size() == 1) {
        if (byte_tokens_[uint8_t(word[0])] != kNoToken) out.push_back(byte_tokens_[uint8_t(word[0])]);
        continue;
      }
      if (ignore_merges_) {
        spelled.clear();
        byte_alphabet::encode(word, spelled);
        const auto it = index_.find(spelled);
        if (it != index_.end()) {
          out.push_back(it->second);
          continue;
        }
      }
      merge_word(word, symbols, heap);
      for (int32_t i = 0; i != -1; i = symbols[i].next) {
        if (symbols[i].id >= 0) out.push_back(symbols[i].id);
      }
    }
  }

 private:
  void consider(std::vector<Symbol>& symbols, std::vector<Candidate>& heap, int32_t left) const {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0 || symbols[left].id < 0 || symbols[right].id < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.result});
    std::push_heap(heap.begin(), heap.end(), CandidateOrder{});
  }

  void merge_word(std::string_view word, std::vector<Symbol>& symbols,
                  std::vector<Candidate>& heap) const {
    const int32_t n = static_cast<int32_t>(word.size());
    symbols.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      symbols[i] = {byte_tokens_[uint8_t(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
    }
    heap.clear();
    for (int32_t i = 0; i + 1 < n; ++i) consider(symbols, heap, i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), CandidateOrder{});
      const Candidate c = heap.back();
      heap.pop_back();
      Symbol& left = symbols[c.left];
      // Unchanged left id: left has absorbed nothing, so left.next is the same symbol.
      if (left.id != c.left_id) continue;
      Symbol& right = symbols[left.next];
      if (right.id != c.right_id) continue;
      left.id = c.result;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = c.left;
      right.id = kMerged;
      consider(symbols, heap, left.prev);
      consider(symbols, heap, c.left);
    }
  }

  const TokenIndex& index_;
  RegexSplitter splitter_;
  bool ignore_merges_;
  int32_t byte_tokens_[256];
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace

std::unique_ptr<TokenizerModel> make_byte_level_bpe_model(const VocabSpec& spec,
                                                          const TokenIndex& index) {
  return std::make_unique<ByteLevelBpeModel>(spec, index);
}

}  // namespace kiln
