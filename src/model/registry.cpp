// The table of architectures. Adding one: write model/<family>.cpp exposing a
// std::span<const Architecture>, declare it in model/architecture.h, list it here.
#include "model/architecture.h"

namespace kiln {

namespace registry_detail {

using FamilyList = std::span<const Architecture> (*)();
constexpr FamilyList kFamilies[] = {
    llama_family,
    qwen_family,
    gemma2_family,
    qwen3next_family,
    gptoss_family,
};

}  // namespace registry_detail

const Architecture* find_architecture(std::string_view name) {
  for (auto family : registry_detail::kFamilies)
    for (const Architecture& a : family())
      if (a.name == name) return &a;
  return nullptr;
}

std::vector<std::string_view> architecture_names() {
  std::vector<std::string_view> names;
  for (auto family : registry_detail::kFamilies)
    for (const Architecture& a : family()) names.push_back(a.name);
  return names;
}

}  // namespace kiln
