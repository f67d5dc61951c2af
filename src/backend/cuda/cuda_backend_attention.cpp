// The CUDA backend's rope, KV-cache and attention ops: argument checks on the host, then
// launch closures for the step recorder (as cuda_backend_ops.cpp). In decode, rope and the
// cache store run as one kernel (with the q/k head norms when the model has them) or inside
// the q/k/v products' epilogue; a one-token decode with head norms runs them inside the
// decode attention kernel instead. Attention picks the tensor-core prefill kernel, the split
// decode kernel or the general one.
#include <string>
#include <tuple>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_checks.h"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_extra.h"
#include "backend/cuda/prefill_attention.h"
#include "backend/cuda/rope_store.h"
#include "backend/op_checks.h"

namespace kiln {

using namespace cuda_ops;

namespace {

cuda::RopeArgs rope_args(Tensor& x, const Tensor& positions, const RopeParams& p) {
  require_f32(x, "rope", "x");
  KILN_CHECK(positions.dtype == GgmlType::I32 && positions.elements() == x.ne[2],
             "cuda rope: {} positions for {} tokens", positions.elements(), x.ne[2]);
  cuda::RopeArgs a;
  a.x = x.as<float>();
  a.token_stride = int64_t(x.nb[2] / 4), a.head_stride = int64_t(x.nb[1] / 4);
  a.n_tokens = x.ne[2], a.n_heads = x.ne[1], a.head_dim = x.ne[0];
  a.positions = positions.as<int32_t>();
  a.n_rot = p.n_rot, a.neox = p.style == RopeStyle::Neox;
  a.freq_base = p.freq_base, a.freq_scale = p.freq_scale;
  if (p.freq_factors) {
    require_f32(*p.freq_factors, "rope", "freq_factors");
    a.freq_factors = p.freq_factors->as<float>();
  }
  a.ext_factor = p.yarn.ext_factor, a.attn_factor = p.yarn.attn_factor;
  a.beta_fast = p.yarn.beta_fast, a.beta_slow = p.yarn.beta_slow, a.n_ctx_orig = p.yarn.n_ctx_orig;
  a.yarn_truncate = p.yarn.truncate;
  return a;
}

void hash_rope(Sig& sig, const RopeParams& p, const cuda::RopeArgs& a) {
  sig.v(a.freq_factors).v(p.n_rot).v(p.style).v(p.freq_base).v(p.freq_scale);
  sig.v(p.yarn.ext_factor).v(p.yarn.attn_factor).v(p.yarn.beta_fast).v(p.yarn.beta_slow).v(p.yarn.n_ctx_orig).v(p.yarn.truncate);
}

cuda::KvStoreArgs kv_store_args(const Tensor& k, const Tensor& v, KvLayer& cache, const Tensor& slots) {
  require_f32(k, "kv_store", "k");
  require_f32(v, "kv_store", "v");
  require_cache(cache, "kv_store");
  KILN_CHECK(k.ne[0] == cache.k.ne[0] && v.ne[0] == cache.v.ne[0],
             "cuda kv_store: k {} / v {} rows do not match the cache's {} / {}", k.describe(), v.describe(),
             cache.k.ne[0], cache.v.ne[0]);
  KILN_CHECK(slots.dtype == GgmlType::I32 && slots.elements() == k.ne[1] && v.ne[1] == k.ne[1],
             "cuda kv_store: {} slots for {} tokens", slots.elements(), k.ne[1]);
  cuda::KvStoreArgs a;
  a.k = k.as<float>(), a.k_stride = int64_t(k.nb[1] / 4), a.k_width = k.ne[0];
  a.v = v.as<float>(), a.v_stride = int64_t(v.nb[1] / 4), a.v_width = v.ne[0];
  a.cache_k = cache.k.data, a.cache_v = cache.v.data, a.cache_type = cache.k.dtype;
  a.cache_k_stride = slot_stride(cache.k), a.cache_v_stride = slot_stride(cache.v);
  a.n_slots = cache.k.ne[1];
  a.slots = slots.as<int32_t>(), a.n_tokens = k.ne[1];
  return a;
}

// KILN_CUDA_PREFILL_ROPE_STORE=0: prefill runs the plain kernels (head norms, rope q, rope k,
// kv_store) instead of one rope_store_rows launch (to measure what it saves).
bool prefill_rope_store_enabled() {
  static const bool enabled = !cuda::env_is("KILN_CUDA_PREFILL_ROPE_STORE", "0");
  return enabled;
}

// KILN_CUDA_ATTN_HEAD_NORM=0: a decode token's head norms, rope and cache store run as their
// own launch before the attention instead of inside it (to measure what that saves).
bool head_norms_in_attention_enabled() {
  static const bool enabled = !cuda::env_is("KILN_CUDA_ATTN_HEAD_NORM", "0");
  return enabled;
}

}  // namespace

void CudaBackend::rope(Tensor& x, const Tensor& positions, const RopeParams& p) {
  const cuda::RopeArgs a = rope_args(x, positions, p);
  Sig sig(Op::Rope);
  sig.t(x).t(positions);
  hash_rope(sig, p, a);
  record(sig.h, x.ne[2], [=](cudaStream_t s) { return cuda::rope(a, s); }, "rope");
}

void CudaBackend::kv_store(const Tensor& k, const Tensor& v, KvLayer& cache, const Tensor& slots) {
  const cuda::KvStoreArgs a = kv_store_args(k, v, cache, slots);
  record(Sig(Op::KvStore).t(k).t(v).t(cache.k).t(cache.v).t(slots).h, k.ne[1],
         [=](cudaStream_t s) { return cuda::kv_store(a, s); }, "kv_store");
}

void CudaBackend::rope_kv_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& positions,
                                const RopeParams& p, KvLayer& cache, const Tensor& slots) {
  // Prefill: rope_store_rows (decode's rope_store, one block per 4 heads, measured 4.7% slower
  // at T = 512 than the three plain kernels).
  const bool decode = q_heads.ne[2] <= kMatvecMaxTokens;
  const bool recorded =
      decode ? record_rope_store(q_heads, k_heads, v, positions, p, cache, slots, {})
             : !options_.exact && prefill_rope_store_enabled() &&
                   record_rope_store_rows(q_heads, k_heads, v, positions, p, cache, slots, {});
  if (!recorded) Backend::rope_kv_store(q_heads, k_heads, v, positions, p, cache, slots);
}

