#pragma once
// UTF-8 helpers and the small amount of Unicode knowledge the tokenizers need outside
// the PCRE2 pre-tokenizer regexes (BERT normalization: classes, lowercase, NFD).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::unicode {

constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the UTF-8 sequence a lead byte announces (1 for ASCII and for bytes that
// cannot start a sequence, so a scan always makes progress).
inline size_t sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the code point at s[pos] and advances pos past it. Malformed input gives
// U+FFFD and advances by one byte.
uint32_t decode(std::string_view s, size_t& pos);
std::vector<uint32_t> decode_all(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);

// Length of the longest prefix of s that does not end inside a UTF-8 sequence that
// could still be completed by more bytes. Malformed bytes count as complete (they will
// never become valid), so a stream never stalls on them.
size_t complete_prefix_length(std::string_view s);

// White_Space property (what Rust's char::is_whitespace and HF's BERT use).
bool is_whitespace(uint32_t cp);
// General category C*, except tab, newline and carriage return (BERT's "control").
bool is_control(uint32_t cp);
// General category P*.
bool is_punctuation(uint32_t cp);
// General category Mn: what BERT's strip_accents removes after NFD.
bool is_nonspacing_mark(uint32_t cp);
// The CJK ideograph blocks BERT isolates as single-character words.
bool is_cjk_ideograph(uint32_t cp);

// Appends the full lowercase mapping of cp (one to three code points).
void append_lowercase(std::vector<uint32_t>& out, uint32_t cp);
// Appends the canonical decomposition (NFD) of cp.
void append_nfd(std::vector<uint32_t>& out, uint32_t cp);

}  // namespace kiln::unicode
