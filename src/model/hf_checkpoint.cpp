#include "model/hf_checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/ranges.h>

#include "core/half.h"

namespace kiln {

namespace hf_checkpoint {

// Matches `name` against a rule pattern whose "{L}" / "{E}" stand for decimal numbers, and
// whose trailing "*" (ignore lists only) matches any rest.
bool match(std::string_view pattern, std::string_view name, int& layer, int& expert) {
  layer = expert = -1;
  size_t p = 0, n = 0;
  while (p < pattern.size()) {
    if (pattern[p] == '*' && p + 1 == pattern.size()) return true;
    if (pattern.compare(p, 3, "{L}") == 0 || pattern.compare(p, 3, "{E}") == 0) {
      int& slot = pattern[p + 1] == 'L' ? layer : expert;
      size_t digits = 0;
      int64_t value = 0;
      while (n + digits < name.size() && name[n + digits] >= '0' && name[n + digits] <= '9' && digits < 9)
        value = value * 10 + (name[n + digits++] - '0');
      if (digits == 0) return false;
      slot = int(value);
      n += digits, p += 3;
      continue;
    }
    if (n >= name.size() || name[n] != pattern[p]) return false;
    ++n, ++p;
  }
  return n == name.size();
}

std::string expand_layer(std::string_view pattern, int layer) {
  std::string out(pattern);
  const size_t at = out.find("{L}");
  if (at != std::string::npos) out.replace(at, 3, std::to_string(layer));
  return out;
}

GgmlType ggml_type_of(const safetensors::Tensor& t) {
  const std::optional<GgmlType> type = safetensors::to_ggml_type(t.dtype);
  if (!type) fail("checkpoint tensor {}: dtype {} cannot be a weight", t.name, safetensors::dtype_name(t.dtype));
  return *type;
}

// Element i of a float tensor, as f32.
float element(const safetensors::Tensor& t, int64_t i) {
  switch (t.dtype) {
    case safetensors::Dtype::F32: {
      float v;
      std::memcpy(&v, t.data + size_t(i) * 4, 4);
      return v;
    }
    case safetensors::Dtype::F64: {
      double v;
      std::memcpy(&v, t.data + size_t(i) * 8, 8);
      return float(v);
    }
    case safetensors::Dtype::F16:
    case safetensors::Dtype::BF16: {
      uint16_t h;
      std::memcpy(&h, t.data + size_t(i) * 2, 2);
      return t.dtype == safetensors::Dtype::F16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
    default: fail("checkpoint tensor {}: dtype {} is not a float type", t.name, safetensors::dtype_name(t.dtype));
  }
}

std::vector<float> to_f32(const safetensors::Tensor& t) {
  std::vector<float> out(size_t(t.elements()));
  for (int64_t i = 0; i < t.elements(); ++i) out[size_t(i)] = element(t, i);
  return out;
}

Tensor host_tensor(GgmlType type, const std::vector<int64_t>& ne, void* data) {
  switch (ne.size()) {
    case 1: return Tensor::contiguous(type, {ne[0]}, data);
    case 2: return Tensor::contiguous(type, {ne[0], ne[1]}, data);
    case 3: return Tensor::contiguous(type, {ne[0], ne[1], ne[2]}, data);
    default: return Tensor::contiguous(type, {ne[0], ne[1], ne[2], ne[3]}, data);
  }
}

}  // namespace hf_checkpoint

std::unique_ptr<HfCheckpointSource> HfCheckpointSource::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::unique_ptr<HfCheckpointSource> s(new HfCheckpointSource());
  s->path_ = path;
  s->checkpoint_ = safetensors::Checkpoint::open(path);
  nlohmann::json config = s->checkpoint_->config();
  if (config.is_null() && !fs::is_directory(path)) {
    const fs::path beside = fs::path(path).parent_path() / "config.json";
    if (fs::exists(beside)) config = safetensors::read_json_file(beside.string());
  }
  KILN_CHECK(!config.is_null(), "{}: no config.json (a checkpoint needs one to be run)", path);
  s->config_ = translate_hf_config(config, path);
  s->build_recipes();
  return s;
}

void HfCheckpointSource::build_recipes() {
  const HfTensorTable* table = find_hf_tensor_table(config_.arch);
  KILN_CHECK(table, "{}: no checkpoint tensor table for architecture {}", path_, config_.arch);
  const int n_layer = int(get_int(config_.arch + ".block_count"));
  for (const safetensors::Tensor* t : checkpoint_->tensors()) {
    bool claimed = false;
    int layer = -1, expert = -1;
    for (const HfTensorRule& rule : table->rules) {
      if (!hf_checkpoint::match(rule.hf, t->name, layer, expert)) continue;
      KILN_CHECK(layer < n_layer, "{}: checkpoint tensor {} belongs to layer {}, but num_hidden_layers is {}",
                 path_, t->name, layer, n_layer);
      add_rule_match(rule, *t, layer, expert);
      claimed = true;
    }
    for (const char* pattern : table->ignored) claimed = claimed || hf_checkpoint::match(pattern, t->name, layer, expert);
    KILN_CHECK(claimed, "{}: checkpoint tensor {} is not used by model_type {} (an unknown weight, or a layout kiln "
               "does not read)", path_, t->name, config_.model_type);
  }
  for (const auto& [name, values] : config_.computed) {
    Recipe& r = recipes_[name];
    r.name = name;
    r.computed = &values;
  }
  KILN_CHECK(recipes_.count("output.weight") || !config_.tie_stated || config_.tied_embeddings,
             "{}: the checkpoint lacks lm_head.weight, and config.json says tie_word_embeddings false", path_);
  for (auto& [name, recipe] : recipes_) finish_recipe(recipe);
}

void HfCheckpointSource::add_rule_match(const HfTensorRule& rule, const safetensors::Tensor& t, int layer,
                                        int expert) {
  const std::string name = hf_checkpoint::expand_layer(rule.gguf, layer);
  if (expert < 0) {
    auto [it, inserted] = recipes_.try_emplace(name);
    KILN_CHECK(inserted, "{}: checkpoint tensors {} and {} both map to {}", path_, it->second.sources.front()->name,
               t.name, name);
    it->second.name = name;
    it->second.transform = rule.transform;
    it->second.sources = {&t};
    return;
  }
  const int n_expert = int(get_int(config_.arch + ".expert_count", 0));
  KILN_CHECK(expert < n_expert, "{}: checkpoint tensor {} is expert {}, but the config has {} experts", path_, t.name,
             expert, n_expert);
  Recipe& r = recipes_[name];
  r.name = name;
  r.stacked = true;
  r.sources.resize(size_t(n_expert), nullptr);
  KILN_CHECK(!r.sources[size_t(expert)], "{}: {} and {} are both expert {} of {}", path_,
             r.sources[size_t(expert)] ? r.sources[size_t(expert)]->name : "", t.name, expert, name);
  r.sources[size_t(expert)] = &t;
}

void HfCheckpointSource::finish_recipe(Recipe& r) {
  using T = HfTransform;
  if (r.computed) {
    r.type = GgmlType::F32;
    r.shape = {int64_t(r.computed->size())};
    return;
  }
  const safetensors::Tensor& first = *r.sources.front();
  if (r.stacked) {
    // Experts e = 0..E-1 of {in, out} each become one {in, out, E} tensor.
    for (size_t e = 0; e < r.sources.size(); ++e) {
      const safetensors::Tensor* t = r.sources[e];
      KILN_CHECK(t, "{}: the checkpoint lacks expert {} of {} (have e.g. {})", path_, e, r.name, first.name);
      KILN_CHECK(t->shape.size() == 2 && t->shape == first.shape && t->dtype == first.dtype,
                 "{}: expert tensor {} is {} {}, unlike {} ({} {})", path_, t->name, safetensors::dtype_name(t->dtype),
                 fmt::join(t->shape, "x"), first.name, safetensors::dtype_name(first.dtype), fmt::join(first.shape, "x"));
    }
    r.type = hf_checkpoint::ggml_type_of(first);
    r.shape = {first.shape[1], first.shape[0], int64_t(r.sources.size())};
    return;
  }
  switch (r.transform) {
    case T::None:
      r.shape = first.ggml_shape();
      KILN_CHECK(!r.shape.empty() && r.shape.size() <= 4, "{}: checkpoint tensor {} has {} dimensions", path_,
                 first.name, r.shape.size());
      // Norm weights, biases and the like feed f32-only ops: widen them.
      r.type = r.shape.size() == 1 ? GgmlType::F32 : hf_checkpoint::ggml_type_of(first);
      break;
    case T::AddOne:
    case T::NegExp:
      KILN_CHECK(first.shape.size() == 1, "{}: checkpoint tensor {} should be a vector, is {}", path_, first.name,
                 fmt::join(first.shape, "x"));
      r.type = GgmlType::F32;
      r.shape = first.ggml_shape();
      break;
    case T::ConvKernel:
      KILN_CHECK(first.shape.size() == 3 && first.shape[1] == 1, "{}: conv1d weight {} should be [channels, 1, "
                 "kernel], is {}", path_, first.name, fmt::join(first.shape, "x"));
      r.type = GgmlType::F32;
      r.shape = {first.shape[2], first.shape[0]};
      break;
    case T::QkvzToQkv:
    case T::QkvzToZ: {
      const std::string& a = config_.arch;
      const int n_k = int(get_int(a + ".ssm.group_count")), n_v = int(get_int(a + ".ssm.time_step_rank"));
      const int dk = int(get_int(a + ".ssm.state_size")), dv = int(get_int(a + ".ssm.inner_size")) / n_v;
      KILN_CHECK(n_k > 0 && n_v % n_k == 0, "{}: {} value heads do not group over {} key heads", path_, n_v, n_k);
      const int64_t expect = int64_t(n_k) * (2 * dk + 2 * (n_v / n_k) * dv);
      KILN_CHECK(first.shape.size() == 2 && first.shape[0] == expect, "{}: {} is {}; {} rows expected from the "
                 "linear-attention sizes in config.json", path_, first.name, fmt::join(first.shape, "x"), expect);
      r.rows = qwen3next_qkvz_rows(n_k, n_v, dk, dv, r.transform == T::QkvzToZ);
      r.type = hf_checkpoint::ggml_type_of(first);
      r.shape = {first.shape[1], int64_t(r.rows.size())};
      break;
    }
  }
  // Tensors used as they are stay views of the mapping.
  if (r.transform == T::None && r.type == hf_checkpoint::ggml_type_of(first) &&
      reinterpret_cast<uintptr_t>(first.data) % safetensors::dtype_size(first.dtype) == 0) {
    r.view.name = r.name;
    r.view.type = r.type;
    r.view.shape = r.shape;
    r.view.bytes = first.bytes;
    r.view.data = first.data;
    r.is_view = true;
  }
}

std::string HfCheckpointSource::native_name(std::string_view name) const {
  const HfTensorTable* table = find_hf_tensor_table(config_.arch);
  int layer = -1, expert = -1;
  for (const HfTensorRule& rule : table->rules)
    if (hf_checkpoint::match(rule.gguf, name, layer, expert)) return hf_checkpoint::expand_layer(rule.hf, layer);
  return {};
}

std::vector<std::string> HfCheckpointSource::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, recipe] : recipes_) names.push_back(name);
  return names;
}

