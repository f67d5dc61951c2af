// Split GGUF models (llama.cpp's gguf-split convention): written in 3 parts, opened as one
// model from any part; inconsistent part sets are refused with the offending file named.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "format_test_util.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::random_bytes;
using testing::ScratchDir;

// A small model: 7 tensors of mixed types, with metadata.
gguf::Writer small_model(std::vector<std::vector<uint8_t>>& payloads) {
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 7);
  w.set("tokenizer.ggml.tokens", gguf::MetaValue::strings({"a", "b", "c"}));
  for (int k = 0; k < 7; ++k) {
    const GgmlType type = k % 2 ? GgmlType::Q8_0 : GgmlType::F32;
    const std::vector<int64_t> shape = {32, k + 1};
    payloads.push_back(random_bytes(*row_bytes(type, 32) * size_t(k + 1), uint32_t(k)));
    w.add_tensor(fmt::format("blk.{}.weight", k), type, shape, payloads.back());
  }
  return w;
}

TEST(GgufSplit, ThreePartsOpenAsOneModelFromAnyPart) {
  ScratchDir dir;
  std::vector<std::vector<uint8_t>> payloads;
  gguf::Writer w = small_model(payloads);
  w.set_alignment(64);
  const auto paths = w.write_split(dir.file("model"), 3);
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(std::filesystem::path(paths[0]).filename(), "model-00001-of-00003.gguf");
  EXPECT_EQ(std::filesystem::path(paths[2]).filename(), "model-00003-of-00003.gguf");

  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    const auto f = gguf::File::open(path);
    ASSERT_EQ(f->paths().size(), 3u);
    EXPECT_EQ(f->paths()[0], paths[0]);
    EXPECT_EQ(f->alignment(), 64u);
    EXPECT_EQ(f->get_int("llama.block_count"), 7);
    EXPECT_EQ(f->get_int("split.count"), 3);
    EXPECT_EQ(f->get("split.count").type, gguf::ValueType::U16);
    EXPECT_EQ(f->get("split.no").type, gguf::ValueType::U16);
    EXPECT_EQ(f->get("split.tensors.count").type, gguf::ValueType::I32);
    EXPECT_EQ(f->get_int("split.tensors.count"), 7);
    ASSERT_EQ(f->tensors().size(), 7u);
    for (int k = 0; k < 7; ++k) {
      const auto& t = f->tensors()[size_t(k)];
      EXPECT_EQ(t.name, fmt::format("blk.{}.weight", k));
      EXPECT_EQ(t.file_index, k < 3 ? 0 : k < 5 ? 1 : 2);  // 7 tensors split 3 + 2 + 2
      EXPECT_EQ(t.file_offset % 64, 0u);
      ASSERT_EQ(t.bytes, payloads[size_t(k)].size());
      EXPECT_EQ(std::memcmp(t.data, payloads[size_t(k)].data(), t.bytes), 0) << t.name;
    }
  }
}

TEST(GgufSplit, AMissingPartIsNamed) {
  ScratchDir dir;
  std::vector<std::vector<uint8_t>> payloads;
  const auto paths = small_model(payloads).write_split(dir.file("m"), 3);
  std::filesystem::remove(paths[1]);
  expect_error([&] { gguf::File::open(paths[2]); }, {"m-00002-of-00003.gguf", "cannot open"});
}

TEST(GgufSplit, PartsFromAnotherModelAreRefused) {
  ScratchDir dir;
  std::vector<std::vector<uint8_t>> payloads;
  const auto paths = small_model(payloads).write_split(dir.file("m"), 3);
  // Part 2 swapped for part 3: split.no disagrees with its position.
  std::filesystem::copy_file(paths[2], paths[1], std::filesystem::copy_options::overwrite_existing);
  expect_error([&] { gguf::File::open(paths[0]); }, {"m-00002-of-00003.gguf", "split.no is 2", "part 2"});

  // Two parts written under a three-part name.
  ScratchDir other;
  const auto two = small_model(payloads).write_split(other.file("t"), 2);
  std::filesystem::rename(two[0], other.file("t-00001-of-00003.gguf"));
  expect_error([&] { gguf::File::open(other.file("t-00001-of-00003.gguf")); },
               {"t-00001-of-00003.gguf", "3 parts", "split.count says 2"});

  // A split part whose name lacks the -NNNNN-of-NNNNN suffix.
  std::filesystem::copy_file(paths[0], dir.file("renamed.gguf"));
  expect_error([&] { gguf::File::open(dir.file("renamed.gguf")); }, {"renamed.gguf", "-NNNNN-of-NNNNN.gguf"});
  // ...or given to open_memory.
  const MappedFile part(paths[0]);
  expect_error([&] { gguf::File::open_memory(part.bytes(), "mem.gguf"); }, {"mem.gguf", "split model"});
}

TEST(GgufSplit, WrongTensorTotalIsRefused) {
  ScratchDir dir;
  std::vector<std::vector<uint8_t>> payloads;
  gguf::Writer w = small_model(payloads);
  const auto paths = w.write_split(dir.file("m"), 2);
  // Rewrite part 1 with a false split.tensors.count and the same tensors.
  const auto first = gguf::File::open(paths[0]);
  gguf::Writer part1;
  for (const auto& [key, value] : first->metadata()) part1.set(key, gguf::MetaValue::from(value));
  part1.set_i32("split.tensors.count", 99);
  for (size_t k = 0; k < 4; ++k) {
    const auto& t = first->tensors()[k];
    part1.add_tensor(t.name, t.type, t.shape, std::span<const uint8_t>(t.data, t.bytes));
  }
  const auto bytes = part1.to_bytes();
  testing::write_file(dir.file("x-00001-of-00002.gguf"), bytes);
  std::filesystem::copy_file(paths[1], dir.file("x-00002-of-00002.gguf"));
  expect_error([&] { gguf::File::open(dir.file("x-00002-of-00002.gguf")); },
               {"x-00001-of-00002.gguf", "split.tensors.count says 99", "hold 7"});
}

TEST(GgufSplit, DuplicateTensorAcrossPartsIsRefused) {
  ScratchDir dir;
  gguf::Writer a, b;
  for (gguf::Writer* w : {&a, &b}) {
    w->set_u16("split.count", 2);
    w->set_i32("split.tensors.count", 2);
    w->add_tensor("same", GgmlType::F32, {2}, random_bytes(8, 1));
  }
  a.set_u16("split.no", 0);
  b.set_u16("split.no", 1);
  a.write(dir.file("d-00001-of-00002.gguf"));
  b.write(dir.file("d-00002-of-00002.gguf"));
  expect_error([&] { gguf::File::open(dir.file("d-00001-of-00002.gguf")); },
               {"d-00002-of-00002.gguf", "duplicate tensor name 'same'"});
}

TEST(GgufSplit, WriterRefusesImpossibleSplits) {
  std::vector<std::vector<uint8_t>> payloads;
  gguf::Writer w = small_model(payloads);
  expect_error([&] { w.write_split("never", 8); }, {"7 tensors", "8 parts"});
  expect_error([&] { w.write_split("never", 0); }, {"0 parts"});
}

}  // namespace
}  // namespace kiln
