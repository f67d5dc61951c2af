// The GGUF reader on broken files: each must give a kiln::Error that names the file and
// what is wrong, never a crash, a hang or a huge allocation.
#include <gtest/gtest.h>

#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "format_test_util.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::GgufBytes;

constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2;

std::string open_error(const std::vector<uint8_t>& bytes, std::initializer_list<std::string_view> words) {
  return expect_error([&] { gguf::File::open_memory(bytes, "bad.gguf"); }, words);
}

// A valid file whose last tensor ends exactly on the alignment, so that every strict
// prefix of it is missing something the reader needs.
std::vector<uint8_t> small_valid_file() {
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_array("arr", gguf::ValueType::ARRAY,
              {gguf::MetaValue::array(gguf::ValueType::I16, {gguf::MetaValue::i16(5)}),
               gguf::MetaValue::strings({"x", "yz"})});
  w.set_bool("flag", true);
  w.add_tensor("a", GgmlType::F32, {5}, testing::random_bytes(20, 1));
  w.add_tensor("b", GgmlType::Q4_0, {32, 2}, testing::random_bytes(36, 2));
  w.add_tensor("c", GgmlType::F16, {16}, testing::random_bytes(32, 3));
  return w.to_bytes();
}

TEST(GgufCorruption, TheSmallFileIsValid) {
  const auto bytes = small_valid_file();
  const auto f = gguf::File::open_memory(bytes, "small.gguf");
  EXPECT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->tensors().back().file_offset + f->tensors().back().bytes, bytes.size());
}

TEST(GgufCorruption, EveryTruncationIsAnError) {
  const auto bytes = small_valid_file();
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + std::ptrdiff_t(n));
    try {
      gguf::File::open_memory(prefix, "cut.gguf");
      ADD_FAILURE() << "a prefix of " << n << " of " << bytes.size() << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cut.gguf"), std::string::npos) << n << ": " << e.what();
    }
  }
}

TEST(GgufCorruption, BadMagicAndVersions) {
  auto bytes = small_valid_file();
  bytes[3] = 'X';
  open_error(bytes, {"bad.gguf", "bad magic", "offset 0"});
  bytes = small_valid_file();
  const uint8_t big_endian_3[4] = {0, 0, 0, 3};
  std::memcpy(bytes.data() + 4, big_endian_3, 4);
  open_error(bytes, {"bad.gguf", "big-endian"});
  bytes[7] = 0;
  bytes[4] = 1;
  open_error(bytes, {"bad.gguf", "version 1"});
  bytes[4] = 4;
  open_error(bytes, {"bad.gguf", "unknown GGUF version 4"});
  open_error({}, {"bad.gguf", "truncated", "magic"});
}

TEST(GgufCorruption, AbsurdCountsAndLengthsAreRefusedBeforeAllocating) {
  open_error(GgufBytes().header(3, 1ull << 60, 0).zeros(64).bytes, {"bad.gguf", "tensor count 1152921504606846976"});
  open_error(GgufBytes().header(3, 0, 1ull << 60).zeros(64).bytes, {"bad.gguf", "metadata count"});
  open_error(GgufBytes().header(3, 0, 1).u64(1ull << 63).zeros(64).bytes,
             {"bad.gguf", "metadata key", "string length 9223372036854775808"});
  open_error(GgufBytes().header(3, 0, 1).str("k").u32(8).u64(~0ull).zeros(8).bytes, {"bad.gguf", "'k'", "string length"});
  open_error(GgufBytes().header(3, 0, 1).str("k").u32(9).u32(0).u64(1ull << 62).zeros(64).bytes,
             {"bad.gguf", "'k'", "array of 4611686018427387904"});
  open_error(GgufBytes().header(3, 0, 1).str("k").u32(9).u32(8).u64(1ull << 62).zeros(64).bytes,
             {"bad.gguf", "'k'", "string values cannot fit"});
  open_error(GgufBytes().header(3, 1, 0).u64(1ull << 62).zeros(64).bytes, {"bad.gguf", "tensor name", "string length"});
}

