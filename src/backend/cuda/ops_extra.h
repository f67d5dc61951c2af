#pragma once
// The CUDA backend's own kernels: the ops of backend/backend.h that the kernel library
// (matvec.h, gemm.h, ops.h, attention.h, dequant.h) does not cover. Each is a v1 — the CPU
// reference ported, one thread / warp / block per natural unit of work, f32 arithmetic — with
// a parity test against the CPU backend in tests/cuda/backend_ops_test.cpp.
//
// Activations are f32 rows of `n` elements; a RowLayout says where row r lies, so that the
// strided 3-D views the models pass (heads of a token, columns of a wider row) need no copy.
// Like the library's launchers these never throw: they return a Status.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/status.h"
#include "quant/types.h"

namespace kiln::cuda {

// Row r of a tensor with ne[1] = ne1, ne[2] = ne2 and strides s1, s2, s3 (in floats).
struct RowLayout {
  float* base = nullptr;
  int64_t ne1 = 1, ne2 = 1;
  int64_t s1 = 0, s2 = 0, s3 = 0;
#ifdef __CUDACC__
  __host__ __device__
#endif
  float* row(int64_t r) const {
    const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    return base + i1 * s1 + i2 * s2 + i3 * s3;
  }
};

enum class EltwiseKind : uint8_t {
  Add,         // out = a + b        (b: same rows, or one row broadcast)
  Scale,       // out = a * value
  SoftCap,     // out = value * tanh(a / value)
  SigmoidMul,  // out = a * sigmoid(b)  (b: same shape, or one value per row)
};
struct EltwiseArgs {
  EltwiseKind kind = EltwiseKind::Add;
  RowLayout a, b, out;
  int64_t rows = 0, n = 0;
  bool b_one_row = false;    // Add: b is a single row for every row of a
  bool b_one_value = false;  // SigmoidMul: b holds one value per row
  float value = 1.0f;
};
Status eltwise(const EltwiseArgs& args, cudaStream_t stream);

// Row-wise softmax (max-subtracted, f32). out may alias x.
Status softmax_rows(const RowLayout& x, const RowLayout& out, int64_t rows, int64_t n, cudaStream_t stream);

// out = rmsnorm(x) * weight * silu(z) per row of n.
Status rmsnorm_gated(const RowLayout& x, const RowLayout& z, const float* weight, float eps, const RowLayout& out,
                     int64_t rows, int64_t n, cudaStream_t stream);

// cache_k[slots[t]] = k[t], cache_v[slots[t]] = v[t]: f32 rows into f32 or f16 cache rows
// (rounded to nearest even). Cache strides are in elements of cache_type.
struct KvStoreArgs {
  const float* k = nullptr;
  int64_t k_stride = 0, k_width = 0;
  const float* v = nullptr;
  int64_t v_stride = 0, v_width = 0;
  void* cache_k = nullptr;
  void* cache_v = nullptr;
  GgmlType cache_type = GgmlType::F32;  // F32 or F16
  int64_t cache_k_stride = 0, cache_v_stride = 0, n_slots = 0;
  const int32_t* slots = nullptr;
  int64_t n_tokens = 0;
};
Status kv_store(const KvStoreArgs& args, cudaStream_t stream);

// Attention of any head sizes over the paged f32 or f16 cache (the fallback of
// decode_attention() for head sizes it lacks): one warp per (token, query head), online
// softmax in f32. With an f16 cache the query is rounded to f16 too, as decode_attention()
// and the CPU backend do.
struct GeneralAttentionArgs {
  const float* q = nullptr;
  int64_t q_stride = 0;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  GgmlType cache_type = GgmlType::F32;  // F32 or F16
  int64_t k_slot_stride = 0, v_slot_stride = 0;  // in elements of cache_type
  const int32_t* block_tables = nullptr;  // [n_rows][table_width]
  int64_t table_width = 0;
  int block_size = 0;
  const int32_t* positions = nullptr;  // [T]
  const int32_t* seq_rows = nullptr;   // [T]
  int64_t n_tokens = 0;
  int n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0;
  float scale = 1.0f, softcap = 0.0f;
  int sliding_window = 0;
  const float* sinks = nullptr;
  float* out = nullptr;
  int64_t out_stride = 0;
};
Status general_attention(const GeneralAttentionArgs& args, cudaStream_t stream);

// Expert choice per token (backend.h's MoeRouteParams): gating 0 softmax, 1 sigmoid,
// 2 softmax over the chosen k. Ties keep the lower expert index first.
struct MoeRouteArgs {
  const float* logits = nullptr;
  int64_t logits_stride = 0, n_expert = 0, n_tokens = 0;
  int n_used = 0, gating = 0;
  bool normalize = false;
  float scale = 1.0f;
  const float* selection_bias = nullptr;
  int32_t* ids = nullptr;
  int64_t ids_stride = 0;
  float* weights = nullptr;
  int64_t weights_stride = 0;
};
Status moe_route(const MoeRouteArgs& args, cudaStream_t stream);

// The MoE layer's front in one launch, for a few tokens: the RMS norm of x (written to
// normed, the experts' input), the router's logits of the normed row (f32 router, optional
// bias) and the routing of MoeRouteArgs (`route`: its logits are `logits` here). Blocks
// split the router's rows. Where a token's blocks fit one thread block cluster (up to 128
// experts) the cluster's first block routes it from its shared memory; otherwise the last
// block of a token to finish (a ticket per token in `tickets`, zero before the launch and left
// zero after) does. x, normed, the norm
// weights and the router rows start 16-byte aligned (moe_norm_route_fits).
struct MoeNormRouteArgs {
  const float* x = nullptr;  // [n_tokens][n_embd], row stride x_stride
  int64_t x_stride = 0, n_embd = 0;
  const float* norm_weight = nullptr;  // [n_embd] or null
  float eps = 0.0f;
  float* normed = nullptr;  // [n_tokens][n_embd], row stride normed_stride; must not overlap x
  int64_t normed_stride = 0;
  const float* router = nullptr;  // [n_expert][n_embd] f32, row stride router_stride floats
  int64_t router_stride = 0;
  const float* router_bias = nullptr;  // [n_expert] or null
  float* logits = nullptr;             // [n_tokens][n_expert], row stride route.logits_stride
  MoeRouteArgs route;                  // route.logits == logits (read back by the routing)
  unsigned* tickets = nullptr;         // [n_tokens]
  // Also normed's int8 copy (blocks of 32 with (scale, scale * sum), matvec.h's Q8Vector at
  // q8 + t * q8_row_bytes, as RmsNormArgs::q8), so that the experts' kernel after this one
  // needs no launch to quantize it; null: none. n_embd % 32 == 0, 16-byte aligned rows.
  uint8_t* q8 = nullptr;
  int64_t q8_row_bytes = 0;
  // Tests: the tickets even where the token's blocks fit a thread block cluster (moe_router.cu
  // routes from the cluster's shared memory there; the same results, bit for bit).
  bool tickets_only = false;
};
// Whether the fused kernel takes these sizes and alignments (else run the three ops).
bool moe_norm_route_fits(const MoeNormRouteArgs& args);
Status moe_norm_route(const MoeNormRouteArgs& args, cudaStream_t stream);

// out[t] (+)= w(t, e) * y[t], w(t, e) = sum of weights[t][j] over the j with ids[t][j] == e.
// `accumulate` false: out is overwritten (the first expert).
struct MoeCombineArgs {
  const float* y = nullptr;
  int64_t y_stride = 0;
  const int32_t* ids = nullptr;
  int64_t ids_stride = 0;
  const float* weights = nullptr;
  int64_t weights_stride = 0;
  int n_used = 0, expert = 0;
  bool accumulate = true;
  float* out = nullptr;
  int64_t out_stride = 0;
  int64_t n_tokens = 0, n = 0;
};
Status moe_combine(const MoeCombineArgs& args, cudaStream_t stream);

// GatedDeltaNet short convolution + SiLU with per-sequence rolling state (backend.h).
struct ConvSiluArgs {
  const float* x = nullptr;
  int64_t x_stride = 0, channels = 0, n_tokens = 0;
  const float* weight = nullptr;  // [C][K]
  int kernel = 0;
  float* state = nullptr;         // [n_seqs][C][K-1]
  int64_t n_state_rows = 0;
  const int32_t* positions = nullptr;
  const int32_t* seq_rows = nullptr;
  float* out = nullptr;
  int64_t out_stride = 0;
};
Status causal_conv_silu(const ConvSiluArgs& args, cudaStream_t stream);

// The gated delta rule, token by token (the recurrent form) for every token of the batch:
// one block per value head walks the batch in order, keeping the head's state S[key][value]
// of the current sequence in shared memory.
struct DeltaRuleArgs {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  // alpha / beta of head h, token t at base + (h % n0) * s0 + (h / n0) * s1 + t * s2 (floats)
  const float* alpha = nullptr;
  const float* beta = nullptr;
  int64_t gate_n0 = 1, alpha_s0 = 0, alpha_s1 = 0, alpha_s2 = 0, beta_s0 = 0, beta_s1 = 0, beta_s2 = 0;
  const float* ssm_a = nullptr;
  const float* dt_bias = nullptr;
  float* state = nullptr;  // [n_seqs][n_v_heads][dk][dv]
  int64_t n_state_rows = 0;
  const int32_t* positions = nullptr;
  const int32_t* seq_rows = nullptr;
  int64_t n_tokens = 0;
  int n_k_heads = 0, n_v_heads = 0, head_dim_k = 0, head_dim_v = 0;
  bool tiled_heads = false;
  float l2_eps = 1e-6f;
  float* out = nullptr;
  int64_t out_stride = 0;
};
Status gated_delta_rule(const DeltaRuleArgs& args, cudaStream_t stream);

}  // namespace kiln::cuda
