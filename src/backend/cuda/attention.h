#pragma once
// Decode attention: one query token per sequence against a paged KV cache.
//
//   out[s][h] = sum_j softmax_j(score(q[s][h], K[j])) V[j]     j in the keys position p_s sees
//
// score = scale * q.k, then softcap * tanh(score / softcap) when softcap > 0. Sequence s
// sees the keys at positions first..p_s (p_s = positions[s]; first = 0, or p_s - window + 1
// with a sliding window). Grouped-query: query head h reads kv head h / (n_head / n_head_kv).
// Sinks (optional, one logit per query head) add a virtual key whose value is 0.
//
// Cache layout (as backend/backend.h's KvLayer): slot rows of n_head_kv * head_dim elements
// (f16 or f32); position j of sequence s lives in slot
//   block_tables[s * block_table_stride + j / block_size] * block_size + j % block_size.
//
// The key range is split across blocks (flash-decoding): each block reduces a range of keys
// to (max, sum, unnormalized output). The ranges then merge either in the same kernel, as
// the blocks of one thread block cluster (sm_90, up to kMaxClusterSplits ranges), through
// distributed shared memory, or through records in `scratch` that a second kernel combines;
// the plan (below) says which.
// positions, block_tables and table_rows are read before waiting for the kernel launched
// just before (launch.cuh): they must come from earlier work (uploads), not from that kernel.
// Arithmetic in f32 (exp by expf): expect ~1e-6 relative error against a double reference.
// With an f16 cache the query is rounded to f16 as well (the reference must round it too).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cuda/status.h"
#include "quant/types.h"

namespace kiln::cuda {

// Optional: the new token's head norms, rope and cache store inside the attention kernel
// (one token, n_seq 1; Qwen3-style layers), instead of a rope_store() launch before it.
// q (DecodeAttentionArgs::q) and k, v here are then the token's raw products, and the kernel
// does what rope_store() with these norms and angles would have done:
//   - every block RMS-normalizes (where a weight is given) and rotates its query heads as it
//     loads them;
//   - a block whose key range holds the token's position computes that key from the raw k
//     of its kv head (normed, rotated, rounded as the cache would round it) and takes v as
//     it is, and uses them for that key instead of reading the cache slot;
//   - of those, the block of each kv head's first query head writes the key and value into
//     the cache slot *slot (nothing when the slot is outside 0 .. n_slots - 1).
// The q, k and v buffers are left as they are (raw). The same bits as rope_store() then
// decode_attention(). Not with softcap.
struct DecodeNewToken {
  const float* k = nullptr;  // [n_head_kv * head_dim] the token's raw keys; null: not used
  const float* v = nullptr;  // [n_head_kv * head_dim] its values
  const float* q_norm = nullptr;  // [head_dim] or null: q heads not normalized
  const float* k_norm = nullptr;  // [head_dim] or null: k heads not normalized
  float eps = 0.0f;
  const float* angles = nullptr;  // the token's rope_table row: n_rot / 2 cosines, then the sines
  int n_rot = 0;                  // even, 2 .. head_dim; dims past it pass through
  bool neox = false;
  const int32_t* slot = nullptr;  // the cache slot of the token's key and value (an upload)
  int64_t n_slots = 0;
  void* k_cache = nullptr;  // the caches written: DecodeAttentionArgs' k_cache / v_cache
  void* v_cache = nullptr;
};

struct DecodeAttentionArgs {
  const float* q = nullptr;  // [n_seq][n_head * head_dim]
  int64_t q_stride = 0;
  const void* k_cache = nullptr;  // slots of n_head_kv * head_dim elements of cache_type
  const void* v_cache = nullptr;
  int64_t k_slot_stride = 0, v_slot_stride = 0;  // elements between slots (16-byte multiples)
  GgmlType cache_type = GgmlType::F16;           // F16 or F32
  const int32_t* block_tables = nullptr;         // [n_seq][block_table_stride], or see table_rows
  int64_t block_table_stride = 0;
  // When set, query s reads block table row table_rows[s] (the cache's per-sequence tables
  // as they are, no gathered copy).
  const int32_t* table_rows = nullptr;
  int block_size = 0;
  const int32_t* positions = nullptr;  // [n_seq] position of each query token
  int n_seq = 0, n_head = 0, n_head_kv = 0, head_dim = 0;  // head_dim: 64, 128 or 256
  int max_context = 0;  // host-known bound: positions[s] < max_context for every s
  float scale = 1.0f;
  float softcap = 0.0f;           // > 0: tanh soft-capping of the scores
  int sliding_window = 0;         // > 0: keys p - window + 1 .. p only
  const float* sinks = nullptr;   // [n_head] or null
  float* out = nullptr;           // [n_seq][n_head * head_dim]
  int64_t out_stride = 0;
  // Optional: the output's int8 copy for the next product, in quantize_q8's layout
  // (q8_vector_in of out_q8 + s * row bytes), written where the output is (where the ranges
  // merge, or by the block of a one-range plan). n_head * head_dim a multiple of 32.
  uint8_t* out_q8 = nullptr;
  int64_t out_q8_row_bytes = 0;
  DecodeNewToken new_token;  // optional (see there)
};

// How the key range is split and merged. plan_decode_attention() picks one (see there);
// tests and benchmarks may pass their own to the overloads below, which check it.
inline constexpr int kMaxClusterSplits = 16;  // blocks of one cluster (non-portable size above 8)
struct DecodeAttentionPlan {
  int heads_per_block = 1;  // query heads (of one kv head) per block: 1, 2, 4 or 8 (4 at head size 256)
  int n_splits = 1;         // key ranges per (sequence, head group), each of keys_per_split keys
  int keys_per_split = 0;
  bool cluster = false;     // the ranges merge inside a thread block cluster, not in a second kernel
  bool prefetch = true;     // the blocks ask L2 for their K/V rows before waiting for the kernel before
  // The blocks let the next chained kernel be scheduled as they start, not after their wait:
  // its blocks can then be placed (and request their weights) as the kernel before drains.
  // Either way the next kernel reads nothing of this one's before this one has ended.
  bool trigger_early = false;
  // Blocks of 512 threads instead of 128 (32 keys per step of the key loop become 128 at head
  // size 128): only with one range (n_splits 1, no cluster) and at most kMaxWideHeads heads.
  bool wide = false;
};
inline constexpr int kMaxWideHeads = 2;
DecodeAttentionPlan plan_decode_attention(const DecodeAttentionArgs& args);
// Whether plans may merge in clusters here: an sm_90 device, and KILN_CUDA_ATTN_CLUSTER not 0.
bool decode_attention_clusters_available();

// Scratch bytes decode_attention() needs for these arguments (0 when no second kernel runs).
size_t decode_attention_scratch_bytes(const DecodeAttentionArgs& args);
size_t decode_attention_scratch_bytes(const DecodeAttentionArgs& args, const DecodeAttentionPlan& plan);

// Why decode_attention() would refuse args.new_token (empty: it takes it): checked apart so
// that a caller can keep the launch before it instead.
std::string decode_new_token_refusal(const DecodeAttentionArgs& args);

Status decode_attention(const DecodeAttentionArgs& args, void* scratch, size_t scratch_bytes, cudaStream_t stream);
Status decode_attention(const DecodeAttentionArgs& args, const DecodeAttentionPlan& plan, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream);

}  // namespace kiln::cuda
