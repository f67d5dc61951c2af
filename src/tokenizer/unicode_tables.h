#pragma once
// Generated Unicode data (unicode_tables.cpp, written by gen_unicode_tables.py).
// Only what the BERT normalizer needs: a few general-category classes, full lowercase
// mappings and canonical decompositions. Use it through tokenizer/unicode.h.
#include <cstddef>
#include <cstdint>

namespace kiln::unicode::tables {

enum class CharClass : uint8_t {
  kPlain = 0,
  kOther,            // general category C* (control, format, unassigned, private, surrogate)
  kPunctuation,      // general category P*
  kNonspacingMark,   // general category Mn (accents after NFD)
};

struct ClassRange {
  uint32_t first;
  uint32_t last;
  CharClass cls;
};

struct Mapping {
  uint32_t from;
  uint32_t to[4];  // unused slots are 0
};

extern const char* const kUnicodeVersion;
extern const ClassRange kClassRanges[];
extern const size_t kClassRangeCount;
extern const Mapping kLowercase[];
extern const size_t kLowercaseCount;
extern const Mapping kNfd[];
extern const size_t kNfdCount;

}  // namespace kiln::unicode::tables
