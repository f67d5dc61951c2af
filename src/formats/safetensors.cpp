#include "formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "core/error.h"

namespace kiln::safetensors {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, before parsing.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// JSON nested deeper than this is refused (a header needs depth 3, config files a few more).
constexpr int kMaxJsonDepth = 64;

struct DtypeInfo {
  Dtype dtype;
  std::string_view name;
  size_t size;
  std::optional<GgmlType> ggml;
};

constexpr DtypeInfo kDtypes[] = {
    {Dtype::F64, "F64", 8, GgmlType::F64},   {Dtype::F32, "F32", 4, GgmlType::F32},
    {Dtype::F16, "F16", 2, GgmlType::F16},   {Dtype::BF16, "BF16", 2, GgmlType::BF16},
    {Dtype::I64, "I64", 8, GgmlType::I64},   {Dtype::I32, "I32", 4, GgmlType::I32},
    {Dtype::I16, "I16", 2, GgmlType::I16},   {Dtype::I8, "I8", 1, GgmlType::I8},
    {Dtype::U64, "U64", 8, std::nullopt},    {Dtype::U32, "U32", 4, std::nullopt},
    {Dtype::U16, "U16", 2, std::nullopt},    {Dtype::U8, "U8", 1, std::nullopt},
    {Dtype::BOOL, "BOOL", 1, std::nullopt},  {Dtype::F8_E4M3, "F8_E4M3", 1, std::nullopt},
    {Dtype::F8_E5M2, "F8_E5M2", 1, std::nullopt},
};

const DtypeInfo& info_of(Dtype d) {
  for (const DtypeInfo& i : kDtypes)
    if (i.dtype == d) return i;
  fail("safetensors: unknown dtype enum {}", int(d));
}

// Parses JSON text, refusing excessive nesting and (when asked) duplicate object keys,
// which the JSON library would otherwise resolve silently by keeping the last one.
// `base_offset` is where the text starts in its file, so errors give file offsets.
json parse_json(std::string_view text, const std::string& source, uint64_t base_offset, bool reject_duplicates,
                std::string_view top_level_key_what = "key") {
  std::vector<std::set<std::string>> open_objects;
  auto check = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    if (depth > kMaxJsonDepth) fail("{}: JSON nested deeper than {} levels", source, kMaxJsonDepth);
    if (!reject_duplicates) return true;
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second)
          fail("{}: duplicate {} '{}'", source, depth == 1 ? top_level_key_what : std::string_view("key"),
               parsed.get<std::string>());
        break;
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::parse_error& e) {
    fail("{}: malformed JSON near byte offset {}: {}", source, base_offset + (e.byte > 0 ? e.byte - 1 : 0), e.what());
  } catch (const json::exception& e) {
    // e.g. out_of_range for a number beyond double's range, which is not a parse_error.
    fail("{}: malformed JSON (in the {} bytes from offset {}): {}", source, text.size(), base_offset, e.what());
  }
}

// A JSON number that is a non-negative integer, or an error naming `what`.
uint64_t unsigned_of(const json& v, const std::string& source, std::string_view what) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    fail("{}: {} must be a non-negative integer, found {}", source, what, v.dump());
  return v.get<uint64_t>();
}

bool is_plain_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\\') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

}  // namespace

std::string_view dtype_name(Dtype d) { return info_of(d).name; }
size_t dtype_size(Dtype d) { return info_of(d).size; }
std::optional<GgmlType> to_ggml_type(Dtype d) { return info_of(d).ggml; }

std::optional<Dtype> dtype_from_name(std::string_view name) {
  for (const DtypeInfo& i : kDtypes)
    if (i.name == name) return i.dtype;
  return std::nullopt;
}

int64_t Tensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- File ----

std::unique_ptr<File> File::open(const std::string& path) {
  std::unique_ptr<File> file(new File());
  file->map_.emplace(path);
  file->bytes_ = file->map_->bytes();
  file->path_ = path;
  file->parse();
  return file;
}

std::unique_ptr<File> File::open_memory(std::span<const uint8_t> bytes, const std::string& name) {
  std::unique_ptr<File> file(new File());
  file->bytes_ = bytes;
  file->path_ = name;
  file->parse();
  return file;
}