void CudaBackend::norm_rope_kv_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& q_norm,
                                     const Tensor& k_norm, float eps, const Tensor& positions, const RopeParams& p,
                                     KvLayer& cache, const Tensor& slots) {
  cuda::HeadNorms norms;
  norms.eps = eps;
  const bool decode = q_heads.ne[2] <= kMatvecMaxTokens;
  bool fits = decode || (prefill_rope_store_enabled() && !options_.exact);
  for (auto [w, dst, heads] : {std::tuple{&q_norm, &norms.q, &q_heads}, std::tuple{&k_norm, &norms.k, &k_heads}}) {
    if (w->empty()) continue;
    require_f32(*w, "norm_rope_kv_store", "norm weight");
    fits = fits && w->elements() == heads->ne[0];
    *dst = w->as<float>();
  }
  const bool recorded = fits && (decode ? record_rope_store(q_heads, k_heads, v, positions, p, cache, slots, norms)
                                        : record_rope_store_rows(q_heads, k_heads, v, positions, p, cache, slots,
                                                                 norms));
  if (!recorded) Backend::norm_rope_kv_store(q_heads, k_heads, v, q_norm, k_norm, eps, positions, p, cache, slots);
}

bool CudaBackend::record_rope_store_rows(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& positions,
                                         const RopeParams& p, KvLayer& cache, const Tensor& slots,
                                         const cuda::HeadNorms& norms) {
  // Tokens may be strided (q/k/v as column ranges of one buffer: the joined prefill products,
  // prefers_joined_parts); each token's heads must be packed.
  if (!heads_packed(k_heads)) return false;
  const Tensor k_rows = heads_as_rows(k_heads);
  const cuda::RopeArgs q = rope_args(q_heads, positions, p), k = rope_args(k_heads, positions, p);
  const cuda::KvStoreArgs st = kv_store_args(k_rows, v, cache, slots);
  // The table's pointer is known before it is written: check the layout with a stand-in
  // so that a refused layout records nothing (not even the table).
  const float* stand_in = q.x;
  if (!cuda::rope_store_rows_refusal(q, k, st, stand_in, norms).empty()) return false;
  // One table per positions buffer whatever the pass's token count (keyed without the
  // shape): prompts of many lengths would otherwise leave a table each. Every pass uploads
  // its positions first, which marks the table stale, so each pass computes its own rows.
  Sig table_key(Op::Rope);
  table_key.v(positions.data).v(positions.dtype).v(true);
  hash_rope(table_key, p, q);
  const float* angles = rope_table_for(q, table_key.h.value);
  Sig sig(Op::KvStore);
  sig.t(q_heads).t(k_heads).t(v).t(positions).t(cache.k).t(cache.v).t(slots).v(norms.q).v(norms.k).v(norms.eps);
  sig.v(angles);
  hash_rope(sig, p, q);
  record(sig.h, q.n_tokens, [=](cudaStream_t s) { return cuda::rope_store_rows(q, k, st, angles, norms, s); },
         norms.q || norms.k ? "norm_rope_kv_store" : "rope_kv_store");
  return true;
}

