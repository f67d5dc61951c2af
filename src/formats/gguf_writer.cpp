#include "formats/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "core/error.h"

namespace kiln::gguf {
namespace {

constexpr uint32_t kWriterMagic = 0x46554747;  // "GGUF" as a little-endian u32
constexpr uint32_t kWriterVersion = 3;
constexpr uint32_t kWriterDefaultAlignment = 32;
constexpr size_t kWriterMaxDims = 4;
constexpr int kWriterMaxArrayDepth = 8;  // the reader refuses deeper nesting

uint64_t writer_align_up(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

// Appends little-endian fields to a byte buffer (kiln only targets little-endian hosts).
class GgufEncoder {
 public:
  explicit GgufEncoder(std::vector<uint8_t>& out) : out_(out) {}

  template <typename T>
  void pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void string(std::string_view s) {
    pod<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }

  void value(const MetaValue& v, std::string_view key, int depth) {
    switch (v.type) {
      case ValueType::U8: pod(uint8_t(v.num.u)); break;
      case ValueType::I8: pod(int8_t(v.num.i)); break;
      case ValueType::U16: pod(uint16_t(v.num.u)); break;
      case ValueType::I16: pod(int16_t(v.num.i)); break;
      case ValueType::U32: pod(uint32_t(v.num.u)); break;
      case ValueType::I32: pod(int32_t(v.num.i)); break;
      case ValueType::U64: pod(uint64_t(v.num.u)); break;
      case ValueType::I64: pod(int64_t(v.num.i)); break;
      case ValueType::F32: pod(float(v.num.f)); break;
      case ValueType::F64: pod(double(v.num.f)); break;
      case ValueType::BOOL: pod(uint8_t(v.num.u != 0)); break;
      case ValueType::STRING:
        if (!is_valid_utf8(v.str)) fail("GGUF writer: key '{}': string value is not valid UTF-8", key);
        string(v.str);
        break;
      case ValueType::ARRAY:
        if (depth >= kWriterMaxArrayDepth) fail("GGUF writer: key '{}': arrays nested deeper than {}", key, kWriterMaxArrayDepth);
        pod(uint32_t(v.elem_type));
        pod<uint64_t>(v.items.size());
        for (size_t k = 0; k < v.items.size(); ++k) {
          if (v.items[k].type != v.elem_type)
            fail("GGUF writer: key '{}': array item {} is {}, the array holds {}", key, k,
                 value_type_name(v.items[k].type), value_type_name(v.elem_type));
          value(v.items[k], key, depth + 1);
        }
        break;
      default: fail("GGUF writer: key '{}': unknown value type {}", key, uint32_t(v.type));
    }
  }

 private:
  std::vector<uint8_t>& out_;
};

bool is_gguf_split_key(std::string_view key) { return key.starts_with("split."); }

}  // namespace

// ---- MetaValue ----

MetaValue MetaValue::unsigned_of(ValueType t, uint64_t v) {
  MetaValue m;
  m.type = t;
  m.num.u = v;
  return m;
}

MetaValue MetaValue::signed_of(ValueType t, int64_t v) {
  MetaValue m;
  m.type = t;
  m.num.i = v;
  return m;
}

MetaValue MetaValue::float_of(ValueType t, double v) {
  MetaValue m;
  m.type = t;
  m.num.f = v;
  return m;
}

MetaValue MetaValue::string(std::string_view v) {
  MetaValue m;
  m.type = ValueType::STRING;
  m.str = std::string(v);
  return m;
}

MetaValue MetaValue::array(ValueType elem_type, std::vector<MetaValue> items) {
  for (size_t k = 0; k < items.size(); ++k)
    if (items[k].type != elem_type)
      fail("GGUF array item {} is {}, the array holds {}", k, value_type_name(items[k].type), value_type_name(elem_type));
  MetaValue m;
  m.type = ValueType::ARRAY;
  m.elem_type = elem_type;
  m.items = std::move(items);
  return m;
}

MetaValue MetaValue::strings(const std::vector<std::string>& v) {
  std::vector<MetaValue> items;
  items.reserve(v.size());
  for (const std::string& s : v) items.push_back(string(s));
  return array(ValueType::STRING, std::move(items));
}

MetaValue MetaValue::from(const Value& v) {
  MetaValue m;
  m.type = v.type;
  m.num.u = v.num.u;  // the union is copied whole, whichever member is live
  m.str = std::string(v.str);
  m.elem_type = v.elem_type;
  m.items.reserve(v.items.size());
  for (const Value& item : v.items) m.items.push_back(from(item));
  return m;
}

// ---- Writer: metadata ----

void Writer::set(std::string_view key, MetaValue value) {
  if (key.empty()) fail("GGUF writer: empty metadata key");
  if (!is_valid_utf8(key)) fail("GGUF writer: metadata key is not valid UTF-8");
  if (auto it = kv_index_.find(key); it != kv_index_.end()) {
    kv_[it->second].second = std::move(value);
    return;
  }
  kv_index_.emplace(std::string(key), kv_.size());
  kv_.emplace_back(std::string(key), std::move(value));
}

bool Writer::remove(std::string_view key) {
  auto it = kv_index_.find(key);
  if (it == kv_index_.end()) return false;
  kv_.erase(kv_.begin() + std::ptrdiff_t(it->second));
  kv_index_.clear();
  for (size_t k = 0; k < kv_.size(); ++k) kv_index_.emplace(kv_[k].first, k);
  return true;
}

const MetaValue* Writer::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

void Writer::copy_metadata_from(const File& source, const std::function<bool(std::string_view)>& skip) {
  for (const auto& [key, value] : source.metadata()) {
    if (is_gguf_split_key(key) || (skip && skip(key))) continue;
    set(key, MetaValue::from(value));
  }
}

void Writer::set_alignment(uint32_t alignment) {
  if (alignment == 0 || alignment > (1u << 20) || (alignment & (alignment - 1)) != 0)
    fail("GGUF writer: alignment {} is not a power of two up to 2^20", alignment);
  set_u32("general.alignment", alignment);
}

uint32_t Writer::alignment() const {
  const MetaValue* v = find("general.alignment");
  if (!v) return kWriterDefaultAlignment;
  if (v->type != ValueType::U32) fail("GGUF writer: general.alignment must be a u32, it is {}", value_type_name(v->type));
  const uint64_t a = v->num.u;
  if (a == 0 || a > (1u << 20) || (a & (a - 1)) != 0)
    fail("GGUF writer: general.alignment {} is not a power of two up to 2^20", a);
  return uint32_t(a);
}

// ---- Writer: tensors ----

void Writer::add_tensor(std::string_view name, GgmlType type, std::vector<int64_t> shape) {
  if (name.empty()) fail("GGUF writer: empty tensor name");
  if (!is_valid_utf8(name)) fail("GGUF writer: tensor name is not valid UTF-8");
  if (tensor_index_.count(name)) fail("GGUF writer: duplicate tensor '{}'", name);
  const auto tt = type_traits(uint32_t(type));
  if (!tt) fail("GGUF writer: tensor '{}': unknown type id {}", name, uint32_t(type));
  if (shape.size() > kWriterMaxDims) fail("GGUF writer: tensor '{}' has {} dimensions (at most {})", name, shape.size(), kWriterMaxDims);
  int64_t elements = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) fail("GGUF writer: tensor '{}': dimension {} is negative ({})", name, d, shape[d]);
    if (__builtin_mul_overflow(elements, shape[d], &elements))
      fail("GGUF writer: tensor '{}': element count overflows", name);
  }
  const int64_t row = shape.empty() ? 1 : shape[0];
  if (row % tt->block_size != 0)
    fail("GGUF writer: tensor '{}': row length {} is not a multiple of the {} block size {}", name, row, tt->name,
         tt->block_size);
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(uint64_t(elements / tt->block_size), uint64_t(tt->type_size), &bytes))
    fail("GGUF writer: tensor '{}': byte size overflows", name);

  TensorSpec spec;
  spec.name = std::string(name);
  spec.type = type;
  spec.shape = std::move(shape);
  spec.bytes = size_t(bytes);
  tensor_index_.emplace(spec.name, tensors_.size());
  tensors_.push_back(std::move(spec));
}