TEST(GgufCorruption, BadValues) {
  open_error(GgufBytes().header(3, 0, 1).str("k").u32(13).u32(0).bytes, {"bad.gguf", "'k'", "unknown value type 13"});
  open_error(GgufBytes().header(3, 0, 1).str("k").u32(9).u32(77).u64(0).bytes,
             {"bad.gguf", "'k'", "unknown array element type 77"});
  open_error(GgufBytes().header(3, 0, 1).str("k").u32(7).pod(uint8_t(2)).bytes, {"bad.gguf", "'k'", "boolean"});
  open_error(GgufBytes().header(3, 0, 1).str("bad\xff").u32(4).u32(0).bytes, {"bad.gguf", "metadata key", "UTF-8"});
  open_error(GgufBytes().header(3, 0, 1).str("k").u32(8).str("\xed\xa0\x80").bytes, {"bad.gguf", "'k'", "UTF-8"});  // surrogate
  open_error(GgufBytes().header(3, 0, 1).str("").u32(4).u32(0).bytes, {"bad.gguf", "empty metadata key"});
  open_error(GgufBytes().header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).bytes, {"bad.gguf", "duplicate metadata key 'k'"});
  open_error(GgufBytes().header(3, 0, 1).kv_u32("general.alignment", 48).bytes,
             {"bad.gguf", "general.alignment 48", "power of two"});
  open_error(GgufBytes().header(3, 0, 1).kv_str("general.alignment", "32").bytes,
             {"bad.gguf", "general.alignment", "expected an integer"});
  open_error(GgufBytes().header(3, 0, 1).kv_str("split.count", "2").bytes, {"bad.gguf", "split.count", "integer"});

  GgufBytes deep;
  deep.header(3, 0, 1).str("deep").u32(9);
  for (int k = 0; k < 20; ++k) deep.u32(9).u64(1);
  deep.u32(0).u64(0);
  open_error(deep.bytes, {"bad.gguf", "'deep'", "nested deeper"});
}

TEST(GgufCorruption, BadTensorInfos) {
  const auto one_tensor = [](std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                             size_t data_bytes) {
    return GgufBytes().header(3, 1, 0).tensor(name, std::move(dims), type, offset).pad_to(32).zeros(data_bytes).bytes;
  };
  open_error(one_tensor("t", {4}, 4, 0, 16), {"bad.gguf", "tensor 't'", "unknown type id 4"});
  open_error(one_tensor("t", {4}, 200, 0, 16), {"bad.gguf", "tensor 't'", "unknown type id 200"});
  open_error(one_tensor("t", {1, 1, 1, 1, 1}, kF32, 0, 16), {"bad.gguf", "tensor 't'", "5 dimensions"});
  open_error(one_tensor("t", {1ull << 32, 1ull << 32}, kF32, 0, 16), {"bad.gguf", "tensor 't'", "overflow"});
  open_error(one_tensor("t", {1ull << 63}, kF32, 0, 16), {"bad.gguf", "tensor 't'", "overflow"});
  open_error(one_tensor("t", {1ull << 61}, kF32, 0, 16), {"bad.gguf", "tensor 't'", "past the end"});
  open_error(one_tensor("t", {31}, kQ4_0, 0, 32), {"bad.gguf", "tensor 't'", "not a multiple of the q4_0 block size 32"});
  open_error(one_tensor("t", {4}, kF32, 16, 32), {"bad.gguf", "tensor 't'", "offset 16", "alignment 32"});
  open_error(one_tensor("t", {8}, kF32, 0, 16), {"bad.gguf", "tensor 't'", "past the end"});
  open_error(one_tensor("t", {4}, kF32, 1ull << 62, 16), {"bad.gguf", "tensor 't'", "past the end"});
  open_error(one_tensor("t\xc3", {4}, kF32, 0, 16), {"bad.gguf", "tensor name", "UTF-8"});
  // Tensor infos that end the file: the data section would start past the end.
  open_error(GgufBytes().header(3, 1, 0).tensor("t", {4}, kF32, 0).bytes, {"bad.gguf", "past the end"});

  // a: 64 bytes, b: 2 * b_elements bytes, in a data section of 128 bytes.
  const auto two = [](uint64_t offset_a, uint64_t offset_b, std::string_view name_b, uint64_t b_elements = 16) {
    return GgufBytes()
        .header(3, 2, 0)
        .tensor("a", {16}, kF32, offset_a)
        .tensor(name_b, {b_elements}, kF16, offset_b)
        .pad_to(32)
        .zeros(128)
        .bytes;
  };
  EXPECT_NO_THROW(gguf::File::open_memory(two(0, 64, "b"), "fine.gguf"));
  open_error(two(0, 32, "b"), {"bad.gguf", "tensor 'b'", "overlaps tensor 'a'"});
  EXPECT_NO_THROW(gguf::File::open_memory(two(64, 32, "b"), "fine.gguf"));
  open_error(two(32, 0, "b", 64), {"bad.gguf", "tensor 'a'", "overlaps tensor 'b'"});
  open_error(two(0, 64, "a"), {"bad.gguf", "duplicate tensor name 'a'"});
}

TEST(GgufCorruption, ErrorsGiveTheByteOffset) {
  // The unknown value type sits right after header (24 bytes) and the key (8 + 1 bytes).
  const std::string message =
      open_error(GgufBytes().header(3, 0, 1).str("k").u32(13).bytes, {"bad.gguf", "at offset 37"});
  EXPECT_FALSE(message.empty());
}

}  // namespace
}  // namespace kiln
