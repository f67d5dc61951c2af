#include "model/weights.h"

#include <set>
#include <string>

#include "formats/gguf.h"
#include "model/source.h"

namespace kiln {

namespace weight_loading {

bool wanted(Need need, const HParams& hp) {
  switch (need) {
    case Need::Required: return true;
    case Need::Optional: return false;
    case Need::Dense: return hp.n_expert == 0;
    case Need::Moe: return hp.n_expert > 0;
  }
  return true;
}

bool allowed(Need need, const HParams& hp) {
  return need == Need::Required || need == Need::Optional || wanted(need, hp);
}

// Layer weights multiplied with one input: loaded side by side when the architecture takes
// all of a group and the source has them (a backend may then run their products as one).
constexpr std::string_view kSideBySide[][3] = {
    {"attn_q.weight", "attn_k.weight", "attn_v.weight"},
    {"ffn_gate.weight", "ffn_up.weight", ""},
};

}  // namespace weight_loading

ModelWeights load_weights(const ModelSource& source, Backend& backend, const HParams& hp,
                          std::span<const GlobalWeightSpec> globals, std::span<const LayerWeightSpec> per_layer) {
  ModelWeights w;
  w.layers.resize(size_t(hp.n_layer));
  std::set<std::string, std::less<>> used;

  auto load = [&](const std::string& name, Need need, Tensor& field) {
    if (!weight_loading::allowed(need, hp) || used.count(name)) return;
    if (!source.has_tensor(name)) {
      if (!weight_loading::wanted(need, hp)) return;
      const std::string native = source.native_name(name);
      fail("{}: architecture {} needs tensor {}{}, which the {} lacks", source.path(), hp.arch, name,
           native.empty() ? "" : " (" + native + ")", source.format() == SourceFormat::Gguf ? "file" : "checkpoint");
    }
    field = source.load_tensor(name, backend);
    used.insert(name);
  };
  for (const GlobalWeightSpec& spec : globals) load(spec.name, spec.need, w.*spec.field);
  // A group of layer weights in one call, where every member is in the table and the source.
  auto load_group = [&](int il, std::span<const std::string_view> group) {
    std::vector<std::string> names;
    std::vector<Tensor LayerWeights::*> fields;
    for (std::string_view member : group) {
      if (member.empty()) continue;
      const LayerWeightSpec* spec = nullptr;
      for (const LayerWeightSpec& s : per_layer)
        if (s.name == member) spec = &s;
      const std::string name = "blk." + std::to_string(il) + "." + std::string(member);
      if (!spec || !weight_loading::allowed(spec->need, hp) || !source.has_tensor(name)) return;
      names.push_back(name);
      fields.push_back(spec->field);
    }
    std::vector<Tensor> tensors = source.load_side_by_side(names, backend);
    for (size_t i = 0; i < names.size(); ++i) {
      w.layers[size_t(il)].*fields[i] = tensors[i];
      used.insert(names[i]);
    }
  };
  for (int il = 0; il < hp.n_layer; ++il) {
    for (const auto& group : weight_loading::kSideBySide) load_group(il, group);
    for (const LayerWeightSpec& spec : per_layer)
      load("blk." + std::to_string(il) + "." + spec.name, spec.need, w.layers[size_t(il)].*spec.field);
  }

  for (const std::string& name : source.tensor_names())
    KILN_CHECK(used.count(name), "{}: tensor {} is not used by architecture {} (unknown weight or wrong "
               "architecture)", source.path(), name, hp.arch);
  return w;
}

ModelWeights load_weights(const gguf::File& file, Backend& backend, const HParams& hp,
                          std::span<const GlobalWeightSpec> globals, std::span<const LayerWeightSpec> per_layer) {
  return load_weights(GgufSource(file), backend, hp, globals, per_layer);
}

}  // namespace kiln
