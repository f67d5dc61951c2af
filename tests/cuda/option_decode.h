#pragma once
// A model decoded greedily by a CUDA backend built with given options: what the tests that
// compare a fused path with the ops apart on a whole model (tiny256 reference files) share.
#include <cstdint>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "model/model_test_util.h"

namespace kiln::testing {

struct OptionDecode {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // every step's
  int64_t ops = 0;            // ops the backend recorded for the whole decode
};

// 16 greedy steps after `prompt`, through a 256-token cache of `cache_type`; `loaded` sees the
// model before it runs.
inline OptionDecode decode_with_options(const gguf::File& file, const CudaOptions& options,
                                        const std::vector<int32_t>& prompt, GgmlType cache_type = GgmlType::F32,
                                        const std::function<void(const Model&)>& loaded = {}) {
  CudaBackend backend(options);
  const auto model = Model::load(file, backend);
  if (loaded) loaded(*model);
  OptionDecode d;
  const int64_t before = backend.recorded_ops();
  d.tokens = greedy_decode(*model, backend, prompt, 16, 256, &d.logits, cache_type);
  d.ops = backend.recorded_ops() - before;
  return d;
}

// The first 8 tokens of the reference token ids (quant/models/ids.json).
inline std::vector<int32_t> tiny256_prompt(const nlohmann::json& ids_ref) {
  const std::vector<int32_t> ids = to_ids(ids_ref["ids"]);
  return std::vector<int32_t>(ids.begin(), ids.begin() + 8);
}

}  // namespace kiln::testing
