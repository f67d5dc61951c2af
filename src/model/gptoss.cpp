// gpt-oss. A pre-norm decoder with routed experts only; what sets it apart:
//   - attention sinks: a learned logit per head joins each softmax's denominator (a
//     virtual key whose value is zero), so a head can attend to "nothing";
//   - layers alternate sliding-window (even layers, window `attention.sliding_window`) and
//     full attention;
//   - q/k/v/o projections carry biases; rope pairs halves (neox) with YaRN scaling;
//   - the router has a bias and takes a softmax over the top-k logits only;
//   - experts carry biases and use the clamped SwiGLU:
//       gate <= limit, |up| <= limit, out = gate * sigmoid(alpha * gate) * (up + 1)
//     with alpha 1.702 and limit 7 (the released models' constants).
#include "formats/gguf.h"
#include "model/architecture.h"
#include "model/layers.h"

namespace kiln {

namespace gptoss_arch {

constexpr GlobalWeightSpec kGlobals[] = {
    {"token_embd.weight", &ModelWeights::tok_embd, Need::Required},
    {"output_norm.weight", &ModelWeights::output_norm, Need::Required},
    {"output.weight", &ModelWeights::output, Need::Optional},
};

constexpr LayerWeightSpec kLayer[] = {
    {"attn_norm.weight", &LayerWeights::attn_norm, Need::Required},
    {"attn_q.weight", &LayerWeights::wq, Need::Required},
    {"attn_k.weight", &LayerWeights::wk, Need::Required},
    {"attn_v.weight", &LayerWeights::wv, Need::Required},
    {"attn_output.weight", &LayerWeights::wo, Need::Required},
    {"attn_q.bias", &LayerWeights::bq, Need::Required},
    {"attn_k.bias", &LayerWeights::bk, Need::Required},
    {"attn_v.bias", &LayerWeights::bv, Need::Required},
    {"attn_output.bias", &LayerWeights::bo, Need::Required},
    {"attn_sinks.weight", &LayerWeights::attn_sinks, Need::Required},
    {"post_attention_norm.weight", &LayerWeights::ffn_norm, Need::Required},
    {"ffn_gate_inp.weight", &LayerWeights::moe_router, Need::Required},
    {"ffn_gate_inp.bias", &LayerWeights::moe_router_b, Need::Required},
    {"ffn_gate_exps.weight", &LayerWeights::exp_gate, Need::Required},
    {"ffn_up_exps.weight", &LayerWeights::exp_up, Need::Required},
    {"ffn_down_exps.weight", &LayerWeights::exp_down, Need::Required},
    {"ffn_gate_exps.bias", &LayerWeights::exp_gate_b, Need::Required},
    {"ffn_up_exps.bias", &LayerWeights::exp_up_b, Need::Required},
    {"ffn_down_exps.bias", &LayerWeights::exp_down_b, Need::Required},
};

void configure(HParams& hp, const ModelSource&) {
  hp.rope_style = RopeStyle::Neox;
  // HF computes YaRN's ramp between the exact correction dimensions (rope_scaling
  // "truncate": false for gpt-oss), where ggml rounds them to whole dimensions.
  hp.yarn.truncate = false;
  hp.expert_gating = MoeGating::SoftmaxTopK;
  hp.expert_weights_norm = false;
  for (int il = 0; il < hp.n_layer; ++il) hp.layer_uses_window[size_t(il)] = hp.sliding_window > 0 && il % 2 == 0;
}

void forward(ForwardPass& p) {
  const HParams& hp = p.hp;
  const GluParams swiglu{Activation::SwigluOai, 1.702f, 7.0f};
  const MoeRouteParams route{hp.n_expert_used, hp.expert_gating, hp.expert_weights_norm, hp.expert_weights_scale};
  Tensor x = build_embedding(p);  // the residual stream, updated in place
  Tensor cur = p.scratch("cur", hp.n_embd, p.n_tokens);
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& lw = p.w.layers[size_t(il)];
    build_norm(p, x, lw.attn_norm, cur, "attn_norm", il);
    Tensor attn = build_attention(p, il, cur);  // biases, sinks and the window come from the weights and hparams
    p.backend.add_rmsnorm(attn, x, lw.ffn_norm, hp.rms_eps, cur);  // x += attn; cur = norm(x)
    p.observe(cur, "attn_post_norm", il);
    build_moe(p, il, cur, route, swiglu, &x);  // x += experts(cur)
    p.observe(x, "l_out", il);
  }
  build_output(p, x);
}

constexpr Architecture kArchitectures[] = {
    {"gpt-oss", configure, kGlobals, kLayer, forward},
};

}  // namespace gptoss_arch

std::span<const Architecture> gptoss_family() { return gptoss_arch::kArchitectures; }

}  // namespace kiln
