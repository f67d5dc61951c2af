#include "formats/gguf.h"

#include <algorithm>
#include <cinttypes>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "formats/byte_reader.h"

namespace kiln::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint32_t kMaxDims = 4;         // ggml tensors have at most 4 dimensions
constexpr int kMaxArrayDepth = 8;        // nested arrays deeper than this are refused

// Smallest encoded size of one value of `t`; bounds array counts before allocating.
size_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 12;
  }
  return 1;
}

bool known_value_type(uint32_t t) { return t <= uint32_t(ValueType::F64); }

// A string field. `what` names it in errors ("tensor name"), or, when `key` is given, the
// field is the value of metadata key `key` (the message is then built only on failure).
std::string_view read_string(ByteReader& r, std::string_view what, std::string_view key = {}) {
  const auto name = [&] { return key.empty() ? std::string(what) : fmt::format("key '{}'", key); };
  if (r.remaining() < 8) r.error("file truncated: {} needs 8 bytes, only {} left", name(), r.remaining());
  const uint64_t len = r.read<uint64_t>(what);
  if (len > r.remaining())
    r.error("{}: string length {} exceeds the {} bytes left in the file", name(), len, r.remaining());
  const std::string_view s = r.read_bytes(len, what);
  if (!is_valid_utf8(s)) {
    r.seek(r.offset() - s.size());
    r.error("{} is not valid UTF-8", name());
  }
  return s;
}

Value read_value(ByteReader& r, ValueType type, std::string_view key, int depth) {
  Value v;
  v.type = type;
  switch (type) {
    case ValueType::U8: v.num.u = r.read<uint8_t>(key); break;
    case ValueType::I8: v.num.i = r.read<int8_t>(key); break;
    case ValueType::U16: v.num.u = r.read<uint16_t>(key); break;
    case ValueType::I16: v.num.i = r.read<int16_t>(key); break;
    case ValueType::U32: v.num.u = r.read<uint32_t>(key); break;
    case ValueType::I32: v.num.i = r.read<int32_t>(key); break;
    case ValueType::U64: v.num.u = r.read<uint64_t>(key); break;
    case ValueType::I64: v.num.i = r.read<int64_t>(key); break;
    case ValueType::F32: v.num.f = r.read<float>(key); break;
    case ValueType::F64: v.num.f = r.read<double>(key); break;
    case ValueType::BOOL: {
      const uint8_t b = r.read<uint8_t>(key);
      if (b > 1) r.error("key '{}': boolean value {} is neither 0 nor 1", key, b);
      v.num.u = b;
      break;
    }
    case ValueType::STRING: v.str = read_string(r, "string", key); break;
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayDepth) r.error("key '{}': arrays nested deeper than {}", key, kMaxArrayDepth);
      const uint32_t elem = r.read<uint32_t>(key);
      if (!known_value_type(elem)) r.error("key '{}': unknown array element type {}", key, elem);
      v.elem_type = ValueType(elem);
      const uint64_t count = r.read<uint64_t>(key);
      if (count > r.remaining() / min_encoded_size(v.elem_type))
        r.error("key '{}': array of {} {} values cannot fit in the {} bytes left", key, count,
                value_type_name(v.elem_type), r.remaining());
      v.items.reserve(size_t(count));
      for (uint64_t k = 0; k < count; ++k) v.items.push_back(read_value(r, v.elem_type, key, depth + 1));
      break;
    }
  }
  return v;
}

std::string describe(std::string_view key) { return key.empty() ? std::string("value") : fmt::format("key '{}'", key); }

