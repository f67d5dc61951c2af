#pragma once
// safetensors checkpoints (Hugging Face), read from memory mappings.
//
// A file is: u64 little-endian header length N, N bytes of JSON, then the tensor data.
// The JSON maps each tensor name to {"dtype", "shape" (outermost first), "data_offsets":
// [begin, end) relative to the data}, plus an optional "__metadata__" object of strings.
// As in the reference implementation, the tensors must tile the data exactly: no gaps,
// no overlaps, nothing left over. A sharded checkpoint lists which file holds each tensor
// in model.safetensors.index.json ("weight_map").
//
// Every field is checked before use; a bad file gives a kiln::Error naming the file, what
// is wrong and where (byte offset or tensor name). Tensors are views into the mapping.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "quant/types.h"

namespace kiln::safetensors {

enum class Dtype {
  F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL,
  F8_E4M3, F8_E5M2,  // 8-bit floats: recognised and exposed as raw bytes, not converted
};

std::string_view dtype_name(Dtype d);  // as spelled in the files: "F32", "BF16", ...
std::optional<Dtype> dtype_from_name(std::string_view name);
size_t dtype_size(Dtype d);            // bytes per element
// The ggml type with the same element encoding, where one exists (F64, F32, F16, BF16,
// I64, I32, I16, I8), so that tensors of both formats can be handled alike.
std::optional<GgmlType> to_ggml_type(Dtype d);

struct Tensor {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;  // outermost first, as PyTorch and the file list it
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  uint64_t file_offset = 0;    // absolute offset of the data in its file
  int file_index = 0;          // which file of a checkpoint holds it

  int64_t elements() const;
  // The shape innermost first, the order of gguf::TensorInfo::shape.
  std::vector<int64_t> ggml_shape() const { return {shape.rbegin(), shape.rend()}; }
};

// One .safetensors file.
class File {
 public:
  static std::unique_ptr<File> open(const std::string& path);
  // Parses bytes already in memory; `name` stands for the file in errors. The bytes are
  // not copied and must outlive the File.
  static std::unique_ptr<File> open_memory(std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return path_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }  // in data order
  const Tensor* find(std::string_view name) const;
  // The "__metadata__" strings (e.g. "format": "pt").
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  friend class Checkpoint;  // numbers the files of a checkpoint (Tensor::file_index)
  File() = default;
  void parse();

  std::optional<MappedFile> map_;
  std::span<const uint8_t> bytes_;
  std::string path_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// The weight map of a model.safetensors.index.json: tensor name -> shard file name.
// Shard names must be plain file names in the index's directory.
std::map<std::string, std::string> parse_index(std::string_view json_text, const std::string& source);

// A whole checkpoint: one file, a sharded set, or a Hugging Face model directory.
class Checkpoint {
 public:
  // `path` may be a directory (model.safetensors.index.json, else model.safetensors, else
  // every *.safetensors in it; config.json and generation_config.json are read when
  // present), an index .json, or a single .safetensors file.
  static std::unique_ptr<Checkpoint> open(const std::string& path);

  const std::vector<std::unique_ptr<File>>& files() const { return files_; }
  // Every tensor of every file, file by file.
  const std::vector<const Tensor*>& tensors() const { return tensors_; }
  const Tensor* find(std::string_view name) const;
  const Tensor& get(std::string_view name) const;  // throws naming the tensor when absent

  // Parsed config.json / generation_config.json, or null json when absent.
  const nlohmann::json& config() const { return config_; }
  const nlohmann::json& generation_config() const { return generation_config_; }
  bool has_config() const { return !config_.is_null(); }
  bool has_generation_config() const { return !generation_config_.is_null(); }

 private:
  Checkpoint() = default;
  void add_file(const std::string& path);
  void open_index(const std::string& index_path);

  std::string source_;
  std::vector<std::unique_ptr<File>> files_;
  std::vector<const Tensor*> tensors_;
  std::map<std::string, const Tensor*, std::less<>> index_;
  nlohmann::json config_;
  nlohmann::json generation_config_;
};

// Reads and parses a JSON file; errors name the file and the byte offset.
nlohmann::json read_json_file(const std::string& path);

}  // namespace kiln::safetensors
