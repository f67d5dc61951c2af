// The Qwen family (dense and MoE): Qwen2 / 2.5 (q/k/v biases), Qwen3 (per-head RMSNorm
// of q and k before rope, no biases), Qwen3-MoE (Qwen3 attention, routed experts).
//
// Same pre-norm decoder as llama; rope pairs the two halves of each head (neox style),
// as in the HF checkpoints (the converter does not permute Wq/Wk for these).
#include "formats/gguf.h"
#include "model/architecture.h"
#include "model/layers.h"

namespace kiln {

namespace qwen_arch {

constexpr GlobalWeightSpec kGlobals[] = {
    {"token_embd.weight", &ModelWeights::tok_embd, Need::Required},
    {"output_norm.weight", &ModelWeights::output_norm, Need::Required},
    {"output.weight", &ModelWeights::output, Need::Optional},  // absent: tied embeddings
};

#define KILN_QWEN_ATTENTION_WEIGHTS                                      \
  {"attn_norm.weight", &LayerWeights::attn_norm, Need::Required},        \
  {"attn_q.weight", &LayerWeights::wq, Need::Required},                  \
  {"attn_k.weight", &LayerWeights::wk, Need::Required},                  \
  {"attn_v.weight", &LayerWeights::wv, Need::Required},                  \
  {"attn_output.weight", &LayerWeights::wo, Need::Required},             \
  {"ffn_norm.weight", &LayerWeights::ffn_norm, Need::Required}

constexpr LayerWeightSpec kQwen2Layer[] = {
    KILN_QWEN_ATTENTION_WEIGHTS,
    {"attn_q.bias", &LayerWeights::bq, Need::Required},
    {"attn_k.bias", &LayerWeights::bk, Need::Required},
    {"attn_v.bias", &LayerWeights::bv, Need::Required},
    {"ffn_gate.weight", &LayerWeights::ffn_gate, Need::Required},
    {"ffn_up.weight", &LayerWeights::ffn_up, Need::Required},
    {"ffn_down.weight", &LayerWeights::ffn_down, Need::Required},
};

constexpr LayerWeightSpec kQwen3Layer[] = {
    KILN_QWEN_ATTENTION_WEIGHTS,
    {"attn_q_norm.weight", &LayerWeights::q_norm, Need::Required},
    {"attn_k_norm.weight", &LayerWeights::k_norm, Need::Required},
    {"ffn_gate.weight", &LayerWeights::ffn_gate, Need::Required},
    {"ffn_up.weight", &LayerWeights::ffn_up, Need::Required},
    {"ffn_down.weight", &LayerWeights::ffn_down, Need::Required},
};

constexpr LayerWeightSpec kQwen3MoeLayer[] = {
    KILN_QWEN_ATTENTION_WEIGHTS,
    {"attn_q_norm.weight", &LayerWeights::q_norm, Need::Required},
    {"attn_k_norm.weight", &LayerWeights::k_norm, Need::Required},
    {"ffn_gate_inp.weight", &LayerWeights::moe_router, Need::Required},
    {"ffn_gate_exps.weight", &LayerWeights::exp_gate, Need::Required},
    {"ffn_up_exps.weight", &LayerWeights::exp_up, Need::Required},
    {"ffn_down_exps.weight", &LayerWeights::exp_down, Need::Required},
};

#undef KILN_QWEN_ATTENTION_WEIGHTS

void configure(HParams& hp, const ModelSource& source) {
  hp.rope_style = RopeStyle::Neox;
  // Qwen3-MoE renormalizes the chosen experts' softmax weights (HF norm_topk_prob, which
  // every released model sets); a file may say otherwise through expert_weights_norm.
  hp.expert_gating = MoeGating::Softmax;
  hp.expert_weights_norm = source.get_bool(hp.arch + ".expert_weights_norm", true);
}

constexpr Architecture kArchitectures[] = {
    {"qwen2", configure, kGlobals, kQwen2Layer, forward_prenorm_silu},
    {"qwen3", configure, kGlobals, kQwen3Layer, forward_prenorm_silu},
    {"qwen3moe", configure, kGlobals, kQwen3MoeLayer, forward_prenorm_silu},
};

}  // namespace qwen_arch

std::span<const Architecture> qwen_family() { return qwen_arch::kArchitectures; }

}  // namespace kiln
