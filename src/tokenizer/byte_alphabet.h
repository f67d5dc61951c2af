#pragma once
// GPT-2's byte-to-unicode alphabet: byte-level BPE vocabularies spell every byte as one
// printable code point, so token texts are valid UTF-8 without spaces or control codes.
// Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other
// 68 bytes map, in byte order, to U+0100, U+0101, ... (so ' ' is 'Ġ' U+0120, '\n' is 'Ċ').
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::byte_alphabet {

// The code point that spells `byte`.
uint32_t code_point_of(uint8_t byte);
// The UTF-8 spelling of `byte`.
const std::string& spelling_of(uint8_t byte);
// Appends the spelling of every byte of `raw`.
void encode(std::string_view raw, std::string& out);
// Turns a spelled text back into bytes; false when some code point is not in the alphabet.
bool decode(std::string_view spelled, std::string& out);

}  // namespace kiln::byte_alphabet
