#pragma once
// One entry per architecture: how to finish its hyper-parameters, which tensors it reads,
// and its forward pass. Each family lives in its own file (model/<family>.cpp) and adds
// its entries to the registry (model/registry.cpp).
#include <span>
#include <string_view>
#include <vector>

#include "model/forward.h"
#include "model/source.h"

namespace kiln {

struct Architecture {
  std::string_view name;  // general.architecture
  // Sets what the source does not store (rope style, MoE gating, sliding-window layers...).
  void (*configure)(HParams& hp, const ModelSource& source);
  std::span<const GlobalWeightSpec> global_weights;
  std::span<const LayerWeightSpec> layer_weights;
  // Runs the batch: reads pass.tokens, writes pass.logits.
  void (*forward)(ForwardPass& pass);
};

// The architecture registered under `name`, or nullptr.
const Architecture* find_architecture(std::string_view name);
std::vector<std::string_view> architecture_names();

// Each family file exposes its entries (declared here so the registry needs no headers).
std::span<const Architecture> llama_family();
std::span<const Architecture> qwen_family();
std::span<const Architecture> gemma2_family();
std::span<const Architecture> qwen3next_family();  // qwen3next, qwen35 (hybrid GatedDeltaNet)
std::span<const Architecture> gptoss_family();

}  // namespace kiln