void Writer::add_tensor(std::string_view name, GgmlType type, std::vector<int64_t> shape,
                        std::span<const uint8_t> data) {
  add_tensor(name, type, std::move(shape));
  TensorSpec& spec = tensors_.back();
  if (data.size() != spec.bytes) {
    const size_t expected = spec.bytes;
    tensors_.pop_back();
    tensor_index_.erase(std::string(name));
    fail("GGUF writer: tensor '{}': {} data bytes given, its type and shape need {}", name, data.size(), expected);
  }
  spec.data = data;
}

void Writer::add_tensor(std::string_view name, GgmlType type, std::vector<int64_t> shape, std::vector<uint8_t> data) {
  add_tensor(name, type, std::move(shape), std::span<const uint8_t>(data));
  TensorSpec& spec = tensors_.back();
  spec.owned = std::move(data);  // moving a vector keeps its heap buffer, so `data` stays valid
  spec.data = spec.owned;
}

std::vector<uint64_t> Writer::data_offsets() const {
  const uint64_t align = alignment();
  std::vector<uint64_t> offsets;
  offsets.reserve(tensors_.size());
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors_) {
    offsets.push_back(offset);
    offset = writer_align_up(offset + t.bytes, align);
  }
  return offsets;
}

// ---- Writer: output ----

