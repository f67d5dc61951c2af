#pragma once
// The vocabulary every tokenizer algorithm shares: token texts as the model's vocabulary
// stores them, their scores and types, the special ids and the behaviour flags.
// Built from GGUF metadata (gguf_vocab.cpp) or from Hugging Face files (hf_*.cpp).
// tokenizer.json adds a normalizer (a list of text rewrites) and pre-tokenizer split
// rules, both plain data here, run by normalizer.cpp and pretokenizer.cpp.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln {

// Token types as GGUF's tokenizer.ggml.token_type stores them (SentencePiece's kinds).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class TokenizerKind {
  kSentencePiece,  // "llama": score-driven merges over characters, byte fallback
  kBytePairBpe,    // "gpt2": byte-level BPE over regex pre-tokens, ranked merges
  kWordPiece,      // "bert": BERT normalization + greedy longest-match WordPiece
  kUnigram,        // SentencePiece unigram: Viterbi over the pieces' log-probabilities
};

// Whether the kind spells a space as U+2581 in its tokens (SentencePiece BPE and unigram).
inline bool uses_space_mark(TokenizerKind kind) {
  return kind == TokenizerKind::kSentencePiece || kind == TokenizerKind::kUnigram;
}

// One rewrite of a Hugging Face normalizer, applied to each run of plain text (the text
// between special tokens) in order.
struct NormalizeStep {
  enum class Kind {
    kPrepend,       // text before the run (HF Prepend; Metaspace's prefix, see below)
    kReplace,       // every occurrence of the literal `pattern` becomes `content`
    kReplaceRegex,  // every match of the PCRE2 `pattern` becomes `content`
    kLowercase,     // full Unicode lowercase mapping
    kNfd,           // canonical decomposition
    kStripAccents,  // drop nonspacing marks (after kNfd)
    kStrip,         // remove whitespace at the start (strip_left) and/or end (strip_right)
  };
  Kind kind;
  std::string pattern;  // kPrepend: the text to put in front
  std::string content;
  bool strip_left = false;
  bool strip_right = false;
  bool only_at_text_start = false;    // kPrepend: only on a run that starts the whole text
  bool unless_already_there = false;  // kPrepend: not when the run starts with `pattern`
};

// What a pre-tokenizer split does with the pieces its pattern matches (HF's
// SplitDelimiterBehavior); with `invert` the matches are the words and the runs between
// them the delimiters.
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitRule {
  std::string pattern;  // PCRE2, UTF + Unicode properties
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

constexpr int32_t kNoToken = -1;

// Hash for string keys that can be looked up with a string_view (no allocation).
struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIndex = std::unordered_map<std::string, int32_t, StringViewHash, std::equal_to<>>;

struct SpecialIds {
  int32_t bos = kNoToken;
  int32_t eos = kNoToken;
  int32_t eot = kNoToken;
  int32_t eom = kNoToken;
  int32_t unk = kNoToken;
  int32_t pad = kNoToken;
  int32_t sep = kNoToken;
  int32_t cls = kNoToken;
  int32_t mask = kNoToken;
};

struct VocabSpec {
  TokenizerKind kind = TokenizerKind::kSentencePiece;
  std::string pre = "default";       // pre-tokenizer name (byte-level BPE only)
  std::string model_name;            // general.name, for a few per-model quirks
  std::vector<std::string> tokens;   // as stored: SPM and WordPiece use U+2581 for space,
                                     // byte-level BPE the GPT-2 byte-to-unicode alphabet
  std::vector<float> scores;         // SPM merge priorities (empty: all 0)
  std::vector<TokenType> types;      // empty: all normal
  std::vector<std::pair<std::string, std::string>> merges;  // BPE, rank = index ...
  std::vector<int32_t> merge_ranks;  // ... unless given here (tiktoken: equal ranks exist)
  SpecialIds special;
  bool add_bos = false;
  bool add_eos = false;
  bool add_sep = false;              // WordPiece: [SEP] after the text
  bool add_space_prefix = false;     // SPM: a space before the first text (without a
                                     // `normalizer`); decode drops the first space again
  bool ignore_merges = false;        // BPE (llama3): a pre-token in the vocab is kept whole
  bool byte_fallback = true;         // SPM/unigram: unknown text as <0xNN> tokens, else <unk>
  // tokenizer.json: when non-empty, these replace the built-in text handling. normalizer:
  // rewrites of each run of plain text (SPM kinds: the space escaping and prefix are then
  // among them). split_rules: the pre-tokenizer, applied in turn (byte-level BPE: instead
  // of the `pre` family's regexes; SPM kinds: words encoded one by one).
  bool hf_pipeline = false;          // normalizer + split_rules are the whole text handling
                                     // (tokenizer.json), even when both are empty
  std::vector<NormalizeStep> normalizer;
  std::vector<SplitRule> split_rules;
  std::vector<int32_t> lstrip_ids;   // added tokens that eat the whitespace before them
  std::vector<int32_t> rstrip_ids;   // ... and after them
  bool lowercase = true;             // WordPiece normalizer
  bool strip_accents = true;         // WordPiece normalizer
  bool clean_spaces = false;         // HF clean_up_tokenization_spaces (decode option)
};

}  // namespace kiln
