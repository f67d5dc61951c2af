// Llama 3's tokenizer.model: tiktoken ranks, one "base64(token bytes) rank" per line.
// tiktoken merges, at each step, the adjacent pair whose concatenation has the lowest rank
// (ties: leftmost) -- byte-level BPE where the pair (a, b) has the rank of a+b. So every
// split of every token into two tokens is a merge at that token's rank.
#include <array>
#include <fstream>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/byte_alphabet.h"
#include "tokenizer/hf_files.h"
#include "tokenizer/pretokenizer.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

constexpr int32_t kLlama3FirstSpecial = 128000;
constexpr int32_t kLlama3SpecialCount = 256;

// Decodes standard base64 (with '=' padding); false on a character outside the alphabet.
bool decode_base64(std::string_view in, std::string& out) {
  static const std::array<int8_t, 256> kValue = [] {
    std::array<int8_t, 256> v{};
    v.fill(-1);
    const std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < alphabet.size(); ++i) v[uint8_t(alphabet[i])] = int8_t(i);
    return v;
  }();
  out.clear();
  uint32_t bits = 0;
  int count = 0;
  for (char c : in) {
    if (c == '=') break;
    const int8_t v = kValue[uint8_t(c)];
    if (v < 0) return false;
    bits = (bits << 6) | uint32_t(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(char((bits >> count) & 0xFF));
    }
  }
  return true;
}

// Llama 3.1's names for the 256 special tokens.
std::string llama3_special_name(int32_t index) {
  switch (index) {
    case 0: return "<|begin_of_text|>";
    case 1: return "<|end_of_text|>";
    case 4: return "<|finetune_right_pad_id|>";
    case 6: return "<|start_header_id|>";
    case 7: return "<|end_header_id|>";
    case 8: return "<|eom_id|>";
    case 9: return "<|eot_id|>";
    case 10: return "<|python_tag|>";
    default: break;
  }
  // The rest are reserved_special_token_N, numbered in order of their ids.
  const int32_t n = index <= 3 ? index - 2 : index == 5 ? 2 : index - 8;
  return "<|reserved_special_token_" + std::to_string(n) + "|>";
}

}  // namespace

bool is_tiktoken_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t space = line.find(' ');
  if (space == std::string::npos || space == 0) return false;
  std::string bytes;
  for (size_t i = space + 1; i < line.size(); ++i) {
    if (line[i] < '0' || line[i] > '9') return false;
  }
  return decode_base64(std::string_view(line).substr(0, space), bytes);
}

VocabSpec read_tiktoken_model(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("tokenizer: cannot open {}", file.string());
  VocabSpec spec;
  spec.kind = TokenizerKind::kBytePairBpe;
  spec.pre = "llama-bpe";
  std::vector<std::string> raw;  // rank -> token bytes
  std::string bytes;
  size_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    KILN_CHECK(space != std::string::npos && decode_base64(std::string_view(line).substr(0, space), bytes),
               "tokenizer: {}:{}: expected 'base64 rank'", file.string(), line_number);
    const long rank = std::strtol(line.c_str() + space + 1, nullptr, 10);
    KILN_CHECK(rank == long(raw.size()), "tokenizer: {}:{}: rank {} out of order", file.string(), line_number, rank);
    raw.push_back(bytes);
  }
  KILN_CHECK(raw.size() <= size_t(kLlama3FirstSpecial), "tokenizer: {}: {} ranks, more than Llama 3's {}",
             file.string(), raw.size(), kLlama3FirstSpecial);

  spec.tokens.reserve(kLlama3FirstSpecial + kLlama3SpecialCount);
  for (const std::string& token : raw) {
    spec.tokens.emplace_back();
    byte_alphabet::encode(token, spec.tokens.back());
  }
  spec.types.assign(spec.tokens.size(), TokenType::kNormal);
  while (spec.tokens.size() < size_t(kLlama3FirstSpecial)) {  // a shorter file: pad the gap
    spec.tokens.push_back("[UNUSED" + std::to_string(spec.tokens.size()) + "]");
    spec.types.push_back(TokenType::kUnused);
  }
  for (int32_t i = 0; i < kLlama3SpecialCount; ++i) {
    spec.tokens.push_back(llama3_special_name(i));
    spec.types.push_back(TokenType::kControl);
  }

  std::unordered_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(raw.size());
  for (size_t r = 0; r < raw.size(); ++r) rank_of.emplace(raw[r], int32_t(r));
  for (size_t r = 0; r < raw.size(); ++r) {
    const std::string_view token = raw[r];
    for (size_t cut = 1; cut < token.size(); ++cut) {
      const auto left = rank_of.find(token.substr(0, cut));
      const auto right = rank_of.find(token.substr(cut));
      if (left == rank_of.end() || right == rank_of.end()) continue;
      spec.merges.emplace_back(spec.tokens[left->second], spec.tokens[right->second]);
      spec.merge_ranks.push_back(int32_t(r));
    }
  }

  const PreTokenizerFamily& family = pre_tokenizer_family(spec.pre);
  spec.ignore_merges = family.ignore_merges;
  spec.add_bos = true;
  spec.clean_spaces = family.clean_spaces;
  spec.special.bos = kLlama3FirstSpecial;      // <|begin_of_text|>
  spec.special.eos = kLlama3FirstSpecial + 1;  // <|end_of_text|>
  spec.special.eot = kLlama3FirstSpecial + 9;  // <|eot_id|>
  spec.special.eom = kLlama3FirstSpecial + 8;  // <|eom_id|>
  spec.special.pad = kLlama3FirstSpecial + 4;  // <|finetune_right_pad_id|>
  return spec;
}

}  // namespace kiln