// The names of all parts of a split model, given the name of one part
// (prefix-NNNNN-of-MMMMM.gguf) and the part count its metadata states.
std::vector<std::string> split_part_paths(const std::string& path, uint64_t count) {
  // Parsed by hand: the name is untrusted and may be long, so no backtracking regex.
  constexpr std::string_view kSuffix = ".gguf";
  constexpr size_t kTail = 1 + 5 + 4 + 5 + kSuffix.size();  // "-NNNNN-of-MMMMM.gguf"
  const auto is_digits = [](std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const std::string_view tail = path.size() >= kTail ? std::string_view(path).substr(path.size() - kTail) : "";
  if (tail.size() != kTail || tail[0] != '-' || tail.substr(6, 4) != "-of-" || !tail.ends_with(kSuffix) ||
      !is_digits(tail.substr(1, 5)) || !is_digits(tail.substr(10, 5)))
    fail("{}: metadata says the model is split into {} files, but the file name does not end in "
         "-NNNNN-of-NNNNN.gguf, so the other parts cannot be found", path, count);
  const uint64_t named_count = std::stoull(std::string(tail.substr(10, 5)));
  if (named_count != count)
    fail("{}: the file name says {} parts but its split.count says {}", path, named_count, count);
  const std::string prefix = path.substr(0, path.size() - kTail);
  std::vector<std::string> out;
  for (uint64_t i = 1; i <= count; ++i) out.push_back(fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, i, count));
  return out;
}

// An integer metadata value, or an error naming the file and key.
int64_t int_value(const ByteReader& r, const Value& v, std::string_view key) {
  if (!v.is_integer()) r.error("key '{}': expected an integer, found {}", key, value_type_name(v.type));
  if (v.type == ValueType::U64 && v.num.u > uint64_t(std::numeric_limits<int64_t>::max()))
    r.error("key '{}': value {} is too large", key, v.num.u);
  return v.as_int(key);
}

}  // namespace

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "?";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64: return true;
    default: return false;
  }
}

int64_t Value::as_int(std::string_view key) const {
  switch (type) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
      if (num.u > uint64_t(std::numeric_limits<int64_t>::max())) fail("{}: value {} is too large", describe(key), num.u);
      return int64_t(num.u);
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64: return num.i;
    case ValueType::BOOL: return int64_t(num.u);
    default: fail("{}: expected an integer, found {}", describe(key), value_type_name(type));
  }
}

double Value::as_float(std::string_view key) const {
  if (is_float()) return num.f;
  if (is_integer()) return double(as_int(key));
  fail("{}: expected a number, found {}", describe(key), value_type_name(type));
}

bool Value::as_bool(std::string_view key) const {
  if (type == ValueType::BOOL) return num.u != 0;
  if (is_integer()) return as_int(key) != 0;
  fail("{}: expected a boolean, found {}", describe(key), value_type_name(type));
}

std::string_view Value::as_string(std::string_view key) const {
  if (type != ValueType::STRING) fail("{}: expected a string, found {}", describe(key), value_type_name(type));
  return str;
}

const std::vector<Value>& Value::as_array(std::string_view key) const {
  if (type != ValueType::ARRAY) fail("{}: expected an array, found {}", describe(key), value_type_name(type));
  return items;
}

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::unique_ptr<File> File::open(const std::string& path) { return open_split(path, true); }

std::unique_ptr<File> File::open_memory(std::span<const uint8_t> bytes, const std::string& name) {
  std::unique_ptr<File> file(new File());
  file->parts_.push_back(bytes);
  file->paths_.push_back(name);
  const PartSplit split = file->parse_part(0, true);
  if (split.count > 1) fail("{}: a part of a split model ({} parts) cannot be opened from memory", name, split.count);
  return file;
}

void File::add_part(const std::string& path) {
  maps_.emplace_back(path);
  parts_.push_back(maps_.back().bytes());
  paths_.push_back(path);
}

