#include "model/source.h"

#include <filesystem>

#include "model/hf_checkpoint.h"

namespace kiln {

const gguf::Value& ModelSource::get(std::string_view key) const {
  const gguf::Value* v = find(key);
  if (!v) fail("{}: missing metadata key '{}'", path(), key);
  return *v;
}

int64_t ModelSource::get_int(std::string_view key, int64_t fallback) const {
  const gguf::Value* v = find(key);
  return v ? v->as_int(key) : fallback;
}

double ModelSource::get_float(std::string_view key, double fallback) const {
  const gguf::Value* v = find(key);
  return v ? v->as_float(key) : fallback;
}

bool ModelSource::get_bool(std::string_view key, bool fallback) const {
  const gguf::Value* v = find(key);
  return v ? v->as_bool(key) : fallback;
}

std::string_view ModelSource::get_string(std::string_view key, std::string_view fallback) const {
  const gguf::Value* v = find(key);
  return v ? v->as_string(key) : fallback;
}

std::vector<std::string> GgufSource::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(file_.tensors().size());
  for (const gguf::TensorInfo& t : file_.tensors()) names.push_back(t.name);
  return names;
}

const std::vector<int64_t>* GgufSource::tensor_shape(std::string_view name) const {
  const gguf::TensorInfo* info = file_.find_tensor(name);
  return info ? &info->shape : nullptr;
}

Tensor GgufSource::load_tensor(std::string_view name, Backend& backend) const {
  const gguf::TensorInfo* info = file_.find_tensor(name);
  if (!info) fail("{}: no tensor {}", path(), name);
  return backend.weight(*info);
}

std::vector<Tensor> ModelSource::load_side_by_side(std::span<const std::string> names, Backend& backend) const {
  std::vector<Tensor> out;
  out.reserve(names.size());
  for (const std::string& name : names) out.push_back(load_tensor(name, backend));
  return out;
}

std::vector<Tensor> GgufSource::load_side_by_side(std::span<const std::string> names, Backend& backend) const {
  std::vector<const gguf::TensorInfo*> infos;
  for (const std::string& name : names) {
    const gguf::TensorInfo* info = file_.find_tensor(name);
    if (!info) fail("{}: no tensor {}", path(), name);
    infos.push_back(info);
  }
  return backend.weights_side_by_side(infos);
}

bool is_hf_checkpoint_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) return true;
  const std::string name = fs::path(path).filename().string();
  return name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json");
}

std::unique_ptr<ModelSource> open_model_source(const std::string& path) {
  if (is_hf_checkpoint_path(path)) return HfCheckpointSource::open(path);
  return std::make_unique<GgufSource>(gguf::File::open(path));
}

}  // namespace kiln
