// `kiln info FILE [--json]`: what a GGUF file holds — architecture, hyper-parameters,
// tokenizer, other metadata, every tensor, totals. Works on any GGUF, including
// vocabulary-only files and architectures kiln cannot run.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/format.h"
#include "formats/gguf.h"

namespace kiln::cli {
namespace {

using gguf::Value;
using gguf::ValueType;
using nlohmann::ordered_json;

ordered_json value_to_json(const Value& v) {
  switch (v.type) {
    case ValueType::STRING: return std::string(v.str);
    case ValueType::BOOL: return v.num.u != 0;
    case ValueType::F32: case ValueType::F64: return v.num.f;
    case ValueType::ARRAY: {
      ordered_json a = ordered_json::array();
      for (const Value& item : v.items) a.push_back(value_to_json(item));
      return a;
    }
    default:
      if (v.type == ValueType::U64 || v.type == ValueType::U32 || v.type == ValueType::U16 || v.type == ValueType::U8)
        return v.num.u;
      return v.num.i;
  }
}

// One-line rendering for the text report; long arrays are summarised.
std::string value_to_text(const Value& v) {
  if (v.type == ValueType::ARRAY) {
    std::string s = fmt::format("[{} x {}]", v.items.size(), gguf::value_type_name(v.elem_type));
    if (v.items.size() <= 8) {
      s += " {";
      for (size_t i = 0; i < v.items.size(); ++i) s += (i ? ", " : "") + value_to_text(v.items[i]);
      s += "}";
    }
    return s;
  }
  if (v.type == ValueType::STRING) {
    std::string s(v.str);
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    for (char& c : s)
      if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    return '"' + s + '"';
  }
  if (v.type == ValueType::F32) return fmt::format("{}", float(v.num.f));  // shortest round-trip form
  return value_to_json(v).dump();
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? " x " : "") + std::to_string(shape[i]);
  return s.empty() ? "scalar" : s;
}

enum class Section { Hyper, Tokenizer, General, Other };

Section section_of(const std::string& key, std::string_view arch) {
  if (key.rfind("tokenizer.", 0) == 0) return Section::Tokenizer;
  if (key.rfind("general.", 0) == 0) return Section::General;
  if (!arch.empty() && key.size() > arch.size() && key.compare(0, arch.size(), arch) == 0 && key[arch.size()] == '.')
    return Section::Hyper;
  return Section::Other;
}

struct Totals {
  int64_t elements = 0;
  size_t bytes = 0;
  std::map<std::string, std::pair<int, size_t>> by_type;  // type -> (tensors, bytes)
};

Totals count(const gguf::File& f) {
  Totals t;
  for (const auto& info : f.tensors()) {
    t.elements += info.elements();
    t.bytes += info.bytes;
    auto& slot = t.by_type[std::string(type_name(info.type))];
    slot.first++;
    slot.second += info.bytes;
  }
  return t;
}

void print_json(const gguf::File& f) {
  ordered_json out;
  out["files"] = f.paths();
  out["version"] = f.version();
  out["alignment"] = f.alignment();
  out["architecture"] = std::string(f.architecture());
  ordered_json meta = ordered_json::object();
  for (const auto& [key, value] : f.metadata()) meta[key] = value_to_json(value);
  out["metadata"] = meta;
  ordered_json tensors = ordered_json::array();
  for (const auto& info : f.tensors())
    tensors.push_back({{"name", info.name}, {"type", std::string(type_name(info.type))}, {"shape", info.shape},
                       {"elements", info.elements()}, {"bytes", info.bytes}, {"offset", info.file_offset},
                       {"file", info.file_index}});
  out["tensors"] = tensors;
  const Totals t = count(f);
  ordered_json by_type = ordered_json::object();
  for (const auto& [type, v] : t.by_type) by_type[type] = {{"tensors", v.first}, {"bytes", v.second}};
  out["totals"] = {{"tensors", f.tensors().size()}, {"elements", t.elements}, {"bytes", t.bytes},
                   {"file_bytes", f.total_file_bytes()}, {"by_type", by_type}};
  fmt::print("{}\n", out.dump(2));
}

void print_text(const gguf::File& f) {
  const std::string arch(f.architecture());
  fmt::print("file:          {}\n", fmt::join(f.paths(), ", "));
  fmt::print("format:        GGUF v{}, alignment {}, {} metadata keys, {} tensors\n", f.version(), f.alignment(),
             f.metadata().size(), f.tensors().size());
  fmt::print("architecture:  {}\n", arch.empty() ? "(none)" : arch);
  if (auto name = f.get_string("general.name", ""); !name.empty()) fmt::print("name:          {}\n", name);

  const char* titles[] = {"hyper-parameters", "tokenizer", "general", "other metadata"};
  for (Section s : {Section::Hyper, Section::Tokenizer, Section::General, Section::Other}) {
    bool header = false;
    for (const auto& [key, value] : f.metadata()) {
      if (section_of(key, arch) != s || (s == Section::General && (key == "general.architecture" || key == "general.name")))
        continue;
      if (!header) fmt::print("\n{}:\n", titles[int(s)]);
      header = true;
      fmt::print("  {:<44} {}\n", key, value_to_text(value));
    }
  }

  if (!f.tensors().empty()) {
    fmt::print("\ntensors:\n  {:<44} {:<8} {:<24} {:>12}\n", "name", "type", "shape", "bytes");
    for (const auto& info : f.tensors())
      fmt::print("  {:<44} {:<8} {:<24} {:>12}\n", info.name, type_name(info.type), shape_text(info.shape), info.bytes);
  }
  const Totals t = count(f);
  fmt::print("\ntotals: {} tensors, {} parameters, {} of tensor data in {} of files\n", f.tensors().size(),
             human_count(t.elements), human_bytes(t.bytes), human_bytes(f.total_file_bytes()));
  for (const auto& [type, v] : t.by_type) fmt::print("  {:<8} {:>5} tensors  {:>12}\n", type, v.first, human_bytes(v.second));
}

}  // namespace

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Describe a GGUF file: architecture, hyper-parameters, tokenizer, tensors");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("file", *path, "GGUF file (any part of a split model)")->required();
  cmd->add_flag("--json", *json, "Print everything as one JSON document");
  cmd->callback([path, json] {
    auto f = gguf::File::open(*path);
    if (*json) print_json(*f);
    else print_text(*f);
  });
}

}  // namespace kiln::cli