// One rope_store launch (decode), or, without head norms and right after the q/k/v
// products, their epilogue; the angles from the pass's table. False: nothing recorded, the
// heads are laid out in a way the kernels do not take.
bool CudaBackend::record_rope_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& positions,
                                    const RopeParams& p, KvLayer& cache, const Tensor& slots,
                                    const cuda::HeadNorms& norms) {
  if (!k_heads.is_contiguous()) return false;  // decode passes never take the joined layout
  const Tensor k_rows = k_heads.reshape({k_heads.ne[0] * k_heads.ne[1], k_heads.ne[2]});
  const cuda::RopeArgs q = rope_args(q_heads, positions, p), k = rope_args(k_heads, positions, p);
  const cuda::KvStoreArgs st = kv_store_args(k_rows, v, cache, slots);
  const bool norm = norms.q || norms.k;
  if (k.head_stride != k.head_dim || st.k_stride != k.token_stride) return false;
  if (norm && (q.head_stride != q.head_dim || q.head_dim > cuda::kMaxHeadNormDim)) return false;
  Sig sig(Op::KvStore);
  sig.t(q_heads).t(k_heads).t(v).t(positions).t(cache.k).t(cache.v).t(slots).v(norms.q).v(norms.k).v(norms.eps);
  hash_rope(sig, p, q);
  Sig table_key(Op::Rope);
  table_key.t(positions);
  hash_rope(table_key, p, q);
  // Right after the q/k/v products: rotated and stored in their epilogue where they can.
  cuda::PairEpilogue ep;
  ep.kind = cuda::PairEpilogueKind::RopeStore;
  ep.head_dim = int(q.head_dim), ep.n_rot = q.n_rot, ep.store = st;
  const Tensor* outs[] = {&q_heads, &k_heads, &v};
  const float* angles = rope_table_for(q, table_key.h.value);
  ep.angles = angles;
  if (!norm && !q.neox && q.head_stride == q.head_dim && pending_products_take(outs, ep)) {
    fuse_into_pending_products(ep, sig.h, "qkv_rope_kv_store");
    return true;
  }
  // One token with head norms: held back for the attention after it to take in.
  if (norm && q.n_tokens == 1 && head_norms_in_attention_enabled()) {
    hold_head_norms({sig.h, q, k, st, angles, norms});
    return true;
  }
  record(sig.h, q.n_tokens, [=](cudaStream_t s) { return cuda::rope_store(q, k, st, s, angles, norms); },
         norm ? "norm_rope_kv_store" : "rope_kv_store");
  return true;
}

void CudaBackend::hold_head_norms(const PendingHeadNorms& held) {
  flush_pending();  // the q/k/v products (which cannot take head norms into their epilogue)
  pending_head_norms_ = held;
  quantized_input_ = {};  // the held launch writes q and k
}

void CudaBackend::flush_pending_head_norms() {
  if (!pending_head_norms_) return;
  const PendingHeadNorms h = *pending_head_norms_;
  pending_head_norms_.reset();  // record() finds none held
  record(h.sig, h.q.n_tokens,
         [=](cudaStream_t s) { return cuda::rope_store(h.q, h.k, h.store, s, h.angles, h.norms); },
         "norm_rope_kv_store");
}

