// The Qwen3-Next family of hybrid models: Qwen3-Next (routed experts + a gated shared
// expert) and Qwen3.5 (dense FFN). Three of every four layers (`full_attention_interval`)
// are GatedDeltaNet linear attention with per-sequence recurrent state; the fourth is
// gated full attention. Per layer:
//   h = x + Mix(rmsnorm(x))     Mix = GatedDeltaNet or gated attention
//   x = h + FFN(rmsnorm(h))     FFN = experts + sigmoid(w_s . n) * shared expert, or dense
//
// GatedDeltaNet (HF Qwen3NextGatedDeltaNet):
//   q|k|v = Wqkv n  -> causal conv (kernel 4) -> SiLU -> split; z = Wz n
//   beta = sigmoid(Wb n), decay = exp(-exp(A_log) softplus(Wa n + dt_bias))
//   o = delta rule (q, k l2-normalised, q / sqrt(d_k));  out = Wout (rmsnorm(o) * w * silu(z))
// Gated attention: Wq yields, per head, the query and then a gate of head_dim each;
// q and k get per-head RMSNorm; rope turns only the first n_rot dims (partial rotary,
// halves paired: neox); the attention output is multiplied by sigmoid(gate).
//
// Facts of llama.cpp's converter that this file relies on (checked against the HF
// checkpoint of the test model):
//   - in_proj_qkvz is split into attn_qkv (all q heads, all k heads, all v heads: the
//     conv's channel order) and attn_gate (z); in_proj_ba stays as ssm_ba, per key-head
//     group [b for its value heads, a for its value heads];
//   - ssm_a holds -exp(A_log); the (1 + w) RMSNorm weights already include the 1 (the
//     gated norm's weight is plain);
//   - Qwen3.5 files store the value heads tiled (value head h reads key head
//     h % n_k_heads); Qwen3-Next files keep HF's grouping (h / (n_v / n_k)).
#include "formats/gguf.h"
#include "model/architecture.h"
#include "model/layers.h"

