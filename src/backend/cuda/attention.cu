// Decode attention: argument checks, the split plan and the dispatch to the kernels of
// attention_kernel.cuh (see attention.h for the contract).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_kernel.cuh"

namespace kiln::cuda {
namespace {

// Measurement switches, read once: KILN_CUDA_ATTN_CLUSTER=0 (no cluster merge: the second
// kernel merges every split), KILN_CUDA_ATTN_MIN_KEYS=N (shortest range of either plan;
// default 32 in a cluster, 64 otherwise), KILN_CUDA_ATTN_PREFETCH=0 (no L2 prefetch before
// the wait), KILN_CUDA_ATTN_MAX_HEADS=N (query heads per block at most: 1, 2, 4 or 8).
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

int64_t round_up_32(int64_t n) { return (n + 31) / 32 * 32; }

}  // namespace

// Thread block clusters need sm_90 (the current device's, asked once).
bool decode_attention_clusters_available() {
  static const bool available = [] {
    if (env_int("KILN_CUDA_ATTN_CLUSTER", 1) == 0) return false;
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

// Query heads per block: the largest of 8, 4, 2, 1 that divides the GQA group (4 at most for
// head size 256, registers allowing). The key range is then split for about kTargetBlocks
// blocks in all (4 blocks of 128 threads per SM fit the kernels' registers at 4 heads per
// block; 132 SMs on an H100 / H200):
//  - in a cluster (sm_90) when at most kMaxClusterSplits ranges of 32..kMaxClusterKeys keys
//    do: no second kernel and no round trip through memory, and short ranges (one step of
//    the key loop) since the blocks of one cluster merge cheaply;
//  - else in ranges of 64..kMaxSplitKeys keys merged by combine_kernel. Measured on the H200
//    (docs/perf-notes.md): this beat ranges sized to fill waves of an assumed 3 blocks per SM.
DecodeAttentionPlan plan_decode_attention(const DecodeAttentionArgs& a) {
  static const int min_keys_set = int(round_up_32(env_int("KILN_CUDA_ATTN_MIN_KEYS", 0)));
  static const int min_cluster_keys = std::clamp(min_keys_set > 0 ? min_keys_set : 32, 32, detail::kMaxClusterKeys);
  static const int min_combined_keys = std::clamp(min_keys_set > 0 ? min_keys_set : 64, 32, detail::kMaxSplitKeys);
  static const bool prefetch = env_int("KILN_CUDA_ATTN_PREFETCH", 1) != 0;
  DecodeAttentionPlan plan;
  plan.prefetch = prefetch;
  if (a.n_seq <= 0 || a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.max_context <= 0)
    return plan;  // decode_attention() refuses these
  const int group = a.n_head / a.n_head_kv;
  static const int max_heads = env_int("KILN_CUDA_ATTN_MAX_HEADS", 8);
  for (int h : {8, 4, 2, 1})
    if (group % h == 0 && !(a.head_dim == 256 && h > 4) && (h <= max_heads || h == 1)) {
      plan.heads_per_block = h;
      break;
    }
  const int64_t span = a.sliding_window > 0 && a.sliding_window < a.max_context ? a.sliding_window : a.max_context;
  const int64_t base_blocks = int64_t(a.n_seq) * (a.n_head / plan.heads_per_block);
  const int64_t wanted = (detail::kTargetBlocks + base_blocks - 1) / base_blocks;
  if (decode_attention_clusters_available()) {
    const int64_t splits = std::min<int64_t>(wanted, kMaxClusterSplits);
    const int64_t keys = std::max<int64_t>(round_up_32((span + splits - 1) / splits), min_cluster_keys);
    if (keys <= detail::kMaxClusterKeys) {
      plan.keys_per_split = int(keys);
      plan.n_splits = int((span + keys - 1) / keys);
      plan.cluster = plan.n_splits > 1;
      return plan;
    }
  }
  int64_t keys = (span + wanted - 1) / wanted;
  keys = std::clamp<int64_t>(round_up_32(keys), min_combined_keys, detail::kMaxSplitKeys);
  plan.keys_per_split = int(keys);
  plan.n_splits = int((span + keys - 1) / keys);
  return plan;
}

// Scratch for the second kernel's records (a cluster merges without).
size_t decode_attention_scratch_bytes(const DecodeAttentionArgs& a) {
  if (a.n_seq <= 0 || a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.max_context <= 0)
    return 0;
  const DecodeAttentionPlan plan = plan_decode_attention(a);
  if (plan.n_splits == 1 || plan.cluster) return 0;
  return size_t(a.n_seq) * a.n_head * plan.n_splits * (a.head_dim + 2) * sizeof(float);
}

Status decode_attention(const DecodeAttentionArgs& a, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
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
  const DecodeAttentionPlan plan = plan_decode_attention(a);
  const size_t need = decode_attention_scratch_bytes(a);
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
