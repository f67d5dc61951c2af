#pragma once
// Writing GGUF version 3 files (the layout is described in gguf.h).
//
// A Writer collects metadata and tensor descriptions in memory; tensor data is either
// attached (a view of bytes that outlive the write, or an owned buffer) or streamed: the
// header is written first, then the data tensor by tensor through a DataStream, so a
// multi-GB model never has to be held in memory. Every tensor starts at a multiple of
// `general.alignment` (default 32) and the padding between tensors is zero bytes.
//
//   gguf::Writer w;
//   w.copy_metadata_from(source);           // or w.set_string("general.architecture", "llama"), ...
//   w.add_tensor("token_embd.weight", GgmlType::Q8_0, {4096, 32000});
//   auto out = w.begin("model.gguf");
//   out.write(bytes_of_token_embd);          // in as many pieces as convenient
//   out.finish();                            // the file appears only now (written to a temporary name)
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf.h"
#include "quant/types.h"

namespace kiln::gguf {

// A metadata value that owns its strings and items (gguf::Value views a mapping instead).
struct MetaValue {
  ValueType type = ValueType::U8;
  union {
    uint64_t u;
    int64_t i;
    double f;
  } num{0};
  std::string str;                      // STRING
  ValueType elem_type = ValueType::U8;  // ARRAY: type of every item
  std::vector<MetaValue> items;         // ARRAY

  static MetaValue u8(uint8_t v) { return unsigned_of(ValueType::U8, v); }
  static MetaValue u16(uint16_t v) { return unsigned_of(ValueType::U16, v); }
  static MetaValue u32(uint32_t v) { return unsigned_of(ValueType::U32, v); }
  static MetaValue u64(uint64_t v) { return unsigned_of(ValueType::U64, v); }
  static MetaValue i8(int8_t v) { return signed_of(ValueType::I8, v); }
  static MetaValue i16(int16_t v) { return signed_of(ValueType::I16, v); }
  static MetaValue i32(int32_t v) { return signed_of(ValueType::I32, v); }
  static MetaValue i64(int64_t v) { return signed_of(ValueType::I64, v); }
  static MetaValue f32(float v) { return float_of(ValueType::F32, v); }
  static MetaValue f64(double v) { return float_of(ValueType::F64, v); }
  static MetaValue boolean(bool v) { return unsigned_of(ValueType::BOOL, v ? 1 : 0); }
  static MetaValue string(std::string_view v);
  // An array whose items all have type `elem_type` (checked when the file is written).
  static MetaValue array(ValueType elem_type, std::vector<MetaValue> items);
  static MetaValue strings(const std::vector<std::string>& v);
  // A deep copy of a value read from a file.
  static MetaValue from(const Value& v);

 private:
  static MetaValue unsigned_of(ValueType t, uint64_t v);
  static MetaValue signed_of(ValueType t, int64_t v);
  static MetaValue float_of(ValueType t, double v);
};

// A tensor to be written. `shape` is innermost first, as in gguf::TensorInfo.
struct TensorSpec {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> shape;
  size_t bytes = 0;                  // computed from type and shape
  std::span<const uint8_t> data;     // attached data, or empty when streamed
  std::vector<uint8_t> owned;        // backing store when the writer owns the data
};

class Writer;

// Streams tensor data after the header: bytes go to the tensors in the order they were
// added, and may arrive in any number of pieces. finish() checks every tensor got exactly
// its size and moves the file into place; a stream dropped before finish() removes it.
class DataStream {
 public:
  DataStream(DataStream&& other) noexcept;
  DataStream& operator=(DataStream&&) = delete;
  ~DataStream();

  void write(std::span<const uint8_t> bytes);
  // Writes the whole of the next tensor's data (checks the size matches).
  void write_tensor(std::string_view name, std::span<const uint8_t> bytes);
  // Name of the tensor the next bytes belong to, or "" when all data has been written.
  std::string_view current_tensor() const;
  void finish();

 private:
  friend class Writer;
  DataStream(const Writer& writer, std::string path);
  void put(const void* p, size_t n);
  void pad_to(uint64_t offset);
  void close_and_remove();

