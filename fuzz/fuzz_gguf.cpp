// libFuzzer harness for the GGUF reader (and, on what it accepts, the writer).
// Any input must give a parsed file or a kiln::Error; another exception escapes and is
// reported as a crash, as are ASan/UBSan findings. See docs/fuzzing.md.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"

namespace {

// Reads every byte a tensor view claims, so an out-of-bounds view trips ASan.
uint8_t touch(const kiln::gguf::File& f) {
  uint8_t sum = 0;
  for (const auto& t : f.tensors())
    for (size_t k = 0; k < t.bytes; ++k) sum = uint8_t(sum + t.data[k]);
  return sum;
}

// Copies an accepted file through the writer and requires the reader to accept the copy
// with the same metadata keys and tensors: a differential check of reader and writer.
void round_trip(const kiln::gguf::File& f) {
  kiln::gguf::Writer w;
  std::vector<uint8_t> copy;
  try {
    for (const auto& [key, value] : f.metadata()) w.set(key, kiln::gguf::MetaValue::from(value));
    for (const auto& t : f.tensors()) w.add_tensor(t.name, t.type, t.shape, std::span<const uint8_t>(t.data, t.bytes));
    copy = w.to_bytes();
  } catch (const kiln::Error&) {
    return;  // the writer is stricter than the reader in places (e.g. alignment key type)
  }
  const auto again = kiln::gguf::File::open_memory(copy, "copy.gguf");  // must not throw
  if (again->metadata().size() != f.metadata().size() || again->tensors().size() != f.tensors().size()) __builtin_trap();
  for (size_t k = 0; k < f.tensors().size(); ++k) {
    const auto &a = f.tensors()[k], &b = again->tensors()[k];
    if (a.name != b.name || a.bytes != b.bytes || a.shape != b.shape || std::memcmp(a.data, b.data, a.bytes) != 0)
      __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = kiln::gguf::File::open_memory(std::span<const uint8_t>(data, size), "fuzz.gguf");
    volatile uint8_t sink = touch(*f);
    (void)sink;
    for (const auto& [key, value] : f->metadata()) {
      try {
        (void)value.as_float(key);
      } catch (const kiln::Error&) {
      }
    }
    round_trip(*f);
  } catch (const kiln::Error&) {
  }
  return 0;
}
