// libFuzzer harness for the safetensors reader and the index (weight_map) parser.
// Inputs starting with '{' also go through the index parser. Any input must give a parsed
// file or a kiln::Error; anything else is reported as a crash. See docs/fuzzing.md.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/error.h"
#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = kiln::safetensors::File::open_memory(std::span<const uint8_t>(data, size), "fuzz.safetensors");
    uint8_t sum = 0;
    for (const auto& t : f->tensors()) {
      if (t.bytes != size_t(t.elements()) * kiln::safetensors::dtype_size(t.dtype)) __builtin_trap();
      for (size_t k = 0; k < t.bytes; ++k) sum = uint8_t(sum + t.data[k]);  // out-of-bounds views trip ASan
    }
    volatile uint8_t sink = sum;
    (void)sink;
  } catch (const kiln::Error&) {
  }
  if (size > 0 && data[0] == '{') {
    try {
      kiln::safetensors::parse_index(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.index.json");
    } catch (const kiln::Error&) {
    }
  }
  return 0;
}