  const Writer* writer_;      // must outlive the stream
  std::vector<uint64_t> offsets_;  // of each tensor, relative to the data section
  std::string path_;       // final name
  std::string temp_path_;  // written here, renamed on finish()
  std::FILE* file_ = nullptr;
  size_t tensor_ = 0;         // index of the tensor being written
  uint64_t written_ = 0;      // bytes of that tensor written so far
  uint64_t data_offset_ = 0;  // position relative to the start of the data section
};

class Writer {
 public:
  Writer() = default;

  // Metadata, kept in insertion order; setting an existing key replaces its value in place.
  void set(std::string_view key, MetaValue value);
  void set_u8(std::string_view key, uint8_t v) { set(key, MetaValue::u8(v)); }
  void set_i8(std::string_view key, int8_t v) { set(key, MetaValue::i8(v)); }
  void set_u16(std::string_view key, uint16_t v) { set(key, MetaValue::u16(v)); }
  void set_i16(std::string_view key, int16_t v) { set(key, MetaValue::i16(v)); }
  void set_u32(std::string_view key, uint32_t v) { set(key, MetaValue::u32(v)); }
  void set_i32(std::string_view key, int32_t v) { set(key, MetaValue::i32(v)); }
  void set_u64(std::string_view key, uint64_t v) { set(key, MetaValue::u64(v)); }
  void set_i64(std::string_view key, int64_t v) { set(key, MetaValue::i64(v)); }
  void set_f32(std::string_view key, float v) { set(key, MetaValue::f32(v)); }
  void set_f64(std::string_view key, double v) { set(key, MetaValue::f64(v)); }
  void set_bool(std::string_view key, bool v) { set(key, MetaValue::boolean(v)); }
  void set_string(std::string_view key, std::string_view v) { set(key, MetaValue::string(v)); }
  void set_array(std::string_view key, ValueType elem_type, std::vector<MetaValue> items) {
    set(key, MetaValue::array(elem_type, std::move(items)));
  }
  bool remove(std::string_view key);
  const MetaValue* find(std::string_view key) const;
  const std::vector<std::pair<std::string, MetaValue>>& metadata() const { return kv_; }

  // Copies every metadata key of `source` (in its order) except the split.* keys, which
  // describe the source's own layout; `skip` may exclude more.
  void copy_metadata_from(const File& source, const std::function<bool(std::string_view key)>& skip = {});

  // Tensor data is aligned to `alignment` bytes (a power of two); this sets general.alignment.
  void set_alignment(uint32_t alignment);
  uint32_t alignment() const;

  // Adds a tensor whose data will be streamed (see begin()). Throws when the name is a
  // duplicate or the shape does not suit the type (at most 4 dims, rows whole blocks).
  void add_tensor(std::string_view name, GgmlType type, std::vector<int64_t> shape);
  // Adds a tensor with attached data, which must stay valid until the file is written.
  void add_tensor(std::string_view name, GgmlType type, std::vector<int64_t> shape,
                  std::span<const uint8_t> data);
  // Adds a tensor and takes ownership of its data.
  void add_tensor(std::string_view name, GgmlType type, std::vector<int64_t> shape, std::vector<uint8_t> data);
  const std::vector<TensorSpec>& tensors() const { return tensors_; }

  // Writes header, metadata and tensor infos, and returns the stream for the data.
  DataStream begin(const std::string& path) const;
  // Writes a complete file; every tensor must have attached data.
  void write(const std::string& path) const;
  // The complete file as bytes (for tests and small files); every tensor must have data.
  std::vector<uint8_t> to_bytes() const;
  // The header: everything before the tensor data, padding included (none without tensors).
  std::vector<uint8_t> header_bytes() const;

  // Writes the model as `parts` files named <prefix>-00001-of-000NN.gguf (llama.cpp's
  // gguf-split convention): tensors are divided evenly in order, the first part holds all
  // metadata, every part holds split.no (u16), split.count (u16) and split.tensors.count
  // (i32). Every tensor must have attached data. Returns the paths written.
  std::vector<std::string> write_split(const std::string& prefix, int parts) const;

 private:
  friend class DataStream;
  std::vector<uint64_t> data_offsets() const;  // of each tensor, relative to the data section
  void write_header(std::vector<uint8_t>& out) const;

  std::vector<std::pair<std::string, MetaValue>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorSpec> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kiln::gguf
