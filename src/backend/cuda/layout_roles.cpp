#include "backend/cuda/layout_roles.h"

#include <array>
#include <utility>

namespace kiln::cuda {
namespace {

// The name's part that says what the tensor is: "ffn_down" in "blk.7.ffn_down.weight",
// "output" in "output.weight".
std::string_view kind_part(std::string_view name) {
  if (name.starts_with("blk.")) {
    const size_t layer_end = name.find('.', 4);
    name = layer_end == std::string_view::npos ? std::string_view{} : name.substr(layer_end + 1);
  }
  return name.substr(0, name.find('.'));
}

constexpr std::array<std::pair<std::string_view, unsigned>, 8> kRoleNames{{
    {"none", kLayoutNone},
    {"all", kLayoutAll},
    {"gate_up", kLayoutGateUp},
    {"down", kLayoutDown},
    {"qkv", kLayoutQkv},
    {"o", kLayoutO},
    {"head", kLayoutHead},
    {"other", kLayoutOther},
}};

}  // namespace

LayoutRole layout_role(std::string_view gguf_name) {
  const std::string_view kind = kind_part(gguf_name);
  if (kind.starts_with("ffn_gate_inp")) return kLayoutOther;
  if (kind.starts_with("ffn_gate") || kind.starts_with("ffn_up")) return kLayoutGateUp;
  if (kind.starts_with("ffn_down")) return kLayoutDown;
  if (kind == "attn_q" || kind == "attn_k" || kind == "attn_v" || kind == "attn_qkv") return kLayoutQkv;
  if (kind == "attn_output") return kLayoutO;
  if (kind == "output" || kind == "token_embd") return kLayoutHead;
  return kLayoutOther;
}

std::optional<unsigned> parse_layout_roles(std::string_view text) {
  if (text.empty()) return std::nullopt;
  unsigned roles = kLayoutNone;
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view part = text.substr(0, comma);
    bool known = false;
    for (const auto& [name, bits] : kRoleNames)
      if (part == name) roles |= bits, known = true;
    if (!known) return std::nullopt;
    if (comma == std::string_view::npos) return roles;
    text.remove_prefix(comma + 1);
  }
}

}  // namespace kiln::cuda