const CudaBackend::PendingHeadNorms* CudaBackend::held_head_norms_of(const Tensor& q, const KvLayer& cache,
                                                                     const BatchIndex& batch,
                                                                     const AttentionParams& p) const {
  if (!pending_head_norms_) return nullptr;
  const PendingHeadNorms& h = *pending_head_norms_;
  const bool same_token = h.q.n_tokens == 1 && q.ne[1] == 1 && h.q.x == q.as<float>() &&
                          h.q.positions == batch.positions.as<int32_t>() && h.store.slots == batch.slots.as<int32_t>();
  const bool same_cache = h.store.cache_k == cache.k.data && h.store.cache_v == cache.v.data &&
                          h.store.cache_type == cache.k.dtype;
  const bool same_shape = h.q.n_heads == p.n_head && h.k.n_heads == p.n_head_kv && h.q.head_dim == p.head_dim_k &&
                          h.k.head_dim == p.head_dim_k && p.head_dim_v == p.head_dim_k &&
                          h.store.v_width == int64_t(p.n_head_kv) * p.head_dim_v;
  return same_token && same_cache && same_shape ? &h : nullptr;
}

void CudaBackend::attention(const Tensor& q, const KvLayer& cache, const BatchIndex& batch, const AttentionParams& p,
                            Tensor& out) {
  require_f32(q, "attention", "q");
  require_f32(out, "attention", "out");
  require_cache(cache, "attention");
  check_attention_shapes("cuda attention", q, cache, batch, p, out);
  const int64_t T = q.ne[1];
  const float* sinks = nullptr;
  if (p.sinks) {
    require_f32(*p.sinks, "attention", "sinks");
    sinks = p.sinks->as<float>();
  }
  const int64_t width = batch.block_tables.ne[0];
  const int limit = int(width) * cache.block_size;
  KILN_CHECK(batch.max_position < limit, "cuda attention: position {} beyond the block tables ({} positions)",
             batch.max_position, limit);
  const bool library_kernel = p.head_dim_k == p.head_dim_v &&
                              (p.head_dim_k == 64 || p.head_dim_k == 128 || p.head_dim_k == 256);
  Sig sig(Op::Attention);
  sig.t(q).t(cache.k).t(cache.v).t(batch.positions).t(batch.seq_rows).t(batch.block_tables).t(out);
  sig.v(p.n_head).v(p.n_head_kv).v(p.head_dim_k).v(p.head_dim_v).v(p.scale).v(p.softcap).v(p.sliding_window).v(sinks);

  // Prompt chunks: tensor-core tiles of 64 queries (f16 products) unless exact mode asks
  // for f32 throughout.
  if (!options_.exact && batch.one_sequence_in_order && T >= kPrefillAttentionMinTokens &&
      p.head_dim_k == p.head_dim_v && cuda::prefill_attention_supports(p.head_dim_k, cache.k.dtype)) {
    cuda::PrefillAttentionArgs a;
    a.q = q.as<float>(), a.q_stride = int64_t(q.nb[1] / 4);
    a.k_cache = cache.k.data, a.v_cache = cache.v.data;
    a.k_slot_stride = slot_stride(cache.k), a.v_slot_stride = slot_stride(cache.v);
    a.cache_type = cache.k.dtype;
    a.block_tables = batch.block_tables.as<int32_t>(), a.block_table_stride = width;
    a.seq_rows = batch.seq_rows.as<int32_t>(), a.block_size = cache.block_size;
    a.first_position = batch.first_position, a.n_tokens = int(T);
    a.n_head = p.n_head, a.n_head_kv = p.n_head_kv, a.head_dim = p.head_dim_k;
    a.scale = p.scale, a.softcap = p.softcap, a.sliding_window = p.sliding_window, a.sinks = sinks;
    a.out = out.as<float>(), a.out_stride = int64_t(out.nb[1] / 4);
    sig.v(a.first_position);
    if (holds_half_sources(T)) {  // the output product after it may read its rounded copy
      hold_half_source({sig.h, T, "attention", a.out, int64_t(p.n_head) * p.head_dim_v, T, a.out_stride,
                        [a](cudaStream_t s, void* half, bool bf16) {
                          cuda::PrefillAttentionArgs with_copy = a;
                          with_copy.out_half = half, with_copy.out_half_bf16 = bf16;
                          return cuda::prefill_attention(with_copy, s);
                        }});
      return;
    }
    record(sig.h, T, [=](cudaStream_t s) { return cuda::prefill_attention(a, s); }, "attention");
    return;
  }
  if (!library_kernel) {
    cuda::GeneralAttentionArgs a;
    a.q = q.as<float>(), a.q_stride = int64_t(q.nb[1] / 4);
    a.k_cache = cache.k.data, a.v_cache = cache.v.data, a.cache_type = cache.k.dtype;
    a.k_slot_stride = slot_stride(cache.k), a.v_slot_stride = slot_stride(cache.v);
    a.block_tables = batch.block_tables.as<int32_t>(), a.table_width = width, a.block_size = cache.block_size;
    a.positions = batch.positions.as<int32_t>(), a.seq_rows = batch.seq_rows.as<int32_t>(), a.n_tokens = T;
    a.n_head = p.n_head, a.n_head_kv = p.n_head_kv, a.head_dim_k = p.head_dim_k, a.head_dim_v = p.head_dim_v;
    a.scale = p.scale, a.softcap = p.softcap, a.sliding_window = p.sliding_window, a.sinks = sinks;
    a.out = out.as<float>(), a.out_stride = int64_t(out.nb[1] / 4);
    record(sig.h, T, [=](cudaStream_t s) { return cuda::general_attention(a, s); }, "attention");
    return;
  }
  // Token t reads its sequence's block table, row seq_rows[t] of the cache's tables.
  cuda::DecodeAttentionArgs a;
  a.q = q.as<float>(), a.q_stride = int64_t(q.nb[1] / 4);
  a.k_cache = cache.k.data, a.v_cache = cache.v.data;
  a.k_slot_stride = slot_stride(cache.k), a.v_slot_stride = slot_stride(cache.v);
  a.cache_type = cache.k.dtype;
  a.block_tables = batch.block_tables.as<int32_t>(), a.block_table_stride = width, a.block_size = cache.block_size;
  a.table_rows = batch.seq_rows.as<int32_t>();
  a.positions = batch.positions.as<int32_t>();
  a.n_seq = int(T), a.n_head = p.n_head, a.n_head_kv = p.n_head_kv, a.head_dim = p.head_dim_k;
  // Graphed passes plan for a bucket of context lengths; blocks past a token's position exit.
  const bool graphed = graphs_->enabled() && T <= options_.graph_max_tokens;
  a.max_context = graphed ? cuda::attention_bucket(batch.max_position + 1, limit) : batch.max_position + 1;
  a.scale = p.scale, a.softcap = p.softcap, a.sliding_window = p.sliding_window, a.sinks = sinks;
  a.out = out.as<float>(), a.out_stride = int64_t(out.nb[1] / 4);
  // The token's head norms, rope and cache store, held back, run inside this kernel where
  // it takes them (else record() below runs them first, as their own launch).
  const char* op = "attention";
  if (const PendingHeadNorms* held = held_head_norms_of(q, cache, batch, p)) {
    cuda::DecodeNewToken& t = a.new_token;
    t.k = held->k.x, t.v = held->store.v;
    t.q_norm = held->norms.q, t.k_norm = held->norms.k, t.eps = held->norms.eps;
    t.angles = held->angles, t.n_rot = held->q.n_rot, t.neox = held->q.neox;
    t.slot = held->store.slots, t.n_slots = held->store.n_slots;
    t.k_cache = cache.k.data, t.v_cache = cache.v.data;
    if (cuda::decode_new_token_refusal(a).empty()) {
      sig.v(held->sig.value);
      pending_head_norms_.reset();
      op = "norm_rope_attention";
    } else {
      a.new_token = {};
    }
  }
  const cuda::DecodeAttentionPlan plan = cuda::plan_decode_attention(a);
  const size_t need = cuda::decode_attention_scratch_bytes(a, plan);
  void* sp = need ? scratch(attention_scratch_, need) : nullptr;
  // Where the output is written (a one-range block, a cluster or the second kernel), its int8
  // copy for the o product is left too (which then need not quantize it in every block).
  const int64_t cols = int64_t(p.n_head) * p.head_dim_v;
  uint8_t* q8 = q8_for_next_matmul(cols, T, &a.out_q8_row_bytes);
  a.out_q8 = q8;
  sig.v(a.max_context);
  sig.v(q8);
  record(sig.h, T, [=](cudaStream_t s) { return cuda::decode_attention(a, plan, sp, need, s); }, op);
  remember_q8(a.out, cols, T, a.out_stride, q8);
}

}  // namespace kiln
