#include "model/weights.h"

#include <set>
#include <string>

#include "formats/gguf.h"

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

ModelWeights load_weights(const gguf::File& file, Backend& backend, const HParams& hp,
                          std::span<const GlobalWeightSpec> globals, std::span<const LayerWeightSpec> per_layer) {
  ModelWeights w;
  w.layers.resize(size_t(hp.n_layer));
  std::set<std::string> used;
  const std::string& file_name = file.paths().front();

  auto load = [&](const std::string& name, Need need, Tensor& field) {
    if (!weight_loading::allowed(need, hp)) return;
    const gguf::TensorInfo* info = file.find_tensor(name);
    if (!info) {
      KILN_CHECK(!weight_loading::wanted(need, hp), "{}: architecture {} needs tensor {}, which the file lacks",
                 file_name, hp.arch, name);
      return;
    }
    field = backend.weight(*info);
    used.insert(name);
  };
  for (const GlobalWeightSpec& spec : globals) load(spec.name, spec.need, w.*spec.field);
  for (int il = 0; il < hp.n_layer; ++il)
    for (const LayerWeightSpec& spec : per_layer)
      load("blk." + std::to_string(il) + "." + spec.name, spec.need, w.layers[size_t(il)].*spec.field);

  for (const gguf::TensorInfo& t : file.tensors())
    KILN_CHECK(used.count(t.name), "{}: tensor {} is not used by architecture {} (unknown weight or wrong "
               "architecture)", file_name, t.name, hp.arch);
  return w;
}

}  // namespace kiln