const std::vector<int64_t>* HfCheckpointSource::tensor_shape(std::string_view name) const {
  auto it = recipes_.find(name);
  return it == recipes_.end() ? nullptr : &it->second.shape;
}

Tensor HfCheckpointSource::load_tensor(std::string_view name, Backend& backend) const {
  using T = HfTransform;
  auto it = recipes_.find(name);
  if (it == recipes_.end()) fail("{}: no tensor {} in the checkpoint", path_, name);
  const Recipe& r = it->second;
  if (r.is_view) return backend.weight(r.view);

  std::vector<uint8_t> host;
  auto append_bytes = [&](const uint8_t* p, size_t n) { host.insert(host.end(), p, p + n); };
  auto set_f32 = [&](const std::vector<float>& v) {
    host.resize(v.size() * sizeof(float));
    std::memcpy(host.data(), v.data(), host.size());
  };
  const safetensors::Tensor* first = r.sources.empty() ? nullptr : r.sources.front();
  if (r.computed) {
    set_f32(*r.computed);
  } else if (r.stacked) {
    for (const safetensors::Tensor* t : r.sources) append_bytes(t->data, t->bytes);
  } else if (r.transform == T::QkvzToQkv || r.transform == T::QkvzToZ) {
    const size_t row_bytes = first->bytes / size_t(first->shape[0]);
    for (int64_t row : r.rows) append_bytes(first->data + size_t(row) * row_bytes, row_bytes);
  } else {
    // None (widened or re-aligned), AddOne, NegExp, ConvKernel ([C, 1, K] has GGUF's bytes).
    std::vector<float> v = r.type == GgmlType::F32 ? hf_checkpoint::to_f32(*first) : std::vector<float>{};
    if (r.transform == T::AddOne)
      for (float& x : v) x = x + 1.0f;
    if (r.transform == T::NegExp)
      for (float& x : v) x = float(-std::exp(double(x)));
    if (r.type == GgmlType::F32) set_f32(v);
    else append_bytes(first->data, first->bytes);
  }
  Tensor t = hf_checkpoint::host_tensor(r.type, r.shape, host.data());
  KILN_CHECK(t.bytes() == host.size(), "{}: {} made {} bytes, {} expected for {}", path_, r.name, host.size(),
             t.bytes(), t.describe());
  return backend.owned_weight(t, r.name);
}

}  // namespace kiln
