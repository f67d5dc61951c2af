// rope of q and k plus the KV-cache store in one launch (see rope_store.h). Grid: (tokens,
// q head groups + k head groups + v pieces); every block of a token reads its angles from
// the pass's rope_table or, without one, computes them.
#include "backend/cuda/launch.cuh"
#include "backend/cuda/rope_math.cuh"
#include "backend/cuda/rope_store.h"

namespace kiln::cuda {
namespace detail {

constexpr int kRopeStoreThreads = 128;
constexpr int kValuesPerPiece = 2 * kRopeStoreThreads;

static_assert(kRopeStoreThreads / kWarpSize == kRopeHeadsPerBlock, "one warp per head for the head norms");

// Per-head RMS norm in place, one warp per head of the block's heads (norm_head_in_place).
__device__ void norm_heads(const RopeArgs& a, int64_t t, int64_t first_head, const float* weight, float eps) {
  const int64_t head = first_head + threadIdx.x / kWarpSize;
  if (head >= a.n_heads) return;
  norm_head_in_place(a.x + t * a.token_stride + head * a.head_stride, int(a.head_dim), weight, eps);
}

template <typename KV>
__global__ void __launch_bounds__(kRopeStoreThreads)
    rope_store_kernel(RopeArgs q, RopeArgs k, KvStoreArgs st, RopeConstants c, int q_groups, int k_groups,
                      const float* angles, HeadNorms norms) {
  __shared__ float cos_s[kMaxRopeHalf], sin_s[kMaxRopeHalf];
  const int64_t t = blockIdx.x;
  const int y = int(blockIdx.y);
  const int64_t slot = st.slots[t];  // uploaded before the step
  const bool slot_ok = slot >= 0 && slot < st.n_slots;  // never write outside the cache
  if (y >= q_groups + k_groups) {  // a piece of the values
    begin_chained_kernel();
    if (!slot_ok) return;
    KV* row = static_cast<KV*>(st.cache_v) + slot * st.cache_v_stride;
    const int64_t first = int64_t(y - q_groups - k_groups) * kValuesPerPiece;
    const int64_t end = min64(first + kValuesPerPiece, st.v_width);
    for (int64_t i = first + threadIdx.x; i < end; i += blockDim.x) store_as(row + i, st.v[t * st.v_stride + i]);
    return;
  }
  const bool is_k = y >= q_groups;
  // A copy, not a reference: a reference chosen at run time between two parameters puts both
  // in local memory, and every field read below would go through it.
  const RopeArgs a = is_k ? k : q;
  if (!angles) rope_angles(a, c, t, cos_s, sin_s);
  begin_chained_kernel();
  if (angles) {  // the pass's table, written by a kernel before this one
    const int half = a.n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x)
      cos_s[i] = angles[t * a.n_rot + i], sin_s[i] = angles[t * a.n_rot + half + i];
  }
  const int64_t first_head = int64_t(is_k ? y - q_groups : y) * kRopeHeadsPerBlock;
  if (const float* w = is_k ? norms.k : norms.q) norm_heads(a, t, first_head, w, norms.eps);
  __syncthreads();  // the angles, and the normed heads (global memory, read by other threads)
  KV* cache_row = is_k && slot_ok ? static_cast<KV*>(st.cache_k) + slot * st.cache_k_stride : nullptr;
  rotate_heads(a, t, first_head, kRopeHeadsPerBlock, cache_row, cos_s, sin_s);
}

__global__ void __launch_bounds__(kRopeStoreThreads) rope_table_kernel(RopeArgs a, RopeConstants c, float* table) {
  begin_chained_kernel();  // the kernel before may still read the table of the previous pass
  float* row = table + int64_t(blockIdx.x) * a.n_rot;
  rope_angles(a, c, blockIdx.x, row, row + a.n_rot / 2);
}

}  // namespace detail

Status rope_table(const RopeArgs& rope, float* table, cudaStream_t stream) {
  detail::RopeConstants c;
  if (Status s = detail::rope_constants(rope, &c); !s.ok()) return s;
  if (!table) return Status::invalid("rope_table: no table");
  launch_chained(detail::rope_table_kernel, unsigned(rope.n_tokens), detail::kRopeStoreThreads, 0, stream, rope, c,
                 table);
  return launch_status("rope_table_kernel");
}

Status rope_store(const RopeArgs& q, const RopeArgs& k, const KvStoreArgs& st, cudaStream_t stream,
                  const float* angles, const HeadNorms& norms) {
  detail::RopeConstants c;
  if (Status s = detail::rope_constants(q, &c); !s.ok()) return s;
  if (Status s = detail::rope_constants(k, &c); !s.ok()) return s;
  if (!detail::same_rotation(q, k))
    return Status::invalid("rope_store: q and k must share positions and rope parameters");
  if (k.head_stride != k.head_dim || st.k != k.x || st.k_stride != k.token_stride ||
      st.k_width != k.n_heads * k.head_dim || st.n_tokens != k.n_tokens || !st.slots || !st.v)
    return Status::invalid("rope_store: k must be packed heads, the same rows as the store's keys");
  if ((norms.q || norms.k) && (q.head_dim > kMaxHeadNormDim || q.head_stride != q.head_dim))
    return Status::invalid("rope_store: head norms take packed heads of at most " +
                           std::to_string(kMaxHeadNormDim) + " values");
  if (st.cache_type != GgmlType::F32 && st.cache_type != GgmlType::F16)
    return Status::invalid("rope_store: cache type " + std::string(type_name(st.cache_type)) + " (f32 or f16)");
  const int64_t q_groups = (q.n_heads + detail::kRopeHeadsPerBlock - 1) / detail::kRopeHeadsPerBlock;
  const int64_t k_groups = (k.n_heads + detail::kRopeHeadsPerBlock - 1) / detail::kRopeHeadsPerBlock;
  const int64_t v_pieces = (st.v_width + detail::kValuesPerPiece - 1) / detail::kValuesPerPiece;
  if (q_groups + k_groups + v_pieces > 65535) return Status::invalid("rope_store: too many heads");
  const dim3 grid(unsigned(q.n_tokens), unsigned(q_groups + k_groups + v_pieces));
  if (st.cache_type == GgmlType::F16)
    launch_chained(detail::rope_store_kernel<__half>, grid, detail::kRopeStoreThreads, 0, stream, q, k, st, c,
                   int(q_groups), int(k_groups), angles, norms);
  else
    launch_chained(detail::rope_store_kernel<float>, grid, detail::kRopeStoreThreads, 0, stream, q, k, st, c,
                   int(q_groups), int(k_groups), angles, norms);
  return launch_status("rope_store_kernel");
}

}  // namespace kiln::cuda
