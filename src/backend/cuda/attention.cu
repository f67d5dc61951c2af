// Decode attention: argument checks, the split plan and the dispatch to the kernels of
// attention_kernel.cuh (see attention.h for the contract).
#include <algorithm>
#include <string>

#include "backend/cuda/attention_kernel.cuh"
#include "backend/cuda/env_switch.h"

namespace kiln::cuda {
namespace {

int64_t round_up_32(int64_t n) { return (n + 31) / 32 * 32; }

bool valid_shape(const DecodeAttentionArgs& a) {
  return a.n_seq > 0 && a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0 && a.max_context > 0;
}

// The keys one (sequence, head group) may see: the window, or the planned context.
int64_t key_span(const DecodeAttentionArgs& a) {
  return a.sliding_window > 0 && a.sliding_window < a.max_context ? a.sliding_window : a.max_context;
}

// The most query heads of one kv head a block can take, `at_most` or fewer (4 for head size
// 256, registers allowing).
int heads_per_block(const DecodeAttentionArgs& a, int at_most) {
  const int group = a.n_head / a.n_head_kv;
  for (int h : {8, 4, 2})
    if (h <= at_most && group % h == 0 && !(a.head_dim == 256 && h > 4)) return h;
  return 1;
}

// Ranges per head group that give about kTargetBlocks blocks in all (4 blocks of 128 threads
// per SM fit the kernels' registers at 4 heads per block; 132 SMs on an H100 / H200).
int64_t ranges_wanted(const DecodeAttentionArgs& a, int heads) {
  const int64_t base_blocks = int64_t(a.n_seq) * (a.n_head / heads);
  return (detail::kTargetBlocks + base_blocks - 1) / base_blocks;
}

// `span` keys in ranges of `keys` (rounded up to 32, at least `min_keys`).
DecodeAttentionPlan ranges_of(int heads, int64_t span, int64_t keys, int64_t min_keys) {
  DecodeAttentionPlan plan;
  plan.heads_per_block = heads;
  plan.keys_per_split = int(std::max(round_up_32(keys), min_keys));
  plan.n_splits = int((span + plan.keys_per_split - 1) / plan.keys_per_split);
  return plan;
}

}  // namespace

// Thread block clusters need sm_90 (the current device's, asked once).
bool decode_attention_clusters_available() {
  static const bool available = [] {
    // KILN_CUDA_ATTN_CLUSTER=0: no cluster merge (the second kernel merges every split).
    if (env_is("KILN_CUDA_ATTN_CLUSTER", "0")) return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();  // no device: leave no sticky error behind
      return false;
    }
    return major >= 9;
  }();
  return available;
}