void Writer::write_header(std::vector<uint8_t>& out) const {
  const uint64_t align = alignment();
  const std::vector<uint64_t> offsets = data_offsets();
  GgufEncoder e(out);
  e.pod(kWriterMagic);
  e.pod(kWriterVersion);
  e.pod<uint64_t>(tensors_.size());
  e.pod<uint64_t>(kv_.size());
  for (const auto& [key, value] : kv_) {
    e.string(key);
    e.pod(uint32_t(value.type));
    e.value(value, key, 0);
  }
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const TensorSpec& t = tensors_[k];
    e.string(t.name);
    e.pod<uint32_t>(uint32_t(t.shape.size()));
    for (int64_t d : t.shape) e.pod<uint64_t>(uint64_t(d));
    e.pod(uint32_t(t.type));
    e.pod<uint64_t>(offsets[k]);
  }
  // The data section starts aligned. A file without tensors has none, and llama.cpp's
  // tools (e.g. for vocabulary-only files) then leave the header unpadded; so do we.
  if (!tensors_.empty()) out.resize(writer_align_up(out.size(), align), 0);
}

std::vector<uint8_t> Writer::header_bytes() const {
  std::vector<uint8_t> out;
  write_header(out);
  return out;
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> out;
  write_header(out);
  const uint64_t data_start = out.size();
  const std::vector<uint64_t> offsets = data_offsets();
  const uint64_t align = alignment();
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const TensorSpec& t = tensors_[k];
    if (t.data.size() != t.bytes) fail("GGUF writer: tensor '{}' has no data attached", t.name);
    out.resize(data_start + offsets[k], 0);
    out.insert(out.end(), t.data.begin(), t.data.end());
    out.resize(writer_align_up(out.size(), align), 0);  // pad the last tensor too, as llama.cpp does
  }
  return out;
}

DataStream Writer::begin(const std::string& path) const { return DataStream(*this, path); }

void Writer::write(const std::string& path) const {
  for (const TensorSpec& t : tensors_)
    if (t.data.size() != t.bytes) fail("{}: tensor '{}' has no data attached", path, t.name);
  DataStream out = begin(path);
  for (const TensorSpec& t : tensors_) out.write(t.data);
  out.finish();
}

std::vector<std::string> Writer::write_split(const std::string& prefix, int parts) const {
  if (parts < 1 || parts > 9999) fail("GGUF writer: cannot split into {} parts", parts);
  if (size_t(parts) > tensors_.size() && parts > 1)
    fail("GGUF writer: cannot split {} tensors into {} parts", tensors_.size(), parts);
  if (tensors_.size() > size_t(std::numeric_limits<int32_t>::max())) fail("GGUF writer: too many tensors to split");
  std::vector<std::string> paths;
  const size_t per_part = tensors_.size() / size_t(parts), extra = tensors_.size() % size_t(parts);
  size_t next = 0;
  for (int p = 0; p < parts; ++p) {
    Writer part;
    if (p == 0) {
      for (const auto& [key, value] : kv_)
        if (!is_gguf_split_key(key)) part.set(key, value);
    } else if (const MetaValue* a = find("general.alignment")) {
      part.set("general.alignment", *a);  // every part's data is laid out with it
    }
    part.set_u16("split.no", uint16_t(p));
    part.set_u16("split.count", uint16_t(parts));
    part.set_i32("split.tensors.count", int32_t(tensors_.size()));
    const size_t count = per_part + (size_t(p) < extra ? 1 : 0);
    for (size_t k = 0; k < count; ++k, ++next) {
      const TensorSpec& t = tensors_[next];
      if (t.data.size() != t.bytes) fail("GGUF writer: tensor '{}' has no data attached", t.name);
      part.add_tensor(t.name, t.type, t.shape, t.data);
    }
    paths.push_back(fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, p + 1, parts));
    part.write(paths.back());
  }
  return paths;
}

// ---- DataStream ----

