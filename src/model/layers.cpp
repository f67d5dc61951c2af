#include "model/layers.h"

namespace kiln {

Tensor build_embedding(ForwardPass& p) {
  Tensor x = p.scratch("inp_embd", p.hp.n_embd, p.n_tokens);
  p.backend.get_rows(p.w.tok_embd, p.tokens, x);
  p.observe(x, "inp_embd");
  return x;
}

void build_norm(ForwardPass& p, const Tensor& x, const Tensor& weight, Tensor& out, std::string_view name, int il) {
  p.backend.rmsnorm(x, weight, p.hp.rms_eps, out);
  p.observe(out, name, il);
}

namespace {

// Columns [begin, begin + count) of every row of a 2-D f32 tensor: a view with its row stride.
Tensor column_range(const Tensor& t, int64_t begin, int64_t count, std::string_view name) {
  KILN_CHECK(t.dtype == GgmlType::F32 && begin >= 0 && begin + count <= t.ne[0] && t.ne[2] == 1,
             "columns [{}, {}) of {} {}: out of range", begin, begin + count, t.name, t.describe());
  Tensor v = t;
  v.ne[0] = count;
  v.data = t.as<float>() + begin;
  v.name = name;
  return v;
}

// Rows {heads * head_dim, T} seen as heads {head_dim, heads, T}; the rows may be strided.
Tensor as_heads(const Tensor& rows, int64_t head_dim, int64_t heads) {
  if (rows.is_contiguous()) return rows.reshape({head_dim, heads, rows.ne[1]});
  KILN_CHECK(rows.ne[0] == head_dim * heads && rows.ne[2] == 1 && rows.nb[0] == sizeof(float),
             "{} {} is not {} heads of {}", rows.name, rows.describe(), heads, head_dim);
  Tensor h = rows;
  h.n_dims = 3;
  h.ne[0] = head_dim, h.ne[1] = heads, h.ne[2] = rows.ne[1], h.ne[3] = 1;
  h.nb[1] = size_t(head_dim) * sizeof(float), h.nb[2] = rows.nb[1], h.nb[3] = rows.nb[1] * size_t(rows.ne[1]);
  return h;
}

// Whether this pass's q/k/v (or gate/up) go into one buffer as neighbouring columns, so the
// backend can run their products as one (it prefers so for this many tokens). Not with a
// debug hook (it sees each intermediate as the packed tensor it always was).
bool joined_outputs(const ForwardPass& p) { return !p.hook && p.backend.prefers_joined_parts(p.n_tokens); }

struct QkvScratch {
  Tensor q, k, v;
};

// Per-head q/k norms keep packed heads (their prefill kernels take no token stride).
QkvScratch qkv_scratch(ForwardPass& p, const LayerWeights& lw) {
  const HParams& hp = p.hp;
  const int64_t nq = int64_t(hp.n_head) * hp.head_dim_k, nk = int64_t(hp.n_head_kv) * hp.head_dim_k,
                nv = int64_t(hp.n_head_kv) * hp.head_dim_v;
  if (joined_outputs(p) && lw.q_norm.empty() && lw.k_norm.empty()) {
    const Tensor all = p.scratch("qkv", nq + nk + nv, p.n_tokens);
    return {column_range(all, 0, nq, "q"), column_range(all, nq, nk, "k"), column_range(all, nq + nk, nv, "v")};
  }
  return {p.scratch("q", nq, p.n_tokens), p.scratch("k", nk, p.n_tokens), p.scratch("v", nv, p.n_tokens)};
}

struct GateUpScratch {
  Tensor gate, up;
};

GateUpScratch gate_up_scratch(ForwardPass& p, int64_t n_ff) {
  if (joined_outputs(p)) {
    const Tensor all = p.scratch("ffn_gate_up", 2 * n_ff, p.n_tokens);
    return {column_range(all, 0, n_ff, "ffn_gate"), column_range(all, n_ff, n_ff, "ffn_up")};
  }
  return {p.scratch("ffn_gate", n_ff, p.n_tokens), p.scratch("ffn_up", n_ff, p.n_tokens)};
}

void observe_qkv(ForwardPass& p, const QkvScratch& t, int il) {
  p.observe(t.q, "Qcur", il);
  p.observe(t.k, "Kcur", il);
  p.observe(t.v, "Vcur", il);
}

// Between the projections and the output projection: optional per-head q/k norms, rope,
// the cache store and attention. Returns {n_head * head_dim_v, T} ("kqv_out").
Tensor attend(ForwardPass& p, int il, QkvScratch& t) {
  const HParams& hp = p.hp;
  const LayerWeights& lw = p.w.layers[size_t(il)];
  const int64_t T = p.n_tokens;
  Backend& be = p.backend;

  // Heads as rows: {head_dim, heads, T}.
  Tensor q_heads = as_heads(t.q, hp.head_dim_k, hp.n_head);
  Tensor k_heads = as_heads(t.k, hp.head_dim_k, hp.n_head_kv);
  // The q/k norms go with the rope into one op, unless a hook watches the normed heads.
  const bool norms_with_rope = (!lw.q_norm.empty() || !lw.k_norm.empty()) && !p.hook;
  if (!norms_with_rope && !lw.q_norm.empty()) {
    be.rmsnorm(q_heads, lw.q_norm, hp.rms_eps, q_heads);
    p.observe(t.q, "Qcur_normed", il);
  }
  if (!norms_with_rope && !lw.k_norm.empty()) {
    be.rmsnorm(k_heads, lw.k_norm, hp.rms_eps, k_heads);
    p.observe(t.k, "Kcur_normed", il);
  }

  RopeParams rope;
  rope.style = hp.rope_style;
  rope.n_rot = hp.n_rot;
  rope.freq_base = hp.rope_base;
  rope.freq_scale = hp.rope_freq_scale;
  rope.freq_factors = p.w.rope_freqs.empty() ? nullptr : &p.w.rope_freqs;
  rope.yarn = hp.yarn;
  KvLayer cache = p.cache.layer(il);
  if (norms_with_rope)
    be.norm_rope_kv_store(q_heads, k_heads, t.v, lw.q_norm, lw.k_norm, hp.rms_eps, p.index.positions, rope, cache,
                          p.index.slots);
  else
    be.rope_kv_store(q_heads, k_heads, t.v, p.index.positions, rope, cache, p.index.slots);
  p.observe(t.q, "Qcur_rope", il);
  p.observe(t.k, "Kcur_rope", il);

  AttentionParams ap;
  ap.n_head = hp.n_head;
  ap.n_head_kv = hp.n_head_kv;
  ap.head_dim_k = hp.head_dim_k;
  ap.head_dim_v = hp.head_dim_v;
  ap.scale = hp.attention_scale();
  ap.softcap = hp.attn_softcap;
  ap.sliding_window = hp.uses_window(il) ? hp.sliding_window : 0;
  ap.sinks = lw.attn_sinks.empty() ? nullptr : &lw.attn_sinks;
  Tensor attn = p.scratch("attn", int64_t(hp.n_head) * hp.head_dim_v, T);
  be.attention(t.q, cache, p.index, ap, attn);
  p.observe(attn, "kqv_out", il);
  return attn;
}

}  // namespace

Tensor build_attention(ForwardPass& p, int il, const Tensor& x) {
  const LayerWeights& lw = p.w.layers[size_t(il)];
  QkvScratch t = qkv_scratch(p, lw);
  const Backend::MatmulPart qkv[] = {{&lw.wq, &lw.bq, &t.q}, {&lw.wk, &lw.bk, &t.k}, {&lw.wv, &lw.bv, &t.v}};
  p.backend.matmul_parts(x, qkv);  // one launch on backends that can
  observe_qkv(p, t, il);
  const Tensor attn = attend(p, il, t);
  Tensor out = p.scratch("attn_out", p.hp.n_embd, p.n_tokens);
  p.backend.matmul(attn, lw.wo, lw.bo, out);
  p.observe(out, "attn_out", il);
  return out;
}

Tensor build_ffn(ForwardPass& p, int il, const Tensor& x, const GluParams& act) {
  const LayerWeights& lw = p.w.layers[size_t(il)];
  GateUpScratch s = gate_up_scratch(p, lw.ffn_gate.ne[1]);
  Tensor& gate = s.gate;
  const Backend::MatmulPart gate_up[] = {{&lw.ffn_gate, &lw.ffn_gate_b, &gate}, {&lw.ffn_up, &lw.ffn_up_b, &s.up}};
  p.backend.matmul_parts(x, gate_up);
  p.backend.glu(gate, s.up, act, gate);
  p.observe(gate, "ffn_act", il);
  Tensor out = p.scratch("ffn_out", p.hp.n_embd, p.n_tokens);
  p.backend.matmul(gate, lw.ffn_down, lw.ffn_down_b, out);
  p.observe(out, "ffn_out", il);
  return out;
}

namespace {

// The routed experts over x with ids and weights chosen (see build_moe).
Tensor run_experts(ForwardPass& p, int il, const Tensor& x, const Tensor& ids, const Tensor& weights,
                   const GluParams& act, Tensor* residual) {
  const LayerWeights& lw = p.w.layers[size_t(il)];
  ExpertWeights experts{lw.exp_gate, lw.exp_up, lw.exp_down, lw.exp_gate_b, lw.exp_up_b, lw.exp_down_b};
  Tensor out = p.scratch("ffn_moe_out", p.hp.n_embd, p.n_tokens);
  if (residual)
    p.backend.moe_ffn_add(x, experts, ids, weights, act, out, *residual);
  else
    p.backend.moe_ffn(x, experts, ids, weights, act, out);
  p.observe(out, "ffn_moe_out", il);
  return out;
}

// The router's logits and the routing's choice for every token of the pass.
struct Routing {
  Tensor logits, ids, weights;
};

Routing routing_scratch(ForwardPass& p, const LayerWeights& lw, const MoeRouteParams& route) {
  return {p.scratch("ffn_moe_logits", lw.moe_router.ne[1], p.n_tokens),
          p.scratch("ffn_moe_ids", route.n_used, p.n_tokens, GgmlType::I32),
          p.scratch("ffn_moe_weights", route.n_used, p.n_tokens)};
}

}  // namespace

Tensor build_moe(ForwardPass& p, int il, const Tensor& x, const MoeRouteParams& route, const GluParams& act,
                 Tensor* residual) {
  const LayerWeights& lw = p.w.layers[size_t(il)];
  Routing r = routing_scratch(p, lw, route);
  p.backend.matmul(x, lw.moe_router, lw.moe_router_b, r.logits);
  p.observe(r.logits, "ffn_moe_logits", il);
  p.backend.moe_route(r.logits, route, r.ids, r.weights);
  p.observe(r.weights, "ffn_moe_weights", il);
  return run_experts(p, il, x, r.ids, r.weights, act, residual);
}

Tensor build_norm_moe(ForwardPass& p, int il, const Tensor& x, Tensor& normed, const MoeRouteParams& route,
                      const GluParams& act, Tensor* residual) {
  const LayerWeights& lw = p.w.layers[size_t(il)];
  Routing r = routing_scratch(p, lw, route);
  p.backend.rmsnorm_moe_route(x, lw.ffn_norm, p.hp.rms_eps, normed, lw.moe_router, lw.moe_router_b, route, r.logits,
                              r.ids, r.weights);
  p.observe(normed, "ffn_norm", il);
  p.observe(r.logits, "ffn_moe_logits", il);
  p.observe(r.weights, "ffn_moe_weights", il);
  return run_experts(p, il, normed, r.ids, r.weights, act, residual);
}

void forward_prenorm_silu(ForwardPass& p) {
  const HParams& hp = p.hp;
  const GluParams silu{Activation::Silu};
  const MoeRouteParams route{hp.n_expert_used, hp.expert_gating, hp.expert_weights_norm, hp.expert_weights_scale};
  Tensor x = build_embedding(p);  // the residual stream, updated in place
  build_prenorm_layers(p, x, silu, route);
  build_output(p, x);
}

void build_output(ForwardPass& p, const Tensor& x) {
  if (p.n_outputs == 0) return;
  Tensor rows = p.scratch("out_rows", p.hp.n_embd, p.n_outputs);
  if (p.n_outputs == p.n_tokens) {
    // Every row, in order (a decode step): no gather, and the norm may run inside the head's
    // product (one launch where the backend fuses them).
    const Tensor no_bias;
    const Backend::MatmulPart head[] = {{&p.w.lm_head(), &no_bias, &p.logits}};
    p.backend.rmsnorm_matmul_parts(x, p.w.output_norm, p.hp.rms_eps, rows, head);
    p.observe(rows, "result_norm");
  } else {
    p.backend.get_rows(x, p.output_rows, rows);
    p.backend.rmsnorm(rows, p.w.output_norm, p.hp.rms_eps, rows);
    p.observe(rows, "result_norm");
    p.backend.matmul(rows, p.w.lm_head(), Tensor{}, p.logits);
  }
  if (p.hp.final_softcap > 0) p.backend.softcap(p.logits, p.hp.final_softcap, p.logits);
  p.observe(p.logits, "result_output");
}

void build_prenorm_layers(ForwardPass& p, Tensor& x, const GluParams& act, const MoeRouteParams& route) {
  const HParams& hp = p.hp;
  const float eps = hp.rms_eps;
  Backend& be = p.backend;
  Tensor cur = p.scratch("cur", hp.n_embd, p.n_tokens);
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& lw = p.w.layers[size_t(il)];

    // x += attention(norm(x)): the norm computed with the q/k/v products, the residual
    // add with the output projection.
    QkvScratch t = qkv_scratch(p, lw);
    const Backend::MatmulPart qkv[] = {{&lw.wq, &lw.bq, &t.q}, {&lw.wk, &lw.bk, &t.k}, {&lw.wv, &lw.bv, &t.v}};
    be.rmsnorm_matmul_parts(x, lw.attn_norm, eps, cur, qkv);
    p.observe(cur, "attn_norm", il);
    observe_qkv(p, t, il);
    const Tensor attn = attend(p, il, t);
    Tensor attn_out = p.scratch("attn_out", hp.n_embd, p.n_tokens);
    be.matmul_add(attn, lw.wo, lw.bo, attn_out, x);
    p.observe(attn_out, "attn_out", il);

    // x += ffn(norm(x)), likewise for a gated MLP; routed experts on layers with a router.
    if (lw.moe_router.empty()) {
      GateUpScratch s = gate_up_scratch(p, lw.ffn_gate.ne[1]);
      Tensor& gate = s.gate;
      const Backend::MatmulPart gate_up[] = {{&lw.ffn_gate, &lw.ffn_gate_b, &gate}, {&lw.ffn_up, &lw.ffn_up_b, &s.up}};
      be.rmsnorm_matmul_parts(x, lw.ffn_norm, eps, cur, gate_up);
      p.observe(cur, "ffn_norm", il);
      Tensor out = p.scratch("ffn_out", hp.n_embd, p.n_tokens);
      if (p.hook) {
        be.glu(gate, s.up, act, gate);
        p.observe(gate, "ffn_act", il);
        be.matmul_add(gate, lw.ffn_down, lw.ffn_down_b, out, x);
      } else {  // only the down product reads the activation: it may take it in its own format
        be.glu_matmul_add(gate, s.up, act, gate, lw.ffn_down, lw.ffn_down_b, out, x);
      }
      p.observe(out, "ffn_out", il);
    } else {
      build_norm_moe(p, il, x, cur, route, act, &x);
    }
    p.observe(x, "l_out", il);
  }
}

}  // namespace kiln
