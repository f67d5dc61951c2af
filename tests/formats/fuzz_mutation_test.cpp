// A seeded mutation fuzzer inside ctest: valid small GGUF and safetensors images are
// mutated at random (bit flips, bytes set to 0 or 0xff, truncations, u64 fields replaced by
// huge values, JSON numbers replaced by extreme ones) and parsed. Each parse must either
// succeed — and then every tensor view must lie inside the buffer — or throw kiln::Error.
// Anything else (another exception type, a crash, an ASan report) is a bug. The libFuzzer
// harnesses in fuzz/ do the same at much larger scale.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "formats/safetensors.h"
#include "format_test_util.h"

namespace kiln {
namespace {

constexpr int kIterations = 20000;  // per format; a few seconds in a debug build

std::vector<uint8_t> gguf_seed() {
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_f32("llama.rope.freq_base", 10000.0f);
  w.set_bool("b", true);
  w.set_i64("i", -5);
  w.set("tokenizer.ggml.tokens", gguf::MetaValue::strings({"<s>", "a", "bc"}));
  w.set_array("nested", gguf::ValueType::ARRAY, {gguf::MetaValue::array(gguf::ValueType::U16, {gguf::MetaValue::u16(7)})});
  w.add_tensor("a", GgmlType::F32, {8}, testing::random_bytes(32, 1));
  w.add_tensor("b", GgmlType::Q8_0, {32, 2}, testing::random_bytes(68, 2));
  w.add_tensor("c", GgmlType::F16, {4, 2, 1}, testing::random_bytes(16, 3));
  return w.to_bytes();
}

std::vector<uint8_t> safetensors_seed() {
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}},
                           {"x", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}},
                           {"y", {{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {24, 32}}}},
                           {"z", {{"dtype", "I8"}, {"shape", {3}}, {"data_offsets", {32, 35}}}}};
  const std::string text = header.dump();
  testing::GgufBytes b;
  b.u64(text.size());
  b.bytes.insert(b.bytes.end(), text.begin(), text.end());
  const auto data = testing::random_bytes(35, 4);
  b.bytes.insert(b.bytes.end(), data.begin(), data.end());
  return b.bytes;
}

// Applies 1-4 random mutations.
void mutate(std::vector<uint8_t>& bytes, std::mt19937_64& rng, bool json_aware) {
  static const uint64_t kBig[] = {0, 1, 0xff, 1ull << 31, 1ull << 32, 1ull << 62, 1ull << 63, ~0ull, ~0ull - 7};
  static const char* kNumbers[] = {"0", "-1", "18446744073709551615", "18446744073709551616", "9223372036854775808",
                                   "4294967296", "1e308", "2.5", "99999999999"};
  const int count = 1 + int(rng() % 4);
  for (int m = 0; m < count && !bytes.empty(); ++m) {
    const size_t pos = size_t(rng() % bytes.size());
    switch (rng() % (json_aware ? 6 : 5)) {
      case 0: bytes[pos] ^= uint8_t(1u << (rng() % 8)); break;
      case 1: bytes[pos] = rng() % 2 ? 0 : 0xff; break;
      case 2: bytes.resize(size_t(rng() % bytes.size())); break;
      case 3: {  // a u64 field (at any position, aligned or not) replaced by a large value
        const uint64_t v = kBig[rng() % std::size(kBig)] + (rng() % 2 ? bytes.size() : 0);
        if (pos + 8 <= bytes.size()) std::memcpy(bytes.data() + pos, &v, 8);
        break;
      }
      case 4: bytes[pos] = uint8_t(rng()); break;
      case 5: {  // a run of digits in the JSON replaced by an extreme number
        size_t start = pos;
        while (start < bytes.size() && !(bytes[start] >= '0' && bytes[start] <= '9')) ++start;
        size_t end = start;
        while (end < bytes.size() && bytes[end] >= '0' && bytes[end] <= '9') ++end;
        if (start == bytes.size()) break;
        const std::string_view n = kNumbers[rng() % std::size(kNumbers)];
        bytes.erase(bytes.begin() + std::ptrdiff_t(start), bytes.begin() + std::ptrdiff_t(end));
        bytes.insert(bytes.begin() + std::ptrdiff_t(start), n.begin(), n.end());
        // keep the header length field consistent half of the time, so the JSON gets parsed
        if (rng() % 2 && bytes.size() >= 8) {
          uint64_t len = 0;
          std::memcpy(&len, bytes.data(), 8);
          len += n.size() - (end - start);
          std::memcpy(bytes.data(), &len, 8);
        }
        break;
      }
    }
  }
}

