// Checkpoint tensor names -> GGUF tensor names, per architecture, with the layout change
// each needs. These are the facts llama.cpp's converter applies (checked tensor by tensor
// against the converted files in testdata/arch; docs/model-framework.md lists them).
#include "model/hf_checkpoint.h"

namespace kiln {

namespace hf_tensors {

using T = HfTransform;

// Llama (dense) and Mixtral (its MoE block is "block_sparse_moe", experts w1/w3/w2 =
// gate/up/down). Wq/Wk are kept as they are: the architecture ropes HF's layout with the
// neox pairing (llama.cpp's converter permutes their rows for the "normal" pairing instead).
constexpr HfTensorRule kLlamaRules[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
    {"model.layers.{L}.input_layernorm.weight", "blk.{L}.attn_norm.weight"},
    {"model.layers.{L}.self_attn.q_proj.weight", "blk.{L}.attn_q.weight"},
    {"model.layers.{L}.self_attn.k_proj.weight", "blk.{L}.attn_k.weight"},
    {"model.layers.{L}.self_attn.v_proj.weight", "blk.{L}.attn_v.weight"},
    {"model.layers.{L}.self_attn.o_proj.weight", "blk.{L}.attn_output.weight"},
    {"model.layers.{L}.self_attn.q_proj.bias", "blk.{L}.attn_q.bias"},
    {"model.layers.{L}.self_attn.k_proj.bias", "blk.{L}.attn_k.bias"},
    {"model.layers.{L}.self_attn.v_proj.bias", "blk.{L}.attn_v.bias"},
    {"model.layers.{L}.self_attn.o_proj.bias", "blk.{L}.attn_output.bias"},
    {"model.layers.{L}.post_attention_layernorm.weight", "blk.{L}.ffn_norm.weight"},
    {"model.layers.{L}.mlp.gate_proj.weight", "blk.{L}.ffn_gate.weight"},
    {"model.layers.{L}.mlp.up_proj.weight", "blk.{L}.ffn_up.weight"},
    {"model.layers.{L}.mlp.down_proj.weight", "blk.{L}.ffn_down.weight"},
    {"model.layers.{L}.block_sparse_moe.gate.weight", "blk.{L}.ffn_gate_inp.weight"},
    {"model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight", "blk.{L}.ffn_gate_exps.weight"},
    {"model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight", "blk.{L}.ffn_up_exps.weight"},
    {"model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight", "blk.{L}.ffn_down_exps.weight"},
};

// Qwen2 (q/k/v biases), Qwen3 (q/k norms), Qwen3-MoE (routed experts).
constexpr HfTensorRule kQwenRules[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
    {"model.layers.{L}.input_layernorm.weight", "blk.{L}.attn_norm.weight"},
    {"model.layers.{L}.self_attn.q_proj.weight", "blk.{L}.attn_q.weight"},
    {"model.layers.{L}.self_attn.k_proj.weight", "blk.{L}.attn_k.weight"},
    {"model.layers.{L}.self_attn.v_proj.weight", "blk.{L}.attn_v.weight"},
    {"model.layers.{L}.self_attn.o_proj.weight", "blk.{L}.attn_output.weight"},
    {"model.layers.{L}.self_attn.q_proj.bias", "blk.{L}.attn_q.bias"},
    {"model.layers.{L}.self_attn.k_proj.bias", "blk.{L}.attn_k.bias"},
    {"model.layers.{L}.self_attn.v_proj.bias", "blk.{L}.attn_v.bias"},
    {"model.layers.{L}.self_attn.q_norm.weight", "blk.{L}.attn_q_norm.weight"},
    {"model.layers.{L}.self_attn.k_norm.weight", "blk.{L}.attn_k_norm.weight"},
    {"model.layers.{L}.post_attention_layernorm.weight", "blk.{L}.ffn_norm.weight"},
    {"model.layers.{L}.mlp.gate_proj.weight", "blk.{L}.ffn_gate.weight"},
    {"model.layers.{L}.mlp.up_proj.weight", "blk.{L}.ffn_up.weight"},
    {"model.layers.{L}.mlp.down_proj.weight", "blk.{L}.ffn_down.weight"},
    {"model.layers.{L}.mlp.gate.weight", "blk.{L}.ffn_gate_inp.weight"},
    {"model.layers.{L}.mlp.experts.{E}.gate_proj.weight", "blk.{L}.ffn_gate_exps.weight"},
    {"model.layers.{L}.mlp.experts.{E}.up_proj.weight", "blk.{L}.ffn_up_exps.weight"},
    {"model.layers.{L}.mlp.experts.{E}.down_proj.weight", "blk.{L}.ffn_down_exps.weight"},
};

// Qwen3-Next. Its RMSNorms compute x * (1 + w) with w stored (GGUF stores 1 + w), except
// the GatedDeltaNet's gated norm, which is plain in both.
constexpr HfTensorRule kQwen3NextRules[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight", T::AddOne},
    {"lm_head.weight", "output.weight"},
    {"model.layers.{L}.input_layernorm.weight", "blk.{L}.attn_norm.weight", T::AddOne},
    {"model.layers.{L}.post_attention_layernorm.weight", "blk.{L}.post_attention_norm.weight", T::AddOne},
    // gated full attention (q_proj yields query and gate per head, as GGUF's attn_q)
    {"model.layers.{L}.self_attn.q_proj.weight", "blk.{L}.attn_q.weight"},
    {"model.layers.{L}.self_attn.k_proj.weight", "blk.{L}.attn_k.weight"},
    {"model.layers.{L}.self_attn.v_proj.weight", "blk.{L}.attn_v.weight"},
    {"model.layers.{L}.self_attn.o_proj.weight", "blk.{L}.attn_output.weight"},
    {"model.layers.{L}.self_attn.q_norm.weight", "blk.{L}.attn_q_norm.weight", T::AddOne},
    {"model.layers.{L}.self_attn.k_norm.weight", "blk.{L}.attn_k_norm.weight", T::AddOne},
    // GatedDeltaNet: in_proj_qkvz becomes two tensors (see qwen3next_qkvz_rows)
    {"model.layers.{L}.linear_attn.in_proj_qkvz.weight", "blk.{L}.attn_qkv.weight", T::QkvzToQkv},
    {"model.layers.{L}.linear_attn.in_proj_qkvz.weight", "blk.{L}.attn_gate.weight", T::QkvzToZ},
    {"model.layers.{L}.linear_attn.in_proj_ba.weight", "blk.{L}.ssm_ba.weight"},
    {"model.layers.{L}.linear_attn.conv1d.weight", "blk.{L}.ssm_conv1d.weight", T::ConvKernel},
    {"model.layers.{L}.linear_attn.A_log", "blk.{L}.ssm_a", T::NegExp},
    {"model.layers.{L}.linear_attn.dt_bias", "blk.{L}.ssm_dt.bias"},
    {"model.layers.{L}.linear_attn.norm.weight", "blk.{L}.ssm_norm.weight"},
    {"model.layers.{L}.linear_attn.out_proj.weight", "blk.{L}.ssm_out.weight"},
    // routed experts + gated shared expert
    {"model.layers.{L}.mlp.gate.weight", "blk.{L}.ffn_gate_inp.weight"},
    {"model.layers.{L}.mlp.experts.{E}.gate_proj.weight", "blk.{L}.ffn_gate_exps.weight"},
    {"model.layers.{L}.mlp.experts.{E}.up_proj.weight", "blk.{L}.ffn_up_exps.weight"},
    {"model.layers.{L}.mlp.experts.{E}.down_proj.weight", "blk.{L}.ffn_down_exps.weight"},
    {"model.layers.{L}.mlp.shared_expert.gate_proj.weight", "blk.{L}.ffn_gate_shexp.weight"},
    {"model.layers.{L}.mlp.shared_expert.up_proj.weight", "blk.{L}.ffn_up_shexp.weight"},
    {"model.layers.{L}.mlp.shared_expert.down_proj.weight", "blk.{L}.ffn_down_shexp.weight"},
    {"model.layers.{L}.mlp.shared_expert_gate.weight", "blk.{L}.ffn_gate_inp_shexp.weight"},
};

// Rotary tables some older checkpoints save (recomputed from the config instead).
constexpr const char* kIgnoredRotary[] = {"model.layers.{L}.self_attn.rotary_emb.inv_freq"};
// Qwen3-Next's multi-token-prediction head (speculative decoding; not run by kiln).
constexpr const char* kIgnoredQwen3Next[] = {"mtp.*"};

struct ArchTable {
  const char* arch;
  HfTensorTable table;
};

const ArchTable kTables[] = {
    {"llama", {kLlamaRules, kIgnoredRotary}},
    {"qwen2", {kQwenRules, kIgnoredRotary}},
    {"qwen3", {kQwenRules, kIgnoredRotary}},
    {"qwen3moe", {kQwenRules, kIgnoredRotary}},
    {"qwen3next", {kQwen3NextRules, kIgnoredQwen3Next}},
};

}  // namespace hf_tensors

const HfTensorTable* find_hf_tensor_table(std::string_view arch) {
  for (const hf_tensors::ArchTable& t : hf_tensors::kTables)
    if (arch == t.arch) return &t.table;
  return nullptr;
}

std::vector<int64_t> qwen3next_qkvz_rows(int n_k_heads, int n_v_heads, int head_dim_k, int head_dim_v, bool want_z) {
  // HF's in_proj_qkvz is grouped by key head: for each key head g, the rows
  //   [q_g (dk) | k_g (dk) | v of g's r value heads (r*dv) | z of them (r*dv)],  r = n_v / n_k.
  // GGUF's attn_qkv is all q | all k | all v (the short conv's channel order, value heads
  // keeping HF's order), and attn_gate is all z.
  const int64_t dk = head_dim_k, rdv = int64_t(n_v_heads / n_k_heads) * head_dim_v;
  const int64_t group = 2 * dk + 2 * rdv;
  std::vector<int64_t> rows;
  auto take = [&](int64_t offset, int64_t count) {
    for (int64_t g = 0; g < n_k_heads; ++g)
      for (int64_t i = 0; i < count; ++i) rows.push_back(g * group + offset + i);
  };
  if (want_z) {
    take(2 * dk + rdv, rdv);
  } else {
    take(0, dk);
    take(dk, dk);
    take(2 * dk, rdv);
  }
  return rows;
}

}  // namespace kiln