// `allow_restart`: when `path` is not the first part, reopen from the first part (once;
// a first part that names yet another first part is an error, not an endless loop).
std::unique_ptr<File> File::open_split(const std::string& path, bool allow_restart) {
  std::unique_ptr<File> file(new File());
  file->add_part(path);
  const PartSplit first = file->parse_part(0, true);
  if (first.count <= 1) return file;

  if (first.count > 9999) fail("{}: split.count {} is absurd", path, first.count);
  const std::vector<std::string> parts = split_part_paths(path, first.count);
  if (std::filesystem::path(parts[0]).lexically_normal() != std::filesystem::path(path).lexically_normal()) {
    if (!allow_restart) fail("{}: split.count says {} parts, but this first part's name disagrees", path, first.count);
    return open_split(parts[0], false);
  }
  if (first.no != 0) fail("{}: split.no is {} in the first part of a split model (expected 0)", path, first.no);
  for (size_t i = 1; i < parts.size(); ++i) {
    file->add_part(parts[i]);
    const PartSplit split = file->parse_part(i, false);
    if (split.no != i)
      fail("{}: split.no is {} but this is part {} of the model (split.no counts from 0)", parts[i], split.no, i + 1);
    if (split.count != first.count)
      fail("{}: split.count is {} but the first part says {}", parts[i], split.count, first.count);
  }
  if (const Value* total = file->find("split.tensors.count")) {
    const bool fits = total->is_integer() && !(total->type == ValueType::U64 && total->num.u > uint64_t(INT64_MAX));
    if (!fits || total->as_int() != int64_t(file->tensors_.size()))
      fail("{}: split.tensors.count says {} tensors, the {} parts hold {}", path,
           fits ? fmt::to_string(total->as_int()) : std::string("(not an integer)"), first.count,
           file->tensors_.size());
  }
  return file;
}

