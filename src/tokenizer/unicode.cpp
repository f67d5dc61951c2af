#include "tokenizer/unicode.h"

#include <algorithm>

#include "tokenizer/unicode_tables.h"

namespace kiln::unicode {

namespace {

tables::CharClass class_of(uint32_t cp) {
  const tables::ClassRange* begin = tables::kClassRanges;
  const tables::ClassRange* end = begin + tables::kClassRangeCount;
  const auto* it = std::upper_bound(begin, end, cp, [](uint32_t value, const tables::ClassRange& r) {
    return value < r.first;
  });
  if (it == begin) return tables::CharClass::kPlain;
  --it;
  return cp <= it->last ? it->cls : tables::CharClass::kPlain;
}

const tables::Mapping* find_mapping(const tables::Mapping* table, size_t count, uint32_t cp) {
  const tables::Mapping* end = table + count;
  const auto* it = std::lower_bound(table, end, cp, [](const tables::Mapping& m, uint32_t value) {
    return m.from < value;
  });
  return (it != end && it->from == cp) ? it : nullptr;
}

void append_mapping(std::vector<uint32_t>& out, const tables::Mapping& m) {
  for (uint32_t c : m.to) {
    if (c == 0) break;
    out.push_back(c);
  }
}

}  // namespace

uint32_t decode(std::string_view s, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = byte(pos);
  const size_t len = sequence_length(lead);
  if (len == 1) {
    ++pos;
    return lead < 0x80 ? lead : kReplacementChar;
  }
  if (pos + len > s.size()) {
    ++pos;
    return kReplacementChar;
  }
  uint32_t cp = lead & (0xFF >> (len + 1));
  for (size_t i = 1; i < len; ++i) {
    const uint8_t b = byte(pos + i);
    if ((b & 0xC0) != 0x80) {
      ++pos;
      return kReplacementChar;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  // Reject overlong forms, surrogates and values past U+10FFFF.
  static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++pos;
    return kReplacementChar;
  }
  pos += len;
  return cp;
}

std::vector<uint32_t> decode_all(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) out.push_back(decode(s, pos));
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t complete_prefix_length(std::string_view s) {
  // Only the last three bytes can belong to an unfinished sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t len = sequence_length(b);
    // A lead byte whose sequence needs more bytes than are present: hold it back.
    return (len > back) ? n - back : n;
  }
  return n;
}

bool is_whitespace(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_control(uint32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  return class_of(cp) == tables::CharClass::kOther;
}

bool is_punctuation(uint32_t cp) { return class_of(cp) == tables::CharClass::kPunctuation; }

bool is_nonspacing_mark(uint32_t cp) { return class_of(cp) == tables::CharClass::kNonspacingMark; }

bool is_cjk_ideograph(uint32_t cp) {
  // The blocks of BERT's _is_chinese_char (HF's Rust port has 0x2B920 for 0x2B820).
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

void append_lowercase(std::vector<uint32_t>& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back((cp >= 'A' && cp <= 'Z') ? cp + 32 : cp);
    return;
  }
  if (const auto* m = find_mapping(tables::kLowercase, tables::kLowercaseCount, cp)) {
    append_mapping(out, *m);
  } else {
    out.push_back(cp);
  }
}

void append_nfd(std::vector<uint32_t>& out, uint32_t cp) {
  // Hangul syllables decompose arithmetically into leading, vowel and trailing jamo.
  constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
  constexpr uint32_t kVCount = 21, kTCount = 28, kSCount = 11172;
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / (kVCount * kTCount));
    out.push_back(kVBase + (s % (kVCount * kTCount)) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  // Canonical reordering of marks across characters is skipped: NFD is only used to
  // strip the marks, where their order does not matter.
  if (cp >= 0xC0) {
    if (const auto* m = find_mapping(tables::kNfd, tables::kNfdCount, cp)) {
      append_mapping(out, *m);
      return;
    }
  }
  out.push_back(cp);
}

}  // namespace kiln::unicode
