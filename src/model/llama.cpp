// The llama family: Llama 1/2/3 (3.1 rope scaling through the rope_freqs tensor),
// TinyLlama-style small models, and Mixtral (llama with routed experts in place of the FFN).
//
// Per layer:  h = x + Wo·attn(rope(Wq·n), rope(Wk·n), Wv·n)   with n = rmsnorm(x)
//             x = h + FFN(rmsnorm(h))      FFN = down(silu(gate) * up), or top-k experts
// llama.cpp's converter permutes Wq/Wk rows so that rope pairs neighbouring elements
// ("normal" style) instead of HF's two halves; checkpoints loaded directly keep HF's
// layout and rope with the halves (neox style) — the same rotation.
#include "formats/gguf.h"
#include "model/architecture.h"
#include "model/layers.h"

namespace kiln {

namespace llama_arch {

constexpr GlobalWeightSpec kGlobals[] = {
    {"token_embd.weight", &ModelWeights::tok_embd, Need::Required},
    {"output_norm.weight", &ModelWeights::output_norm, Need::Required},
    {"output.weight", &ModelWeights::output, Need::Optional},  // absent: tied to token_embd
    {"rope_freqs.weight", &ModelWeights::rope_freqs, Need::Optional},
};

constexpr LayerWeightSpec kLayer[] = {
    {"attn_norm.weight", &LayerWeights::attn_norm, Need::Required},
    {"attn_q.weight", &LayerWeights::wq, Need::Required},
    {"attn_k.weight", &LayerWeights::wk, Need::Required},
    {"attn_v.weight", &LayerWeights::wv, Need::Required},
    {"attn_output.weight", &LayerWeights::wo, Need::Required},
    {"attn_q.bias", &LayerWeights::bq, Need::Optional},
    {"attn_k.bias", &LayerWeights::bk, Need::Optional},
    {"attn_v.bias", &LayerWeights::bv, Need::Optional},
    {"attn_output.bias", &LayerWeights::bo, Need::Optional},
    {"ffn_norm.weight", &LayerWeights::ffn_norm, Need::Required},
    {"ffn_gate.weight", &LayerWeights::ffn_gate, Need::Dense},
    {"ffn_up.weight", &LayerWeights::ffn_up, Need::Dense},
    {"ffn_down.weight", &LayerWeights::ffn_down, Need::Dense},
    {"ffn_gate_inp.weight", &LayerWeights::moe_router, Need::Moe},
    {"ffn_gate_exps.weight", &LayerWeights::exp_gate, Need::Moe},
    {"ffn_up_exps.weight", &LayerWeights::exp_up, Need::Moe},
    {"ffn_down_exps.weight", &LayerWeights::exp_down, Need::Moe},
};

void configure(HParams& hp, const ModelSource& source) {
  // llama.cpp's converter permutes the rows of Wq/Wk so that rope pairs neighbours; a
  // Hugging Face checkpoint keeps them as trained, pairing the two halves of each head.
  hp.rope_style = source.format() == SourceFormat::HfCheckpoint ? RopeStyle::Neox : RopeStyle::Normal;
  // Mixtral: softmax over all experts, keep the top k, renormalize them — the same as a
  // softmax over the k chosen logits.
  hp.expert_gating = MoeGating::Softmax;
  hp.expert_weights_norm = true;
}

constexpr Architecture kArchitectures[] = {
    {"llama", configure, kGlobals, kLayer, forward_prenorm_silu},
};

}  // namespace llama_arch

std::span<const Architecture> llama_family() { return llama_arch::kArchitectures; }

}  // namespace kiln
