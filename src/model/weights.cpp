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

}  // namespace weight_loading

ModelWeights load_weights(const ModelSource& source, Backend& backend, const HParams& hp,
                          std::span<const GlobalWeightSpec> globals, std::span<const LayerWeightSpec> per_layer) {
  ModelWeights w;
  w.layers.resize(size_t(hp.n_layer));
  std::set<std::string, std::less<>> used;

  auto load = [&](const std::string& name, Need need, Tensor& field) {
    if (!weight_loading::allowed(need, hp)) return;
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
  for (int il = 0; il < hp.n_layer; ++il)
    for (const LayerWeightSpec& spec : per_layer)
      load("blk." + std::to_string(il) + "." + spec.name, spec.need, w.layers[size_t(il)].*spec.field);

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
