#include "tokenizer/byte_alphabet.h"

#include <array>

#include "tokenizer/unicode.h"

namespace kiln::byte_alphabet {

namespace {

bool stands_for_itself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<uint32_t, 256> code_point{};
  std::array<std::string, 256> spelling;
  std::array<int16_t, 512> byte_of{};  // code point (< 512) -> byte, -1 when none
  Tables() {
    byte_of.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      code_point[b] = stands_for_itself(b) ? uint32_t(b) : next++;
      unicode::append_utf8(spelling[b], code_point[b]);
      byte_of[code_point[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables kTables;
  return kTables;
}

}  // namespace

uint32_t code_point_of(uint8_t byte) { return tables().code_point[byte]; }

const std::string& spelling_of(uint8_t byte) { return tables().spelling[byte]; }

void encode(std::string_view raw, std::string& out) {
  const Tables& t = tables();
  for (unsigned char b : raw) out += t.spelling[b];
}

bool decode(std::string_view spelled, std::string& out) {
  const Tables& t = tables();
  bool ok = true;
  for (size_t pos = 0; pos < spelled.size();) {
    const uint32_t cp = unicode::decode(spelled, pos);
    if (cp < t.byte_of.size() && t.byte_of[cp] >= 0) {
      out.push_back(static_cast<char>(t.byte_of[cp]));
    } else {
      ok = false;
      unicode::append_utf8(out, cp);
    }
  }
  return ok;
}

}  // namespace kiln::byte_alphabet