DataStream::DataStream(const Writer& writer, std::string path)
    : writer_(&writer), path_(std::move(path)), temp_path_(path_ + ".tmp") {
  std::vector<uint8_t> header;
  writer.write_header(header);  // validates everything before a file is created
  offsets_ = writer.data_offsets();
  file_ = std::fopen(temp_path_.c_str(), "wb");
  if (!file_) fail("{}: cannot create: {}", temp_path_, std::strerror(errno));
  put(header.data(), header.size());
  data_offset_ = 0;  // put() counted the header; data offsets are relative to its end
}

DataStream::DataStream(DataStream&& other) noexcept
    : writer_(other.writer_), offsets_(std::move(other.offsets_)), path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)), file_(std::exchange(other.file_, nullptr)),
      tensor_(other.tensor_), written_(other.written_), data_offset_(other.data_offset_) {}

DataStream::~DataStream() { close_and_remove(); }

void DataStream::close_and_remove() {
  if (!file_) return;
  std::fclose(file_);
  file_ = nullptr;
  std::remove(temp_path_.c_str());
}

void DataStream::put(const void* p, size_t n) {
  if (n == 0) return;
  if (std::fwrite(p, 1, n, file_) != n) {
    const int err = errno;
    close_and_remove();
    fail("{}: write failed: {}", temp_path_, std::strerror(err));
  }
  data_offset_ += n;
}

void DataStream::pad_to(uint64_t offset) {
  static const uint8_t zeros[64] = {};
  while (data_offset_ < offset) put(zeros, size_t(std::min<uint64_t>(sizeof zeros, offset - data_offset_)));
}

std::string_view DataStream::current_tensor() const {
  const auto& tensors = writer_->tensors();
  size_t k = tensor_;
  while (k < tensors.size() && written_ == 0 && tensors[k].bytes == 0) ++k;  // empty tensors need no data
  return k < tensors.size() ? std::string_view(tensors[k].name) : std::string_view();
}

void DataStream::write(std::span<const uint8_t> bytes) {
  if (!file_) fail("{}: data written to a finished or failed GGUF stream", path_);
  const auto& tensors = writer_->tensors();
  const uint64_t align = writer_->alignment();
  while (true) {
    // Advance past complete (and empty) tensors, padding each to the alignment.
    while (tensor_ < tensors.size() && written_ == tensors[tensor_].bytes) {
      ++tensor_;
      written_ = 0;
      pad_to(tensor_ < tensors.size() ? offsets_[tensor_] : writer_align_up(data_offset_, align));
    }
    if (bytes.empty()) return;
    if (tensor_ == tensors.size()) {
      close_and_remove();
      fail("{}: {} bytes of data beyond the last tensor", path_, bytes.size());
    }
    const size_t take = size_t(std::min<uint64_t>(bytes.size(), tensors[tensor_].bytes - written_));
    put(bytes.data(), take);
    written_ += take;
    bytes = bytes.subspan(take);
  }
}

void DataStream::write_tensor(std::string_view name, std::span<const uint8_t> bytes) {
  const std::string_view expected = current_tensor();
  if (name != expected)
    fail("{}: data for tensor '{}' given where tensor '{}' comes next", path_, name,
         expected.empty() ? "(none)" : expected);
  const size_t size = writer_->tensors()[writer_->tensor_index_.find(name)->second].bytes;
  if (written_ != 0 || bytes.size() != size)
    fail("{}: tensor '{}': {} bytes given, it holds {}", path_, name, bytes.size(), size);
  write(bytes);
}

void DataStream::finish() {
  if (!file_) fail("{}: GGUF stream already finished or failed", path_);
  write({});  // pads the last tensor and steps over trailing empty tensors
  const auto& tensors = writer_->tensors();
  if (tensor_ < tensors.size()) {
    const std::string message = fmt::format("{}: tensor '{}' got {} of its {} bytes before finish()", path_,
                                            tensors[tensor_].name, written_, tensors[tensor_].bytes);
    close_and_remove();
    throw Error(message);
  }
  const bool flushed = std::fflush(file_) == 0 && !std::ferror(file_);
  const int err = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    std::remove(temp_path_.c_str());
    fail("{}: write failed: {}", temp_path_, std::strerror(err));
  }
  std::error_code ec;
  std::filesystem::rename(temp_path_, path_, ec);
  if (ec) {
    std::remove(temp_path_.c_str());
    fail("{}: cannot rename {} into place: {}", path_, temp_path_, ec.message());
  }
}

}  // namespace kiln::gguf
