// Gemma 2. Differences from the llama decoder:
//   - the embedding is scaled by sqrt(n_embd);
//   - norms are "(1 + w)" in HF; llama.cpp's converter already adds the 1 to every norm
//     weight in the GGUF, so here they are plain RMSNorm weights;
//   - attention and FFN outputs are normed again before their residual adds
//     (post_attention_norm, post_ffw_norm);
//   - attention logits are soft-capped (attn_logit_softcapping), and so are the final logits;
//   - even layers attend within a sliding window, odd layers globally;
//   - the FFN uses gelu (tanh approximation); queries are scaled by
//     1/sqrt(query_pre_attn_scalar), which is head_dim for the released 2B/9B models
//     (`attention.scale` in the file overrides it);
//   - rope pairs the halves of each head (neox style).
#include <cmath>

#include "formats/gguf.h"
#include "model/architecture.h"
#include "model/layers.h"

namespace kiln {

namespace gemma2_arch {

constexpr GlobalWeightSpec kGlobals[] = {
    {"token_embd.weight", &ModelWeights::tok_embd, Need::Required},
    {"output_norm.weight", &ModelWeights::output_norm, Need::Required},
    {"output.weight", &ModelWeights::output, Need::Optional},  // normally tied
};

constexpr LayerWeightSpec kLayer[] = {
    {"attn_norm.weight", &LayerWeights::attn_norm, Need::Required},
    {"attn_q.weight", &LayerWeights::wq, Need::Required},
    {"attn_k.weight", &LayerWeights::wk, Need::Required},
    {"attn_v.weight", &LayerWeights::wv, Need::Required},
    {"attn_output.weight", &LayerWeights::wo, Need::Required},
    {"post_attention_norm.weight", &LayerWeights::post_attn_norm, Need::Required},
    {"ffn_norm.weight", &LayerWeights::ffn_norm, Need::Required},
    {"ffn_gate.weight", &LayerWeights::ffn_gate, Need::Required},
    {"ffn_up.weight", &LayerWeights::ffn_up, Need::Required},
    {"ffn_down.weight", &LayerWeights::ffn_down, Need::Required},
    {"post_ffw_norm.weight", &LayerWeights::post_ffn_norm, Need::Required},
};

void configure(HParams& hp, const ModelSource&) {
  hp.rope_style = RopeStyle::Neox;
  // Sliding window on every other layer, starting with layer 0.
  for (int il = 0; il < hp.n_layer; ++il) hp.layer_uses_window[size_t(il)] = hp.sliding_window > 0 && il % 2 == 0;
}

void forward(ForwardPass& p) {
  const HParams& hp = p.hp;
  Backend& be = p.backend;
  const GluParams gelu{Activation::GeluTanh};
  Tensor x = build_embedding(p);  // the residual stream, updated in place
  be.scale(x, std::sqrt(float(hp.n_embd)), x);
  p.observe(x, "inp_scaled");
  Tensor cur = p.scratch("cur", hp.n_embd, p.n_tokens);
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& lw = p.w.layers[size_t(il)];
    build_norm(p, x, lw.attn_norm, cur, "attn_norm", il);
    Tensor attn = build_attention(p, il, cur);
    build_norm(p, attn, lw.post_attn_norm, attn, "attn_post_norm", il);
    be.add_rmsnorm(attn, x, lw.ffn_norm, hp.rms_eps, cur);  // x += attn; cur = norm(x)
    p.observe(cur, "ffn_norm", il);
    Tensor ffn = build_ffn(p, il, cur, gelu);
    build_norm(p, ffn, lw.post_ffn_norm, ffn, "ffn_post_norm", il);
    be.add(x, ffn, x);
    p.observe(x, "l_out", il);
  }
  build_output(p, x);  // applies final_logit_softcapping
}

constexpr Architecture kArchitectures[] = {
    {"gemma2", configure, kGlobals, kLayer, forward},
};

}  // namespace gemma2_arch

std::span<const Architecture> gemma2_family() { return gemma2_arch::kArchitectures; }

}  // namespace kiln