const Tensor* File::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void File::parse() {
  const uint64_t size = bytes_.size();
  if (size < 8) fail("{}: file truncated: {} bytes, but the header length alone takes 8", path_, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes_.data(), 8);
  if (header_len > size - 8)
    fail("{}: header length {} (at offset 0) runs past the end of the file ({} bytes)", path_, header_len, size);
  if (header_len > kMaxHeaderBytes)
    fail("{}: header length {} (at offset 0) exceeds the {} byte limit", path_, header_len, kMaxHeaderBytes);
  const std::string_view text(reinterpret_cast<const char*>(bytes_.data()) + 8, size_t(header_len));
  const json header = parse_json(text, path_, 8, true, "tensor name");
  if (!header.is_object()) fail("{}: the header (at offset 8) is not a JSON object", path_);

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  struct Span {
    uint64_t begin, end;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("{}: __metadata__ is not a JSON object", path_);
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail("{}: __metadata__ '{}' is not a string", path_, key);
        metadata_.emplace(key, value.get<std::string>());
      }
      continue;
    }
    const std::string what = fmt::format("tensor '{}'", name);
    if (!entry.is_object()) fail("{}: {}: entry is not a JSON object", path_, what);
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || shape_it == entry.end() || offsets_it == entry.end())
      fail("{}: {}: needs dtype, shape and data_offsets", path_, what);
    if (!dtype_it->is_string()) fail("{}: {}: dtype is not a string", path_, what);
    const auto dtype = dtype_from_name(dtype_it->get<std::string>());
    if (!dtype) fail("{}: {}: unknown dtype '{}'", path_, what, dtype_it->get<std::string>());

    Tensor t;
    t.name = name;
    t.dtype = *dtype;
    if (!shape_it->is_array()) fail("{}: {}: shape is not an array", path_, what);
    uint64_t elements = 1;
    for (const json& d : *shape_it) {
      const uint64_t dim = unsigned_of(d, path_, what + " shape dimension");
      if (dim > uint64_t(std::numeric_limits<int64_t>::max()) || __builtin_mul_overflow(elements, dim, &elements) ||
          elements > uint64_t(std::numeric_limits<int64_t>::max()))
        fail("{}: {}: shape {} overflows the element count", path_, what, shape_it->dump());
      t.shape.push_back(int64_t(dim));
    }
    if (!offsets_it->is_array() || offsets_it->size() != 2)
      fail("{}: {}: data_offsets must be an array [begin, end]", path_, what);
    const uint64_t begin = unsigned_of((*offsets_it)[0], path_, what + " data_offsets begin");
    const uint64_t end = unsigned_of((*offsets_it)[1], path_, what + " data_offsets end");
    if (end < begin) fail("{}: {}: data_offsets [{}, {}] end before they begin", path_, what, begin, end);
    if (end > data_size)
      fail("{}: {}: data_offsets [{}, {}] run past the end of the data ({} bytes from offset {})", path_, what, begin,
           end, data_size, data_start);
    uint64_t expected = 0;
    if (__builtin_mul_overflow(elements, uint64_t(dtype_size(t.dtype)), &expected) || expected != end - begin)
      fail("{}: {}: shape {} of {} needs {} bytes, data_offsets [{}, {}] span {}", path_, what, shape_it->dump(),
           dtype_name(t.dtype), expected, begin, end, end - begin);
    t.bytes = size_t(end - begin);
    t.file_offset = data_start + begin;
    t.data = bytes_.data() + t.file_offset;
    tensors_.push_back(std::move(t));
    spans.push_back({begin, end});
  }

  // The tensors must tile the data section exactly, as the reference implementation requires.
  std::vector<size_t> order(tensors_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return spans[a].begin != spans[b].begin ? spans[a].begin < spans[b].begin : spans[a].end < spans[b].end;
  });
  uint64_t cursor = 0;
  const Tensor* previous = nullptr;
  for (size_t k : order) {
    const Tensor& t = tensors_[k];
    if (spans[k].begin < cursor)
      fail("{}: tensor '{}' (data offsets [{}, {}]) overlaps tensor '{}'", path_, t.name, spans[k].begin, spans[k].end,
           previous->name);
    if (spans[k].begin > cursor)
      fail("{}: {} bytes at data offset {} (file offset {}) before tensor '{}' belong to no tensor", path_,
           spans[k].begin - cursor, cursor, data_start + cursor, t.name);
    cursor = spans[k].end;
    previous = &t;
  }
  if (cursor != data_size)
    fail("{}: {} bytes at the end of the file (from offset {}) belong to no tensor", path_, data_size - cursor,
         data_start + cursor);

  std::vector<Tensor> sorted;
  sorted.reserve(tensors_.size());
  for (size_t k : order) sorted.push_back(std::move(tensors_[k]));
  tensors_ = std::move(sorted);
  for (size_t k = 0; k < tensors_.size(); ++k) index_.emplace(tensors_[k].name, k);
}