// Reads every byte a parsed file claims, so that an out-of-bounds view shows under ASan
// and, without it, at least trips the bounds assertions here.
template <typename Tensor>
void touch_tensors(const std::vector<Tensor>& tensors, const std::vector<uint8_t>& bytes, int iteration) {
  for (const Tensor& t : tensors) {
    if (t.bytes == 0) continue;
    ASSERT_GE(t.data, bytes.data()) << "iteration " << iteration << " tensor " << t.name;
    ASSERT_LE(t.data + t.bytes, bytes.data() + bytes.size()) << "iteration " << iteration << " tensor " << t.name;
    volatile uint8_t sum = 0;
    for (size_t k = 0; k < t.bytes; ++k) sum = uint8_t(sum + t.data[k]);
  }
}

TEST(FuzzMutation, GgufGivesSuccessOrKilnError) {
  const std::vector<uint8_t> seed = gguf_seed();
  std::mt19937_64 rng(0x6775);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < kIterations; ++i) {
    std::vector<uint8_t> bytes = seed;
    mutate(bytes, rng, false);
    try {
      const auto f = gguf::File::open_memory(bytes, "fuzz.gguf");
      touch_tensors(f->tensors(), bytes, i);
      for (const auto& [key, value] : f->metadata()) {
        try {
          (void)value.as_float(key);
        } catch (const Error&) {
        }
      }
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << i << ": non-kiln exception " << typeid(e).name() << ": " << e.what();
    }
  }
  std::printf("gguf: %d mutants accepted, %d rejected with kiln::Error\n", accepted, rejected);
  EXPECT_GT(rejected, kIterations / 2);
  EXPECT_GT(accepted, 0);  // some mutations (e.g. inside tensor data) leave the file valid
}

TEST(FuzzMutation, SafetensorsGivesSuccessOrKilnError) {
  const std::vector<uint8_t> seed = safetensors_seed();
  ASSERT_NO_THROW(safetensors::File::open_memory(seed, "seed.safetensors"));
  std::mt19937_64 rng(0x5afe);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < kIterations; ++i) {
    std::vector<uint8_t> bytes = seed;
    mutate(bytes, rng, true);
    try {
      const auto f = safetensors::File::open_memory(bytes, "fuzz.safetensors");
      touch_tensors(f->tensors(), bytes, i);
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << i << ": non-kiln exception " << typeid(e).name() << ": " << e.what();
    }
  }
  std::printf("safetensors: %d mutants accepted, %d rejected with kiln::Error\n", accepted, rejected);
  EXPECT_GT(rejected, kIterations / 2);
  EXPECT_GT(accepted, 0);
}

TEST(FuzzMutation, SafetensorsIndexGivesSuccessOrKilnError) {
  const std::string seed = R"({"metadata": {"total_size": 35}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})";
  std::mt19937_64 rng(0x1dec);
  for (int i = 0; i < kIterations / 4; ++i) {
    std::vector<uint8_t> bytes(seed.begin(), seed.end());
    mutate(bytes, rng, true);
    try {
      safetensors::parse_index(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "index.json");
    } catch (const Error&) {
    } catch (const std::exception& e) {
      FAIL() << "iteration " << i << ": non-kiln exception " << typeid(e).name() << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln
