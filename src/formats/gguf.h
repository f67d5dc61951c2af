#pragma once
// GGUF model files (versions 2 and 3), read from a memory mapping.
//
// Layout: magic "GGUF", u32 version, u64 tensor count, u64 metadata count, then the
// metadata (key string, u32 value type, value), then the tensor infos (name, u32 n_dims,
// u64 dims[n_dims] innermost first, u32 type, u64 offset), then padding to
// `general.alignment` (default 32) and the tensor data. Strings are u64 length + bytes.
//
// Tensors are views into the mapping, never copies. A split model
// (name-00001-of-00003.gguf) opens as one: metadata from the first file, tensors from all.
// Every count, length and offset is checked against the file before use; a bad file gives
// a kiln::Error naming the file, what is wrong and its byte offset or key.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "quant/types.h"

namespace kiln::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view value_type_name(ValueType t);

// One metadata value. Strings are views into the mapped file; arrays hold their items.
struct Value {
  ValueType type = ValueType::U8;
  union {
    uint64_t u;  // U8 U16 U32 U64, BOOL (0/1)
    int64_t i;   // I8 I16 I32 I64
    double f;    // F32 F64
  } num{0};
  std::string_view str;       // STRING
  ValueType elem_type = ValueType::U8;  // ARRAY: type of the items
  std::vector<Value> items;   // ARRAY

  bool is_integer() const;
  bool is_float() const { return type == ValueType::F32 || type == ValueType::F64; }
  // Conversions throw kiln::Error (naming `key`) when the type does not fit.
  int64_t as_int(std::string_view key = {}) const;
  double as_float(std::string_view key = {}) const;
  bool as_bool(std::string_view key = {}) const;
  std::string_view as_string(std::string_view key = {}) const;
  const std::vector<Value>& as_array(std::string_view key = {}) const;
};

struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> shape;  // ne[0] (innermost, contiguous) first
  size_t bytes = 0;            // size of the data
  uint64_t file_offset = 0;    // absolute offset of the data in its file
  int file_index = 0;          // which split file holds it
  const uint8_t* data = nullptr;

  int64_t elements() const;
  int64_t rows() const { return shape.empty() ? 1 : elements() / shape[0]; }
};

class File {
 public:
  // Opens a GGUF file, or all parts of a split model when given any of its parts' names
  // that ends in -00001-of-000NN.gguf.
  static std::unique_ptr<File> open(const std::string& path);
  // Parses a GGUF image already in memory (e.g. for fuzzing or embedded models). `name`
  // stands for the file in error messages. The bytes are not copied: they must outlive the
  // File. A split model cannot be opened this way (its other parts are files).
  static std::unique_ptr<File> open_memory(std::span<const uint8_t> bytes, const std::string& name);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  const std::vector<std::string>& paths() const { return paths_; }
  size_t total_file_bytes() const;

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Typed lookups that throw a clear error when the key is missing or mistyped.
  const Value& get(std::string_view key) const;
  int64_t get_int(std::string_view key) const { return get(key).as_int(key); }
  double get_float(std::string_view key) const { return get(key).as_float(key); }
  std::string_view get_string(std::string_view key) const { return get(key).as_string(key); }
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string_view get_string(std::string_view key, std::string_view fallback) const;
  // `general.architecture`, or "" when absent.
  std::string_view architecture() const { return get_string("general.architecture", ""); }

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  File() = default;
  static std::unique_ptr<File> open_split(const std::string& path, bool allow_restart);
  void add_part(const std::string& path);
  struct PartSplit {
    uint64_t no = 0;     // split.no (0 when absent)
    uint64_t count = 0;  // split.count (0 when absent)
  };
  PartSplit parse_part(size_t part, bool first);

  std::vector<MappedFile> maps_;             // owns the bytes of file-backed parts
  std::vector<std::span<const uint8_t>> parts_;  // the bytes of each part, in part order
  std::vector<std::string> paths_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Whether a byte sequence is well-formed UTF-8 (shortest forms, no surrogates).
bool is_valid_utf8(std::string_view s);

}  // namespace kiln::gguf