// ---- index and JSON files ----

std::map<std::string, std::string> parse_index(std::string_view json_text, const std::string& source) {
  const json index = parse_json(json_text, source, 0, true);
  if (!index.is_object()) fail("{}: not a JSON object", source);
  const auto it = index.find("weight_map");
  if (it == index.end() || !it->is_object()) fail("{}: no \"weight_map\" object", source);
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : it->items()) {
    if (!file.is_string()) fail("{}: weight_map entry for tensor '{}' is not a string", source, name);
    const std::string shard = file.get<std::string>();
    if (!is_plain_file_name(shard))
      fail("{}: weight_map entry for tensor '{}' names '{}', which is not a plain file name", source, name, shard);
    out.emplace(name, shard);
  }
  return out;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("{}: read failed", path);
  // Configuration files are accepted with duplicate keys (the last wins), as Python reads them.
  return parse_json(text.str(), path, 0, false);
}

// ---- Checkpoint ----

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& path) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->source_ = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / "config.json")) ckpt->config_ = read_json_file((dir / "config.json").string());
    if (fs::exists(dir / "generation_config.json"))
      ckpt->generation_config_ = read_json_file((dir / "generation_config.json").string());
    if (fs::exists(dir / "model.safetensors.index.json")) {
      ckpt->open_index((dir / "model.safetensors.index.json").string());
    } else if (fs::exists(dir / "model.safetensors")) {
      ckpt->add_file((dir / "model.safetensors").string());
    } else {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(dir))
        if (entry.is_regular_file() && entry.path().extension() == ".safetensors") found.push_back(entry.path().string());
      if (found.empty()) fail("{}: no .safetensors files in this directory", path);
      std::sort(found.begin(), found.end());
      for (const std::string& f : found) ckpt->add_file(f);
    }
  } else if (path.ends_with(".json")) {
    ckpt->open_index(path);
  } else {
    ckpt->add_file(path);
  }
  return ckpt;
}

void Checkpoint::add_file(const std::string& path) {
  files_.push_back(File::open(path));
  for (Tensor& t : files_.back()->tensors_) {
    if (auto it = index_.find(t.name); it != index_.end())
      fail("{}: tensor '{}' is also in {}", path, t.name, files_[size_t(it->second->file_index)]->path());
    t.file_index = int(files_.size() - 1);
    index_.emplace(t.name, &t);
    tensors_.push_back(&t);
  }
}

void Checkpoint::open_index(const std::string& index_path) {
  std::string text;
  {
    const MappedFile map(index_path);
    text.assign(reinterpret_cast<const char*>(map.data()), map.size());
  }
  const std::map<std::string, std::string> weight_map = parse_index(text, index_path);
  if (weight_map.empty()) fail("{}: the weight_map lists no tensors", index_path);
  std::set<std::string> shards;
  for (const auto& [name, shard] : weight_map) shards.insert(shard);
  const fs::path dir = fs::path(index_path).parent_path();
  for (const std::string& shard : shards) add_file((dir / shard).string());

  // The index and the shards must agree tensor by tensor.
  for (const auto& [name, shard] : weight_map) {
    const Tensor* t = find(name);
    if (!t) fail("{}: tensor '{}' is listed in {} but not found in it", index_path, name, shard);
    const std::string& holder = files_[size_t(t->file_index)]->path();
    if (fs::path(holder).filename() != shard)
      fail("{}: tensor '{}' is listed in {} but found in {}", index_path, name, shard, holder);
  }
  for (const Tensor* t : tensors_)
    if (!weight_map.count(t->name))
      fail("{}: tensor '{}' in {} is not listed in the weight_map", index_path, t->name,
           files_[size_t(t->file_index)]->path());
}

const Tensor* Checkpoint::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const Tensor& Checkpoint::get(std::string_view name) const {
  const Tensor* t = find(name);
  if (!t) fail("{}: no tensor '{}'", source_, name);
  return *t;
}

}  // namespace kiln::safetensors