namespace kiln {

namespace qwen3next_arch {

constexpr GlobalWeightSpec kGlobals[] = {
    {"token_embd.weight", &ModelWeights::tok_embd, Need::Required},
    {"output_norm.weight", &ModelWeights::output_norm, Need::Required},
    {"output.weight", &ModelWeights::output, Need::Optional},  // absent: tied embeddings
};

// Both layer kinds share one table; which set a layer has is checked per layer
// (check_layer), since the loader's needs cannot say "one kind or the other".
constexpr LayerWeightSpec kLayer[] = {
    {"attn_norm.weight", &LayerWeights::attn_norm, Need::Required},
    {"post_attention_norm.weight", &LayerWeights::ffn_norm, Need::Required},
    // gated full attention
    {"attn_q.weight", &LayerWeights::wq, Need::Optional},
    {"attn_k.weight", &LayerWeights::wk, Need::Optional},
    {"attn_v.weight", &LayerWeights::wv, Need::Optional},
    {"attn_output.weight", &LayerWeights::wo, Need::Optional},
    {"attn_q_norm.weight", &LayerWeights::q_norm, Need::Optional},
    {"attn_k_norm.weight", &LayerWeights::k_norm, Need::Optional},
    // GatedDeltaNet
    {"attn_qkv.weight", &LayerWeights::ssm_qkv, Need::Optional},
    {"attn_gate.weight", &LayerWeights::ssm_z, Need::Optional},
    {"ssm_conv1d.weight", &LayerWeights::ssm_conv, Need::Optional},
    {"ssm_a", &LayerWeights::ssm_a, Need::Optional},
    {"ssm_dt.bias", &LayerWeights::ssm_dt_bias, Need::Optional},
    {"ssm_ba.weight", &LayerWeights::ssm_ba, Need::Optional},        // qwen3next
    {"ssm_beta.weight", &LayerWeights::ssm_beta, Need::Optional},    // qwen35
    {"ssm_alpha.weight", &LayerWeights::ssm_alpha, Need::Optional},  // qwen35
    {"ssm_norm.weight", &LayerWeights::ssm_norm, Need::Optional},
    {"ssm_out.weight", &LayerWeights::ssm_out, Need::Optional},
    // feed-forward: dense (qwen35) or routed + shared experts (qwen3next)
    {"ffn_gate.weight", &LayerWeights::ffn_gate, Need::Dense},
    {"ffn_up.weight", &LayerWeights::ffn_up, Need::Dense},
    {"ffn_down.weight", &LayerWeights::ffn_down, Need::Dense},
    {"ffn_gate_inp.weight", &LayerWeights::moe_router, Need::Moe},
    {"ffn_gate_exps.weight", &LayerWeights::exp_gate, Need::Moe},
    {"ffn_up_exps.weight", &LayerWeights::exp_up, Need::Moe},
    {"ffn_down_exps.weight", &LayerWeights::exp_down, Need::Moe},
    {"ffn_gate_inp_shexp.weight", &LayerWeights::shexp_router, Need::Optional},
    {"ffn_gate_shexp.weight", &LayerWeights::shexp_gate, Need::Optional},
    {"ffn_up_shexp.weight", &LayerWeights::shexp_up, Need::Optional},
    {"ffn_down_shexp.weight", &LayerWeights::shexp_down, Need::Optional},
};

void configure(HParams& hp, const ModelSource& source) {
  auto key = [&](const char* suffix) { return hp.arch + "." + suffix; };
  hp.rope_style = RopeStyle::Neox;
  // Experts: softmax over all, top k, renormalized (HF norm_topk_prob).
  hp.expert_gating = MoeGating::Softmax;
  hp.expert_weights_norm = source.get_bool(key("expert_weights_norm"), true);

  HParams::LinearAttention& la = hp.linear;
  la.conv_kernel = int(source.get_int(key("ssm.conv_kernel")));
  la.n_k_heads = int(source.get_int(key("ssm.group_count")));
  la.n_v_heads = int(source.get_int(key("ssm.time_step_rank")));
  la.head_dim_k = int(source.get_int(key("ssm.state_size")));
  const int inner = int(source.get_int(key("ssm.inner_size")));
  KILN_CHECK(la.conv_kernel >= 2 && la.n_k_heads > 0 && la.n_v_heads > 0 && la.n_v_heads % la.n_k_heads == 0 &&
                 la.head_dim_k > 0 && inner > 0 && inner % la.n_v_heads == 0,
             "{}: linear attention of {} key heads, {} value heads, state {}, inner size {}, conv kernel {}", hp.arch,
             la.n_k_heads, la.n_v_heads, la.head_dim_k, inner, la.conv_kernel);
  la.head_dim_v = inner / la.n_v_heads;
  const int interval = int(source.get_int(key("full_attention_interval"), 4));
  KILN_CHECK(interval > 0, "{}: full_attention_interval {}", hp.arch, interval);
  la.layer_is_recurrent.resize(size_t(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) la.layer_is_recurrent[size_t(il)] = (il + 1) % interval != 0;
}

// Throws, naming the tensor, when layer il lacks a weight its kind needs.
void check_layer(const ForwardPass& p, int il, bool recurrent) {
  const LayerWeights& lw = p.w.layers[size_t(il)];
  auto need = [&](const Tensor& t, const char* name) {
    KILN_CHECK(!t.empty(), "{}: layer {} ({}) lacks blk.{}.{}", p.hp.arch, il,
               recurrent ? "linear attention" : "full attention", il, name);
  };
  if (recurrent) {
    need(lw.ssm_qkv, "attn_qkv.weight"), need(lw.ssm_z, "attn_gate.weight"), need(lw.ssm_conv, "ssm_conv1d.weight");
    need(lw.ssm_a, "ssm_a"), need(lw.ssm_dt_bias, "ssm_dt.bias"), need(lw.ssm_norm, "ssm_norm.weight");
    need(lw.ssm_out, "ssm_out.weight");
    if (lw.ssm_ba.empty()) need(lw.ssm_beta, "ssm_beta.weight"), need(lw.ssm_alpha, "ssm_alpha.weight");
  } else {
    need(lw.wq, "attn_q.weight"), need(lw.wk, "attn_k.weight"), need(lw.wv, "attn_v.weight");
    need(lw.wo, "attn_output.weight"), need(lw.q_norm, "attn_q_norm.weight"), need(lw.k_norm, "attn_k_norm.weight");
  }
}

// A strided 3-D view {n0, n1, T} into the rows of a 2-D activation t {width, T}: element
// (i0, i1, t) at t's row t, column offset + i1 * stride + i0.
Tensor strided_view(const Tensor& t, int64_t offset, int64_t n0, int64_t n1, int64_t stride) {
  Tensor v = t;
  v.n_dims = 3;
  v.ne[0] = n0, v.ne[1] = n1, v.ne[2] = t.ne[1], v.ne[3] = 1;
  v.nb[0] = sizeof(float);
  v.nb[1] = size_t(stride) * sizeof(float);
  v.nb[2] = t.nb[1];
  v.nb[3] = t.nb[1] * size_t(t.ne[1]);
  v.data = static_cast<float*>(t.data) + offset;
  return v;
}

// Columns [offset, offset + width) of every row of t {W, T}, as {width, T}.
Tensor column_slice(const Tensor& t, int64_t offset, int64_t width) {
  Tensor v = t;
  v.ne[0] = width;
  v.data = static_cast<float*>(t.data) + offset;
  return v;
}

Tensor build_delta_net(ForwardPass& p, int il, const Tensor& x, bool tiled_heads) {
  const HParams::LinearAttention& la = p.hp.linear;
  const LayerWeights& lw = p.w.layers[size_t(il)];
  Backend& be = p.backend;
  const int64_t T = p.n_tokens;
  const int64_t key_width = int64_t(la.n_k_heads) * la.head_dim_k;
  const int64_t value_width = int64_t(la.n_v_heads) * la.head_dim_v;
  const int64_t channels = 2 * key_width + value_width;

  Tensor qkv = p.scratch("dn_qkv", channels, T);
  be.matmul(x, lw.ssm_qkv, Tensor{}, qkv);
  p.observe(qkv, "linear_attn_qkv_mixed", il);
  Tensor z = p.scratch("dn_z", value_width, T);
  be.matmul(x, lw.ssm_z, Tensor{}, z);
  p.observe(z, "z", il);

  // beta and alpha logits per value head, as {n0, n1, T} views (head h at (h % n0, h / n0)).
  Tensor beta, alpha;
  if (!lw.ssm_ba.empty()) {
    // Per key-head group g: [b of its r value heads, a of its r value heads].
    const int64_t r = la.n_v_heads / la.n_k_heads;
    Tensor ba = p.scratch("dn_ba", 2 * la.n_v_heads, T);
    be.matmul(x, lw.ssm_ba, Tensor{}, ba);
    beta = strided_view(ba, 0, r, la.n_k_heads, 2 * r);
    alpha = strided_view(ba, r, r, la.n_k_heads, 2 * r);
  } else {
    Tensor b = p.scratch("dn_beta", la.n_v_heads, T), a = p.scratch("dn_alpha", la.n_v_heads, T);
    be.matmul(x, lw.ssm_beta, Tensor{}, b);
    be.matmul(x, lw.ssm_alpha, Tensor{}, a);
    beta = strided_view(b, 0, la.n_v_heads, 1, la.n_v_heads);
    alpha = strided_view(a, 0, la.n_v_heads, 1, la.n_v_heads);
  }

  RecurrentLayer state = p.cache.recurrent_layer(il);
  Tensor conv = p.scratch("dn_conv", channels, T);
  be.causal_conv_silu(qkv, lw.ssm_conv, state.conv, p.index, conv);
  p.observe(conv, "conv_output_silu", il);

  DeltaRuleParams params;
  params.n_k_heads = la.n_k_heads;
  params.n_v_heads = la.n_v_heads;
  params.head_dim_k = la.head_dim_k;
  params.head_dim_v = la.head_dim_v;
  params.tiled_heads = tiled_heads;
  Tensor core = p.scratch("dn_core", value_width, T);
  be.gated_delta_rule(column_slice(conv, 0, key_width), column_slice(conv, key_width, key_width),
                      column_slice(conv, 2 * key_width, value_width), alpha, beta, lw.ssm_a, lw.ssm_dt_bias,
                      state.delta, p.index, params, core);
  p.observe(core, "delta_net_out", il);

  Tensor core_heads = core.reshape({la.head_dim_v, la.n_v_heads, T});
  be.rmsnorm_gated(core_heads, z.reshape({la.head_dim_v, la.n_v_heads, T}), lw.ssm_norm, p.hp.rms_eps, core_heads);
  p.observe(core, "final_output", il);

  Tensor out = p.scratch("dn_proj", p.hp.n_embd, T);
  be.matmul(core, lw.ssm_out, Tensor{}, out);
  p.observe(out, "linear_attn_out", il);
  return out;
}

Tensor build_gated_attention(ForwardPass& p, int il, const Tensor& x) {
  const HParams& hp = p.hp;
  const LayerWeights& lw = p.w.layers[size_t(il)];
  Backend& be = p.backend;
  const int64_t T = p.n_tokens, hd = hp.head_dim_k;

  // Per head: hd query values, then hd gate values.
  Tensor qg = p.scratch("q_gate", 2 * hd * hp.n_head, T);
  Tensor k = p.scratch("k", int64_t(hp.n_head_kv) * hd, T);
  Tensor v = p.scratch("v", int64_t(hp.n_head_kv) * hp.head_dim_v, T);
  be.matmul(x, lw.wq, Tensor{}, qg);
  be.matmul(x, lw.wk, Tensor{}, k);
  be.matmul(x, lw.wv, Tensor{}, v);
  p.observe(qg, "Qcur_full", il);

  Tensor q = p.scratch("q", hd * hp.n_head, T);
  Tensor q_heads = q.reshape({hd, hp.n_head, T});
  Tensor k_heads = k.reshape({hd, hp.n_head_kv, T});
  be.rmsnorm(strided_view(qg, 0, hd, hp.n_head, 2 * hd), lw.q_norm, hp.rms_eps, q_heads);
  be.rmsnorm(k_heads, lw.k_norm, hp.rms_eps, k_heads);

  RopeParams rope;
  rope.style = hp.rope_style;
  rope.n_rot = hp.n_rot;  // partial rotary: the rest of each head passes unrotated
  rope.freq_base = hp.rope_base;
  rope.freq_scale = hp.rope_freq_scale;
  rope.yarn = hp.yarn;
  be.rope(q_heads, p.index.positions, rope);
  be.rope(k_heads, p.index.positions, rope);
  p.observe(q, "Qcur", il);
  p.observe(k, "Kcur", il);

  KvLayer cache = p.cache.layer(il);
  be.kv_store(k, v, cache, p.index.slots);
  AttentionParams ap;
  ap.n_head = hp.n_head;
  ap.n_head_kv = hp.n_head_kv;
  ap.head_dim_k = int(hd);
  ap.head_dim_v = hp.head_dim_v;
  ap.scale = hp.attention_scale();
  Tensor attn = p.scratch("attn", int64_t(hp.n_head) * hp.head_dim_v, T);
  be.attention(q, cache, p.index, ap, attn);
  p.observe(attn, "attn_pregate", il);

  Tensor attn_heads = attn.reshape({hp.head_dim_v, hp.n_head, T});
  be.sigmoid_mul(attn_heads, strided_view(qg, hd, hd, hp.n_head, 2 * hd), attn_heads);
  p.observe(attn, "attn_gated", il);

  Tensor out = p.scratch("attn_out", hp.n_embd, T);
  be.matmul(attn, lw.wo, Tensor{}, out);
  p.observe(out, "attn_output", il);
  return out;
}

// Routed experts plus the shared expert scaled by sigmoid(shexp_router . x).
Tensor build_experts(ForwardPass& p, int il, const Tensor& x) {
  const HParams& hp = p.hp;
  const LayerWeights& lw = p.w.layers[size_t(il)];
  Backend& be = p.backend;
  const GluParams silu{Activation::Silu};
  const MoeRouteParams route{hp.n_expert_used, hp.expert_gating, hp.expert_weights_norm, hp.expert_weights_scale};
  Tensor out = build_moe(p, il, x, route, silu);
  if (lw.shexp_up.empty()) return out;

  KILN_CHECK(!lw.shexp_gate.empty() && !lw.shexp_down.empty() && !lw.shexp_router.empty(),
             "{}: layer {} has a partial shared expert (gate, up, down and ffn_gate_inp_shexp are needed)", hp.arch,
             il);
  const int64_t n_ff = lw.shexp_up.ne[1];
  Tensor gate = p.scratch("shexp_gate", n_ff, p.n_tokens);
  Tensor up = p.scratch("shexp_up", n_ff, p.n_tokens);
  be.matmul(x, lw.shexp_gate, Tensor{}, gate);
  be.matmul(x, lw.shexp_up, Tensor{}, up);
  be.glu(gate, up, silu, gate);
  Tensor shared = p.scratch("shexp_out", hp.n_embd, p.n_tokens);
  be.matmul(gate, lw.shexp_down, Tensor{}, shared);
  Tensor weight = p.scratch("shexp_weight", 1, p.n_tokens);
  be.matmul(x, lw.shexp_router, Tensor{}, weight);
  be.sigmoid_mul(shared, weight, shared);
  p.observe(shared, "ffn_shexp_gated", il);
  be.add(out, shared, out);
  p.observe(out, "ffn_out", il);
  return out;
}

void forward(ForwardPass& p, bool tiled_heads) {
  const HParams& hp = p.hp;
  Tensor x = build_embedding(p);  // the residual stream, updated in place
  Tensor cur = p.scratch("cur", hp.n_embd, p.n_tokens);
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& lw = p.w.layers[size_t(il)];
    const bool recurrent = hp.linear.layer_is_recurrent[size_t(il)];
    check_layer(p, il, recurrent);
    build_norm(p, x, lw.attn_norm, cur, "attn_norm", il);
    Tensor mix = recurrent ? build_delta_net(p, il, cur, tiled_heads) : build_gated_attention(p, il, cur);
    p.backend.add_rmsnorm(mix, x, lw.ffn_norm, hp.rms_eps, cur);  // x += mix; cur = norm(x)
    p.observe(cur, "attn_post_norm", il);
    Tensor ffn = lw.moe_router.empty() ? build_ffn(p, il, cur, GluParams{Activation::Silu}) : build_experts(p, il, cur);
    p.backend.add(x, ffn, x);
    p.observe(x, "l_out", il);
  }
  build_output(p, x);
}

void forward_qwen3next(ForwardPass& p) { forward(p, /*tiled_heads=*/false); }
void forward_qwen35(ForwardPass& p) { forward(p, /*tiled_heads=*/true); }

constexpr Architecture kArchitectures[] = {
    {"qwen3next", configure, kGlobals, kLayer, forward_qwen3next},
    {"qwen35", configure, kGlobals, kLayer, forward_qwen35},
};

}  // namespace qwen3next_arch

std::span<const Architecture> qwen3next_family() { return qwen3next_arch::kArchitectures; }

}  // namespace kiln
