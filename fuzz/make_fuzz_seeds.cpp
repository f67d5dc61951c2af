// Writes a seed corpus of small valid files for the fuzz harnesses:
//   make_fuzz_seeds <gguf-dir> <safetensors-dir>
// Seeds cover every metadata value type, nested arrays, several tensor types, alignments
// and a safetensors file with metadata; libFuzzer mutates from there.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/gguf_writer.h"

namespace {

using kiln::GgmlType;
using kiln::gguf::MetaValue;
using kiln::gguf::ValueType;

std::vector<uint8_t> pattern(size_t n, uint8_t start) {
  std::vector<uint8_t> out(n);
  for (size_t k = 0; k < n; ++k) out[k] = uint8_t(start + k * 37);
  return out;
}

void save(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

std::vector<uint8_t> safetensors_file(const nlohmann::json& header, size_t data_bytes) {
  const std::string text = header.dump();
  std::vector<uint8_t> out(8);
  const uint64_t n = text.size();
  for (int k = 0; k < 8; ++k) out[size_t(k)] = uint8_t(n >> (8 * k));
  out.insert(out.end(), text.begin(), text.end());
  const auto data = pattern(data_bytes, 3);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <gguf-seed-dir> <safetensors-seed-dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path gguf_dir = argv[1], st_dir = argv[2];
  std::filesystem::create_directories(gguf_dir);
  std::filesystem::create_directories(st_dir);

  {  // every value type, no tensors
    kiln::gguf::Writer w;
    w.set_u8("u8", 1); w.set_i8("i8", -1); w.set_u16("u16", 2); w.set_i16("i16", -2);
    w.set_u32("u32", 3); w.set_i32("i32", -3); w.set_u64("u64", 4); w.set_i64("i64", -4);
    w.set_f32("f32", 0.5f); w.set_f64("f64", 0.25); w.set_bool("bool", true); w.set_string("str", "héllo");
    w.set("strs", MetaValue::strings({"a", "bc", ""}));
    w.set_array("nested", ValueType::ARRAY, {MetaValue::array(ValueType::I32, {MetaValue::i32(1), MetaValue::i32(2)})});
    save(gguf_dir / "values.gguf", w.to_bytes());
  }
  {  // a tiny model with mixed tensor types
    kiln::gguf::Writer w;
    w.set_string("general.architecture", "llama");
    w.set_u32("llama.block_count", 1);
    w.set("tokenizer.ggml.tokens", MetaValue::strings({"<s>", "</s>", "a"}));
    w.add_tensor("token_embd.weight", GgmlType::F32, {4, 3}, pattern(48, 1));
    w.add_tensor("blk.0.ffn.weight", GgmlType::Q8_0, {32, 2}, pattern(68, 2));
    w.add_tensor("blk.0.k.weight", GgmlType::Q4_K, {256}, pattern(144, 3));
    w.add_tensor("norm", GgmlType::F16, {4}, pattern(8, 4));
    save(gguf_dir / "model.gguf", w.to_bytes());
    w.set_alignment(8);
    save(gguf_dir / "model-align8.gguf", w.to_bytes());
  }
  save(st_dir / "model.safetensors",
       safetensors_file({{"__metadata__", {{"format", "pt"}}},
                         {"a", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}},
                         {"b", {{"dtype", "BF16"}, {"shape", {3}}, {"data_offsets", {16, 22}}}},
                         {"c", {{"dtype", "I8"}, {"shape", {2}}, {"data_offsets", {22, 24}}}}},
                        24));
  save(st_dir / "empty.safetensors", safetensors_file(nlohmann::json::object(), 0));
  const std::string index = R"({"metadata": {"total_size": 24}, "weight_map": {"a": "x.safetensors"}})";
  save(st_dir / "index.json", std::vector<uint8_t>(index.begin(), index.end()));
  return 0;
}