// Four regimes, from the chained decode graph on the H200 (docs/perf-notes.md, v9 and v10):
//  - spans of at most 256 keys (the smallest graph bucket): one range per head group in
//    blocks of 512 threads (wide), which write the output and its int8 copy themselves: no
//    merge, no second kernel;
//  - short spans: at most 2 query heads per block and ranges of 32 keys (one step of the key
//    loop), merged by combine_kernel, when that takes at most kShortPlanSplits ranges (spans
//    of at most 256 keys: so only with the wide regime switched off or narrowed). Measured at
//    contexts 1..128 before the wide regime: smaller blocks and one key step won, and a
//    cluster merge of 4 ranges cost 1.8 us per layer more than the second kernel;
//  - up to kMaxClusterSplits ranges of at most kMaxClusterKeys keys (sm_90): merged in a
//    cluster. Over contexts 1..1024 this beat the second kernel, whose serial loop over the
//    ranges grows with their number;
//  - longer: ranges of 64..kMaxSplitKeys keys for about kTargetBlocks blocks, merged by
//    combine_kernel (this beat ranges sized to fill waves of an assumed 3 blocks per SM).
DecodeAttentionPlan plan_decode_attention(const DecodeAttentionArgs& a) {
  constexpr int kShortPlanSplits = 8;
  static const bool prefetch = !env_is("KILN_CUDA_ATTN_PREFETCH", "0");  // L2 prefetch before the wait
  // KILN_CUDA_ATTN_EARLY_TRIGGER: 0 never, 1 always, 2 only where the kernel does not take
  // the new token in. Measured (docs/perf-notes.md, round 23): Llama-3-8B Q4_0 -16 us a step
  // (rope and store in the q/k/v kernel), Q4_K_M unchanged; Qwen3-30B-A3B, whose head norms and
  // rope run in this kernel, +6 to +10 us then, but -10 us since its MoE front is folded
  // (round 31): so always.
  static const int early_mode = env_int("KILN_CUDA_ATTN_EARLY_TRIGGER", 1);
  // Knobs for measuring (KILN_CUDA_ATTN_WIDE_SPAN=0 turns the wide regime off).
  static const int wide_span = env_int("KILN_CUDA_ATTN_WIDE_SPAN", 256);
  static const int wide_heads = std::clamp(env_int("KILN_CUDA_ATTN_WIDE_HEADS", 1), 1, kMaxWideHeads);
  DecodeAttentionPlan plan;
  const int64_t span = valid_shape(a) ? key_span(a) : 0;  // invalid: decode_attention() refuses the arguments
  if (span > 0 && span <= wide_span) {
    plan.heads_per_block = heads_per_block(a, wide_heads);
    plan.n_splits = 1;
    plan.keys_per_split = int(round_up_32(span));
    plan.wide = true;
  } else if (span > 0) {
    // Query heads per block: few for the short plan, as many as a group has for the others.
    const int few = heads_per_block(a, 2), many = heads_per_block(a, 8);
    const int64_t short_ranges = ranges_wanted(a, few), many_ranges = ranges_wanted(a, many);
    plan = ranges_of(few, span, (span + short_ranges - 1) / short_ranges, 32);
    if (plan.n_splits > kShortPlanSplits) {
      const int64_t in_cluster = std::min<int64_t>(many_ranges, kMaxClusterSplits);
      plan = ranges_of(many, span, (span + in_cluster - 1) / in_cluster, 32);
      plan.cluster = decode_attention_clusters_available() && plan.keys_per_split <= detail::kMaxClusterKeys &&
                     plan.n_splits <= kMaxClusterSplits;
      if (!plan.cluster)
        plan = ranges_of(many, span, std::min<int64_t>((span + many_ranges - 1) / many_ranges, detail::kMaxSplitKeys),
                         64);
    }
  }
  plan.prefetch = prefetch;
  plan.trigger_early = early_mode == 1 || (early_mode != 0 && a.new_token.k == nullptr);
  return plan;
}

size_t decode_attention_scratch_bytes(const DecodeAttentionArgs& a, const DecodeAttentionPlan& plan) {
  if (!valid_shape(a) || plan.n_splits <= 1 || plan.cluster) return 0;
  return size_t(a.n_seq) * a.n_head * plan.n_splits * (a.head_dim + 2) * sizeof(float);
}

size_t decode_attention_scratch_bytes(const DecodeAttentionArgs& a) {
  return decode_attention_scratch_bytes(a, plan_decode_attention(a));
}

std::string decode_new_token_refusal(const DecodeAttentionArgs& a) {
  const DecodeNewToken& t = a.new_token;
  if (!t.k) return "no new token given";
  if (a.n_seq != 1) return "the new token's rope and store take one token, not " + std::to_string(a.n_seq);
  if (a.softcap > 0.0f) return "the new token's rope and store do not take softcap";
  if (!t.v || !t.angles || !t.slot) return "the new token needs its values, angles and slot";
  if (t.k_cache != a.k_cache || t.v_cache != a.v_cache) return "the new token's caches are not the ones read";
  if (t.n_rot < 2 || t.n_rot % 2 != 0 || t.n_rot > a.head_dim)
    return "the new token's n_rot " + std::to_string(t.n_rot) + " must be even, 2 .. head_dim " +
           std::to_string(a.head_dim);
  return "";
}

Status decode_attention(const DecodeAttentionArgs& a, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  return decode_attention(a, plan_decode_attention(a), scratch, scratch_bytes, stream);
}

