#pragma once
// Which weight matrices of a format take the interleaved decode layout (decode_layout.h),
// chosen by the matrix's role in the model: the layout's gain depends on the product a matrix
// feeds and on its neighbours in the step (docs/perf-notes.md, rounds 18 and 19), so
// CudaOptions keeps a set of roles per format.
#include <optional>
#include <string_view>

namespace kiln::cuda {

enum LayoutRole : unsigned {
  kLayoutNone = 0,
  kLayoutGateUp = 1u << 0,  // ffn_gate, ffn_up (a shared expert's too; not the router, ffn_gate_inp)
  kLayoutDown = 1u << 1,    // ffn_down
  kLayoutQkv = 1u << 2,     // attn_q, attn_k, attn_v, attn_qkv
  kLayoutO = 1u << 3,       // attn_output
  kLayoutHead = 1u << 4,    // output, and token_embd (the head when tied; get_rows reads it too)
  kLayoutOther = 1u << 5,   // every other matrix
  kLayoutAll = (1u << 6) - 1,
};

// The role of a GGUF tensor name ("blk.7.ffn_down.weight" -> kLayoutDown).
LayoutRole layout_role(std::string_view gguf_name);

// A set of roles from text: "none", "all", or role names joined by ',' (gate_up, down, qkv, o,
// head, other). nullopt when the text is empty or a part names no role.
std::optional<unsigned> parse_layout_roles(std::string_view text);

}  // namespace kiln::cuda