File::PartSplit File::parse_part(size_t part, bool first) {
  const std::span<const uint8_t> bytes = parts_[part];
  ByteReader r(bytes, paths_[part]);

  const uint32_t magic = r.read<uint32_t>("magic");
  if (magic != kMagic) {
    r.seek(0);
    r.error("not a GGUF file (bad magic: expected 'GGUF')");
  }
  const uint32_t version = r.read<uint32_t>("version");
  if (version == 0x02000000u || version == 0x03000000u) r.error("big-endian GGUF files are not supported");
  if (version == 1) r.error("GGUF version 1 is not supported (convert the file to version 3)");
  if (version != 2 && version != 3) r.error("unknown GGUF version {}", version);
  if (first) version_ = version;

  const uint64_t n_tensors = r.read<uint64_t>("tensor count");
  const uint64_t n_kv = r.read<uint64_t>("metadata count");
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
  // least 8 + 4 + 4 + 8. Counts beyond what the file can hold are rejected before any allocation.
  if (n_kv > r.remaining() / 13) r.error("metadata count {} cannot fit in a file of {} bytes", n_kv, r.size());
  if (n_tensors > r.remaining() / 24) r.error("tensor count {} cannot fit in a file of {} bytes", n_tensors, r.size());

  uint32_t alignment = 32;
  PartSplit split;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const size_t key_offset = r.offset();
    const std::string key(read_string(r, "metadata key"));
    if (key.empty()) {
      r.seek(key_offset);
      r.error("empty metadata key");
    }
    const uint32_t type = r.read<uint32_t>(key);
    if (!known_value_type(type)) r.error("key '{}': unknown value type {}", key, type);
    Value v = read_value(r, ValueType(type), key, 0);
    if (key == "general.alignment") {
      const int64_t a = int_value(r, v, key);
      if (a <= 0 || a > (1 << 20) || (a & (a - 1)) != 0) r.error("general.alignment {} is not a power of two", a);
      alignment = uint32_t(a);
    }
    if (key == "split.no" || key == "split.count") {
      const int64_t n = int_value(r, v, key);
      if (n < 0) r.error("key '{}': negative value {}", key, n);
      (key == "split.no" ? split.no : split.count) = uint64_t(n);
    }
    if (first) {
      if (kv_index_.count(key)) {
        r.seek(key_offset);
        r.error("duplicate metadata key '{}'", key);
      }
      kv_index_.emplace(key, kv_.size());
      kv_.emplace_back(key, std::move(v));
    }
  }
  if (first) alignment_ = alignment;

  struct Pending { size_t index; uint64_t rel_offset; size_t info_offset; };
  std::vector<Pending> pending;
  pending.reserve(size_t(n_tensors));
  for (uint64_t t = 0; t < n_tensors; ++t) {
    const size_t info_offset = r.offset();
    TensorInfo info;
    info.name = std::string(read_string(r, "tensor name"));
    if (tensor_index_.count(info.name)) {
      r.seek(info_offset);
      r.error("duplicate tensor name '{}'", info.name);
    }
    const uint32_t n_dims = r.read<uint32_t>(info.name);
    if (n_dims > kMaxDims) r.error("tensor '{}' has {} dimensions (at most {})", info.name, n_dims, kMaxDims);
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = r.read<uint64_t>(info.name);
      if (dim > uint64_t(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(elements, int64_t(dim), &elements))
        r.error("tensor '{}': dimension {} = {} makes the element count overflow", info.name, d, dim);
      info.shape.push_back(int64_t(dim));
    }
    const uint32_t type_id = r.read<uint32_t>(info.name);
    const auto tt = type_traits(type_id);
    if (!tt) r.error("tensor '{}' has unknown type id {}", info.name, type_id);
    info.type = tt->type;
    const int64_t row = info.shape.empty() ? 1 : info.shape[0];
    if (row % tt->block_size != 0)
      r.error("tensor '{}': row length {} is not a multiple of the {} block size {}", info.name, row, tt->name,
              tt->block_size);
    // elements / block_size * type_size, without overflow.
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(uint64_t(elements / tt->block_size), uint64_t(tt->type_size), &bytes))
      r.error("tensor '{}': byte size overflows", info.name);
    info.bytes = size_t(bytes);
    const uint64_t rel = r.read<uint64_t>(info.name);
    if (rel % alignment != 0)
      r.error("tensor '{}': data offset {} is not a multiple of the alignment {}", info.name, rel, alignment);
    info.file_index = int(part);
    tensor_index_.emplace(info.name, tensors_.size());
    pending.push_back({tensors_.size(), rel, info_offset});
    tensors_.push_back(std::move(info));
  }

  const uint64_t data_start = (uint64_t(r.offset()) + alignment - 1) / alignment * alignment;
  if (data_start > r.size() && n_tensors > 0)
    r.error("tensor data section would start at {}, past the end of the file ({} bytes)", data_start, r.size());
  const uint64_t data_size = r.size() > data_start ? r.size() - data_start : 0;

  // Each tensor must lie inside the data section, and no two may overlap.
  std::sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) { return a.rel_offset < b.rel_offset; });
  uint64_t previous_end = 0;
  const TensorInfo* previous = nullptr;
  for (const Pending& p : pending) {
    TensorInfo& info = tensors_[p.index];
    if (p.rel_offset > data_size || info.bytes > data_size - p.rel_offset) {
      r.seek(p.info_offset);
      r.error("tensor '{}' ({} bytes at data offset {}) extends past the end of the file (data section holds {} bytes)",
              info.name, info.bytes, p.rel_offset, data_size);
    }
    if (previous && p.rel_offset < previous_end) {
      r.seek(p.info_offset);
      r.error("tensor '{}' overlaps tensor '{}'", info.name, previous->name);
    }
    info.file_offset = data_start + p.rel_offset;
    info.data = bytes.data() + info.file_offset;
    previous_end = p.rel_offset + info.bytes;
    previous = &info;
  }
  return split;
}

size_t File::total_file_bytes() const {
  size_t total = 0;
  for (const auto& p : parts_) total += p.size();
  return total;
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const Value& File::get(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail("{}: missing metadata key '{}'", paths_.front(), key);
  return *v;
}

int64_t File::get_int(std::string_view key, int64_t fallback) const {
  const Value* v = find(key);
  return v ? v->as_int(key) : fallback;
}

double File::get_float(std::string_view key, double fallback) const {
  const Value* v = find(key);
  return v ? v->as_float(key) : fallback;
}

bool File::get_bool(std::string_view key, bool fallback) const {
  const Value* v = find(key);
  return v ? v->as_bool(key) : fallback;
}

std::string_view File::get_string(std::string_view key, std::string_view fallback) const {
  const Value* v = find(key);
  return v ? v->as_string(key) : fallback;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) { ++p; continue; }
    int len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; }
    else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; }
    else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; }
    else return false;
    if (end - p < len) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[k] & 0x3f);
    }
    static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    p += len;
  }
  return true;
}

}  // namespace kiln::gguf
