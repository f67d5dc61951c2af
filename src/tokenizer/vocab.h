#pragma once
// The vocabulary every tokenizer algorithm shares: token texts as the model's vocabulary
// stores them, their scores and types, the special ids and the behaviour flags.
// Built from GGUF metadata (gguf_vocab.cpp) or from Hugging Face files (hf_*.cpp).
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
  bool add_space_prefix = false;     // SPM: a space before the first text
  bool ignore_merges = false;        // BPE (llama3): a pre-token in the vocab is kept whole
  bool lowercase = true;             // WordPiece normalizer
  bool strip_accents = true;         // WordPiece normalizer
  bool clean_spaces = false;         // HF clean_up_tokenization_spaces (decode option)
};

}  // namespace kiln