Status decode_attention(const DecodeAttentionArgs& a, const DecodeAttentionPlan& plan, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream) {
  if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256)
    return Status::invalid("decode_attention: head_dim " + std::to_string(a.head_dim) + " is not supported; supported: 64 128 256");
  if (a.cache_type != GgmlType::F16 && a.cache_type != GgmlType::F32)
    return Status::invalid("decode_attention: cache type " + std::string(type_name(a.cache_type)) +
                           " is not supported; supported: f16 f32");
  if (a.n_seq <= 0 || a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.n_seq > 0x7fffffff ||
      a.n_head > 65535)
    return Status::invalid("decode_attention: " + std::to_string(a.n_head) + " query heads cannot share " +
                           std::to_string(a.n_head_kv) + " kv heads (n_seq " + std::to_string(a.n_seq) + ")");
  if (a.max_context <= 0 || a.block_size <= 0)
    return Status::invalid("decode_attention: max_context and block_size must be positive");
  if (!a.q || !a.k_cache || !a.v_cache || !a.block_tables || !a.positions || !a.out)
    return Status::invalid("decode_attention: q, caches, block tables, positions and out must be device pointers");
  const size_t elem = a.cache_type == GgmlType::F16 ? 2 : 4;
  if (reinterpret_cast<uintptr_t>(a.k_cache) % 16 || reinterpret_cast<uintptr_t>(a.v_cache) % 16 ||
      (a.k_slot_stride * elem) % 16 || (a.v_slot_stride * elem) % 16)
    return Status::invalid("decode_attention: cache rows must be 16-byte aligned (base and slot stride)");
  const int group = a.n_head / a.n_head_kv, h = plan.heads_per_block;
  if ((h != 1 && h != 2 && h != 4 && h != 8) || group % h != 0 || (a.head_dim == 256 && h > 4))
    return Status::invalid("decode_attention: plan of " + std::to_string(h) + " heads per block for groups of " +
                           std::to_string(group) + " (head_dim " + std::to_string(a.head_dim) + ")");
  if (plan.n_splits < 1 || plan.n_splits > 65535 || plan.keys_per_split < 1 ||
      int64_t(plan.n_splits) * plan.keys_per_split < key_span(a))
    return Status::invalid("decode_attention: plan of " + std::to_string(plan.n_splits) + " ranges of " +
                           std::to_string(plan.keys_per_split) + " keys does not cover " +
                           std::to_string(key_span(a)) + " keys");
  if (plan.wide && (plan.n_splits != 1 || plan.cluster || h > kMaxWideHeads))
    return Status::invalid("decode_attention: a wide plan takes one range of at most " +
                           std::to_string(kMaxWideHeads) + " heads per block, no cluster");
  if (plan.cluster && (plan.n_splits > kMaxClusterSplits || !decode_attention_clusters_available()))
    return Status::invalid("decode_attention: a cluster of " + std::to_string(plan.n_splits) +
                           " ranges (at most " + std::to_string(kMaxClusterSplits) + ", sm_90)");
  if (a.new_token.k)
    if (const std::string why = decode_new_token_refusal(a); !why.empty())
      return Status::invalid("decode_attention: " + why);
  const size_t need = decode_attention_scratch_bytes(a, plan);
  if (a.out_q8 && (reinterpret_cast<uintptr_t>(a.out_q8) % 16 || a.out_q8_row_bytes % 16 ||
                   (int64_t(a.n_head) * a.head_dim) % 32))
    return Status::invalid("decode_attention: the int8 copy needs 16-byte aligned rows of a multiple of 32 values");
  if (need > 0 && (!scratch || scratch_bytes < need))
    return Status::invalid("decode_attention: needs " + std::to_string(need) + " bytes of scratch, got " +
                           std::to_string(scratch_bytes));
  float* partial = static_cast<float*>(scratch);
  switch (a.head_dim) {
    case 64: return detail::launch_head_dim<64>(a, plan, partial, stream);
    case 128: return detail::launch_head_dim<128>(a, plan, partial, stream);
    default: return detail::launch_head_dim<256>(a, plan, partial, stream);
  }
}

}  // namespace kiln::cuda
