// The GGUF reader (and writer) on the real files of the reference data, all written by
// llama.cpp's own tools.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "support/testdata.h"

namespace kiln {
namespace {

std::vector<std::filesystem::path> testdata_gguf_files() {
  std::vector<std::filesystem::path> out;
  const std::filesystem::path root = testing::testdata_root();
  if (root.empty()) return out;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root))
    if (entry.is_regular_file() && entry.path().extension() == ".gguf") out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(GgufTestdata, EveryFileOpensAndItsTensorsLieInsideIt) {
  const auto files = testdata_gguf_files();
  if (files.empty()) GTEST_SKIP() << "reference data absent (set KILN_TESTDATA or provide ../shared/testdata)";
  EXPECT_GE(files.size(), 20u) << "the reference data should hold the arch, quant, model and vocab GGUFs";
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    const auto file = gguf::File::open(path.string());
    EXPECT_TRUE(file->version() == 2 || file->version() == 3);
    EXPECT_FALSE(file->metadata().empty());
    EXPECT_FALSE(file->architecture().empty()) << "general.architecture missing";
    {
      const MappedFile probe(path.string());
      EXPECT_EQ(probe.size(), file->total_file_bytes());
    }
    size_t total = 0;
    for (const auto& t : file->tensors()) {
      ASSERT_NE(t.data, nullptr) << t.name;
      EXPECT_EQ(t.file_offset % file->alignment(), 0u) << t.name;
      EXPECT_LE(t.file_offset + t.bytes, file->total_file_bytes()) << t.name;
      const auto row = row_bytes(t.type, t.shape.empty() ? 1 : t.shape[0]);
      ASSERT_TRUE(row.has_value()) << t.name;
      EXPECT_EQ(*row * size_t(t.rows()), t.bytes) << t.name;
      EXPECT_EQ(file->find_tensor(t.name), &t);
      total += t.bytes;
    }
    EXPECT_LE(total, file->total_file_bytes());
  }
}

TEST(GgufTestdata, Stories260KHasTheStatedHyperParameters) {
  KILN_REQUIRE_TESTDATA(path, "models/stories260K.gguf");
  const auto file = gguf::File::open(path.string());
  // The README states: 5 layers, 8 heads, 4 KV heads, FFN width 172, vocabulary of 512, F32.
  EXPECT_EQ(file->architecture(), "llama");
  EXPECT_EQ(file->get_int("llama.block_count"), 5);
  EXPECT_EQ(file->get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(file->get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(file->get_int("llama.feed_forward_length"), 172);
  const auto& tokens = file->get("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.elem_type, gguf::ValueType::STRING);
  EXPECT_EQ(tokens.as_array().size(), 512u);
  EXPECT_EQ(file->get_string("tokenizer.ggml.model"), "llama");  // SentencePiece

  const int64_t embd = file->get_int("llama.embedding_length");
  const auto* token_embd = file->find_tensor("token_embd.weight");
  ASSERT_NE(token_embd, nullptr);
  EXPECT_EQ(token_embd->type, GgmlType::F32);
  EXPECT_EQ(token_embd->shape, (std::vector<int64_t>{embd, 512}));
  const auto* ffn_down = file->find_tensor("blk.4.ffn_down.weight");
  ASSERT_NE(ffn_down, nullptr);
  EXPECT_EQ(ffn_down->shape, (std::vector<int64_t>{172, embd}));
  EXPECT_EQ(file->find_tensor("blk.5.ffn_down.weight"), nullptr);
  for (const auto& t : file->tensors()) EXPECT_EQ(t.type, GgmlType::F32) << t.name;
}

TEST(GgufTestdata, ArchLlamaMatchesItsHfConfig) {
  KILN_REQUIRE_TESTDATA(path, "arch/llama.gguf");
  const auto file = gguf::File::open(path.string());
  // arch/hf/llama/config.json: hidden 128, 2 layers, 2 heads, 1 KV head, FFN 256, rope theta 5e5.
  EXPECT_EQ(file->get_int("llama.embedding_length"), 128);
  EXPECT_EQ(file->get_int("llama.block_count"), 2);
  EXPECT_EQ(file->get_int("llama.attention.head_count"), 2);
  EXPECT_EQ(file->get_int("llama.attention.head_count_kv"), 1);
  EXPECT_EQ(file->get_int("llama.feed_forward_length"), 256);
  EXPECT_FLOAT_EQ(float(file->get_float("llama.rope.freq_base")), 500000.0f);
}

// Copying a llama.cpp-written file through kiln's writer (all metadata, every tensor in
// order) reproduces it byte for byte: same layout, alignment and padding rules.
TEST(GgufTestdata, WriterReproducesLlamaCppFilesByteForByte) {
  const auto files = testdata_gguf_files();
  if (files.empty()) GTEST_SKIP() << "reference data absent";
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    const auto source = gguf::File::open(path.string());
    if (source->version() != 3) continue;
    gguf::Writer writer;
    writer.copy_metadata_from(*source);
    for (const auto& t : source->tensors())
      writer.add_tensor(t.name, t.type, t.shape, std::span<const uint8_t>(t.data, t.bytes));
    const std::vector<uint8_t> copy = writer.to_bytes();
    const MappedFile original(path.string());
    ASSERT_EQ(copy.size(), original.size());
    const auto mismatch = std::mismatch(copy.begin(), copy.end(), original.data());
    EXPECT_TRUE(mismatch.first == copy.end())
        << "first difference at byte " << (mismatch.first - copy.begin()) << ": kiln "
        << int(*mismatch.first) << ", llama.cpp " << int(*mismatch.second);
  }
}

}  // namespace
}  // namespace kiln
