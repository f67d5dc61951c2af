#pragma once
// The decode attention kernels (see attention.h), instantiated per head size in
// attention_d64.cu, attention_d128.cu and attention_d256.cu so that they compile in parallel.
//
// Grid: (sequence, group of kHeads query heads that share one kv head, key range). A block
// of 128 threads (512 for a wide plan: one range, four times the keys per step) loads its
// queries into shared memory; then kLanesPerKey = D/8 threads
// share a key, each reading 8 elements of its K and V rows with 16-byte loads (several keys
// in flight), reduce the partial q.k with warp shuffles, and fold the key into a running
// softmax (online: max, sum, unnormalized output). The groups' states merge through
// shuffles and shared memory. One range: the block writes the normalized output. Several
// ranges merge
//   - in a thread block cluster (kCluster, the ranges of one head group are its blocks):
//     each block leaves its state in its shared memory, and after a cluster barrier the
//     blocks with keys each finish a share of the outputs, reading every range's state
//     through distributed shared memory (merge_in_cluster); or
//   - through (max, sum, unnormalized output) records in global memory, which
//     combine_kernel merges.
// Before waiting for the kernel before it (launch.cuh), a block reads its token's position
// and block table (uploads) and asks L2 for the K and V rows of its keys, so that the loads
// after the wait find them there. A block whose range holds none of its token's keys waits
// for nothing: it leaves at once, or in a cluster only joins the barriers. With
// DecodeAttentionPlan::trigger_early a block lets the next kernel be scheduled first thing,
// not after its wait (the next kernel still waits for this one's end).
// With kNewToken (DecodeNewToken) the block normalizes and rotates its queries as it loads
// them (the norm weights loaded before the wait), and the block whose range holds the
// token's position computes that key itself (prepare_new_token, attention_new_token.cuh) and
// reads it from shared memory, not the cache.
#include <cooperative_groups.h>

#include <string>
#include <type_traits>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_new_token.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"

namespace kiln::cuda::detail {

inline constexpr int kAttnThreads = 128;
inline constexpr int kAttnWarps = kAttnThreads / kWarpSize;
inline constexpr int kWideAttnThreads = 512;   // blocks of a one-range plan (DecodeAttentionPlan::wide)
inline constexpr int kMaxSplitKeys = 512;      // keys one block handles at most
inline constexpr int kMaxClusterKeys = 128;    // ... in a cluster plan (longer: more blocks, second kernel)
// (plan_decode_attention in attention.cu picks the ranges; kMaxClusterSplits in attention.h)
inline constexpr int kTargetBlocks = 4 * 132;  // blocks the split plan aims at (132 SMs)

// Asks L2 for `bytes` (a multiple of 16) from the 16-byte aligned global address p (sm_90
// bulk prefetch; no registers, no wait, no effect on what later loads read).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(__cvta_generic_to_global(p)), "r"(bytes)
               : "memory");
#endif
}

template <typename KV>
__device__ __forceinline__ void load8(const KV* p, float* v);
template <>
__device__ __forceinline__ void load8<__half>(const __half* p, float* v) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
template <>
__device__ __forceinline__ void load8<float>(const float* p, float* v) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ int64_t slot_of(const DecodeAttentionArgs& a, const int32_t* table, int pos) {
  return int64_t(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
}

// Merges (m2, l2, acc2) into (m, l, acc): both rescaled to the larger maximum. A state with
// m = -inf (no keys yet) contributes nothing.
__device__ __forceinline__ void merge_state(float& m, float& l, float (&acc)[8], float m2, float l2, const float* acc2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  const float c1 = expf(m - mx), c2 = expf(m2 - mx);
  l = l * c1 + l2 * c2;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = acc[e] * c1 + acc2[e] * c2;
  m = mx;
}

// Where value e of sequence seq's output row goes in its int8 copy (out_q8): the calling
// warp holds 32 consecutive values, one int8 block, one per lane.
__device__ __forceinline__ void store_q8_piece(const DecodeAttentionArgs& a, int seq, int64_t e, float value) {
  const int64_t n = int64_t(a.n_head) * a.head_dim;
  uint8_t* row = a.out_q8 + int64_t(seq) * a.out_q8_row_bytes;
  const float v[1] = {value};
  quantize_block_spread<kWarpSize, 1>(v, reinterpret_cast<int8_t*>(row) + e,
                                      reinterpret_cast<float2*>(row + (n + 15) / 16 * 16) + e / 32);
}

// The key ranges that hold keys of sequence seq's token (ranges past its position are empty).
__device__ __forceinline__ int ranges_with_keys(const DecodeAttentionArgs& a, int pos, int keys_per_split,
                                                int n_splits) {
  const int first = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  return min(n_splits, (pos - first + keys_per_split) / keys_per_split);
}

// The ranges of one (sequence, head group) are the blocks of one cluster, rank = range. Each
// block with keys has left, per head, (max, sum) in ml_s and its unnormalized output in
// part_s. The blocks with keys (ranks 0 .. n_active - 1) then share the kHeads * D outputs
// out in pieces of 32 (a warp's), each lane merging one output over the ranges with keys
// (rescaled to their common maximum; the sink joins the maximum and the denominator). Every
// block of the cluster calls this: both barriers count all of them.
template <int D, int kHeads>
__device__ void merge_in_cluster(const DecodeAttentionArgs& a, int seq, int head0, int n_active, float* part_s,
                                 float* ml_s) {
  namespace cg = cooperative_groups;
  constexpr int kPieces = kHeads * D / kWarpSize;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every range's state is in place (release / acquire over the cluster)
  const int rank = int(cluster.block_rank()), warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (rank < n_active) {
    for (int piece = rank * kAttnWarps + warp; piece < kPieces; piece += n_active * kAttnWarps) {
      const int i = piece * kWarpSize + lane, h = i / D, head = head0 + h;
      // All ranges' values requested at once (distributed shared memory), then merged.
      float mr[kMaxClusterSplits], lr[kMaxClusterSplits], vr[kMaxClusterSplits];
#pragma unroll
      for (int r = 0; r < kMaxClusterSplits; ++r) {
        mr[r] = -INFINITY, lr[r] = 0.0f, vr[r] = 0.0f;
        if (r < n_active) {
          const float* ml = cluster.map_shared_rank(ml_s, r);
          mr[r] = ml[2 * h], lr[r] = ml[2 * h + 1], vr[r] = cluster.map_shared_rank(part_s, r)[i];
        }
      }
      float m = a.sinks ? a.sinks[head] : -INFINITY;
#pragma unroll
      for (int r = 0; r < kMaxClusterSplits; ++r) m = fmaxf(m, mr[r]);
      float denom = a.sinks ? expf(a.sinks[head] - m) : 0.0f, sum = 0.0f;
#pragma unroll
      for (int r = 0; r < kMaxClusterSplits; ++r)
        if (r < n_active) {
          const float w = expf(mr[r] - m);
          denom += lr[r] * w;
          sum += vr[r] * w;
        }
      const float value = sum / denom;
      const int64_t e = int64_t(head0) * D + i;
      a.out[int64_t(seq) * a.out_stride + e] = value;
      if (a.out_q8) store_q8_piece(a, seq, e, value);
    }
  }
  cluster.sync();  // no block leaves while another may still read its shared memory
}

template <int D, typename KV, int kHeads, bool kSoftcap, bool kCluster, bool kNewToken = false,
          int kThreads = kAttnThreads>
__global__ void __launch_bounds__(kThreads)
    attention_kernel(DecodeAttentionArgs a, int keys_per_split, int n_splits, bool prefetch, bool trigger_early,
                     float* __restrict__ partial) {
  constexpr int kLanesPerKey = D / 8;
  constexpr int kWarps = kThreads / kWarpSize;
  constexpr int kKeyGroups = kThreads / kLanesPerKey;
  constexpr int kUnroll = kHeads >= 8 ? 2 : 4;  // keys per group and step (registers allowing)
  __shared__ __align__(16) float q_s[kHeads][D];
  __shared__ float red_s[kWarps][kHeads][D];  // in a cluster, red_s[0] then holds the block's output
  __shared__ float stat_s[kWarps][kHeads][2];
  __shared__ float ml_s[kHeads][2];  // in a cluster: the block's (max, sum) per head
  __shared__ __align__(16) std::conditional_t<kNewToken, NewTokenShared<D>, NoNewToken> new_s;

  const int seq = blockIdx.x, head0 = blockIdx.y * kHeads, split = blockIdx.z;
  const int kv_head = head0 / (a.n_head / a.n_head_kv);
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int group = tid / kLanesPerKey, c = tid % kLanesPerKey;
  // The next kernel waits for this one's end either way; triggered here, its blocks can be
  // placed (and load their weights) while this one waits and runs.
  if (trigger_early) allow_next_kernel();
  // Positions and block tables are uploads (attention.h): read before the wait.
  const int pos = a.positions[seq];
  const int first = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  const int k0 = first + split * keys_per_split;
  const int n_keys = max(0, min(keys_per_split, pos + 1 - k0));
  const int64_t table_row = a.table_rows ? a.table_rows[seq] : seq;
  const int32_t* table = a.block_tables + table_row * a.block_table_stride;
  const KV* k_head = static_cast<const KV*>(a.k_cache) + int64_t(kv_head) * D;
  const KV* v_head = static_cast<const KV*>(a.v_cache) + int64_t(kv_head) * D;
  if (prefetch)
    for (int j = tid; j < n_keys; j += kThreads) {
      const int64_t slot = slot_of(a, table, k0 + j);
      prefetch_l2(k_head + slot * a.k_slot_stride, D * sizeof(KV));
      prefetch_l2(v_head + slot * a.v_slot_stride, D * sizeof(KV));
    }
  std::conditional_t<kNewToken, LaneNormWeights<D>, NoNewToken> norm_weights;
  if constexpr (kNewToken)
    if (n_keys > 0) load_lane_norm_weights<D>(a.new_token, norm_weights);
  if (n_keys == 0) {  // nothing of this token here: needs no input, leaves nothing to merge
    if (!trigger_early) allow_next_kernel();
    if constexpr (kCluster) merge_in_cluster<D, kHeads>(a, seq, head0, 0, &red_s[0][0][0], &ml_s[0][0]);
    return;
  }
  begin_chained_kernel(trigger_early);
  const KV* k_base = k_head + 8 * c;
  const KV* v_base = v_head + 8 * c;

  // The range's last key is the token's own when it holds the token's position.
  const bool holds_key = kNewToken && k0 + n_keys - 1 == pos;
  // An f16 cache takes an f16 query (as llama.cpp's flash attention and the CPU backend):
  // the products are then exact and only the f32 sums round.
  if constexpr (kNewToken) {
    prepare_new_token<D, KV, kHeads, kThreads>(a, seq, head0, kv_head, holds_key, norm_weights, q_s, new_s);
  } else {
    for (int i = tid; i < kHeads * D; i += kThreads)
      q_s[i / D][i % D] = rounded_as<KV>(a.q[int64_t(seq) * a.q_stride + int64_t(head0 + i / D) * D + i % D]);
  }
  __syncthreads();
  trace_stamp(1);  // trace builds: the queries (and the token's key) in shared memory
  // Each key group keeps a running softmax state per head over its keys: max m, sum l and
  // the unnormalized output (8 dims per lane). Loop bounds are uniform over the block so
  // that every lane takes part in the shuffles; keys past the range count as -inf.
  float m[kHeads], l[kHeads], acc[kHeads][8];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[h][e] = 0.0f;
  }
  for (int base = 0; base < n_keys; base += kUnroll * kKeyGroups) {
    float kv[kUnroll][8], vv[kUnroll][8];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kKeyGroups + group;
      valid[u] = j < n_keys;
      if constexpr (kNewToken) {
        if (holds_key && j == n_keys - 1) {  // the token's own key: not in the cache yet
#pragma unroll
          for (int e = 0; e < 8; ++e) kv[u][e] = new_s.key[8 * c + e], vv[u][e] = new_s.value[8 * c + e];
          continue;
        }
      }
      if (valid[u]) {
        const int64_t slot = slot_of(a, table, k0 + j);
        load8(k_base + slot * a.k_slot_stride, kv[u]);
        load8(v_base + slot * a.v_slot_stride, vv[u]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) kv[u][e] = 0.0f, vv[u][e] = 0.0f;
      }
    }
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const float4 qa = *reinterpret_cast<const float4*>(&q_s[h][8 * c]);
      const float4 qb = *reinterpret_cast<const float4*>(&q_s[h][8 * c + 4]);
      float s[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float d = qa.x * kv[u][0] + qa.y * kv[u][1] + qa.z * kv[u][2] + qa.w * kv[u][3] + qb.x * kv[u][4] +
                  qb.y * kv[u][5] + qb.z * kv[u][6] + qb.w * kv[u][7];
#pragma unroll
        for (int offset = kLanesPerKey / 2; offset > 0; offset >>= 1) d += __shfl_xor_sync(kFullMask, d, offset);
        d *= a.scale;
        if constexpr (kSoftcap) d = a.softcap * tanhf(d / a.softcap);
        s[u] = valid[u] ? d : -INFINITY;
      }
      float mx = m[h];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) mx = fmaxf(mx, s[u]);
      // No branch (groups of one warp must stay converged): a group without keys so far
      // has mx = -inf; exponents are then taken against 0 and all give 0.
      const float ref = mx == -INFINITY ? 0.0f : mx;
      const float rescale = expf(m[h] - ref);
      l[h] *= rescale;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] *= rescale;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float p = expf(s[u] - ref);  // 0 for keys past the range
        l[h] += p;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] = fmaf(p, vv[u][e], acc[h][e]);
      }
      m[h] = mx;
    }
  }

  // Key groups of one warp merge through shuffles, warps through shared memory.
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
#pragma unroll
    for (int offset = kLanesPerKey; offset < kWarpSize; offset <<= 1) {
      const float m2 = __shfl_xor_sync(kFullMask, m[h], offset), l2 = __shfl_xor_sync(kFullMask, l[h], offset);
      float acc2[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc2[e] = __shfl_xor_sync(kFullMask, acc[h][e], offset);
      merge_state(m[h], l[h], acc[h], m2, l2, acc2);
    }
    if (lane < kLanesPerKey) {
#pragma unroll
      for (int e = 0; e < 8; ++e) red_s[warp][h][8 * c + e] = acc[h][e];
      if (lane == 0) stat_s[warp][h][0] = m[h], stat_s[warp][h][1] = l[h];
    }
  }
  __syncthreads();

  for (int i = tid; i < kHeads * D; i += kThreads) {
    const int h = i / D, d = i % D, head = head0 + h;
    float mt = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mt = fmaxf(mt, stat_s[w][h][0]);
    float lt = 0.0f, sum = 0.0f;
    if (mt != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = expf(stat_s[w][h][0] - mt);  // 0 for a warp without keys
        lt += stat_s[w][h][1] * f;
        sum += red_s[w][h][d] * f;
      }
    }
    if constexpr (kCluster) {
      red_s[0][h][d] = sum;  // element (h, d) is read and written by this thread alone here
      if (d == 0) ml_s[h][0] = mt, ml_s[h][1] = lt;
    } else if (n_splits == 1) {
      // The sink joins the normalization: rescale to the larger of the two maxima.
      float scale_acc = 1.0f, denom = lt;
      if (a.sinks) {
        const float sink = a.sinks[head];
        const float m2 = fmaxf(mt, sink);
        scale_acc = expf(mt - m2);
        denom = lt * scale_acc + expf(sink - m2);
      }
      const float value = sum * scale_acc / denom;
      const int64_t e = int64_t(head) * D + d;
      a.out[int64_t(seq) * a.out_stride + e] = value;
      if (a.out_q8) store_q8_piece(a, seq, e, value);  // a warp holds 32 consecutive outputs
    } else {
      float* rec = partial + ((int64_t(seq) * a.n_head + head) * n_splits + split) * (D + 2);
      rec[2 + d] = sum;
      if (d == 0) rec[0] = mt, rec[1] = lt;
    }
  }
  trace_stamp(3);  // thread 0's outputs (or its share of the records) written
  if constexpr (kCluster)
    merge_in_cluster<D, kHeads>(a, seq, head0, ranges_with_keys(a, pos, keys_per_split, n_splits), &red_s[0][0][0],
                                &ml_s[0][0]);
}

// Merges the key ranges of one (sequence, head) that hold keys: rescales each to the common
// maximum.
template <int D>
__global__ void __launch_bounds__(D)
    combine_kernel(DecodeAttentionArgs a, int keys_per_split, int n_splits, const float* __restrict__ partial) {
  const int seq = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
  const int n_active = ranges_with_keys(a, a.positions[seq], keys_per_split, n_splits);  // an upload: before the wait
  begin_chained_kernel();
  const float* recs = partial + (int64_t(seq) * a.n_head + head) * n_splits * (D + 2);
  float m = a.sinks ? a.sinks[head] : -INFINITY;
  for (int s = 0; s < n_active; ++s) m = fmaxf(m, recs[s * (D + 2)]);
  float denom = a.sinks ? expf(a.sinks[head] - m) : 0.0f, sum = 0.0f;
  for (int s = 0; s < n_active; ++s) {
    const float* rec = recs + s * (D + 2);
    const float w = expf(rec[0] - m);
    denom += rec[1] * w;
    sum += rec[2 + d] * w;
  }
  const float value = sum / denom;
  const int64_t e = int64_t(head) * D + d;
  a.out[int64_t(seq) * a.out_stride + e] = value;
  if (a.out_q8) store_q8_piece(a, seq, e, value);  // a warp holds 32 consecutive outputs
}

template <int D, typename KV, int kHeads, bool kSoftcap, bool kNewToken>
Status launch_ranges(const DecodeAttentionArgs& a, const DecodeAttentionPlan& plan, float* partial,
                     cudaStream_t stream) {
  const dim3 grid(unsigned(a.n_seq), unsigned(a.n_head / kHeads), unsigned(plan.n_splits));
  if (plan.wide) {  // one range, no merge (decode_attention checked the plan)
    if constexpr (kHeads <= kMaxWideHeads) {
      launch_chained(attention_kernel<D, KV, kHeads, kSoftcap, false, kNewToken, kWideAttnThreads>, grid,
                     kWideAttnThreads, 0, stream, a, plan.keys_per_split, 1, plan.prefetch, plan.trigger_early, partial);
      return launch_status("attention_kernel (one range, 512 threads)");
    }
    return Status::invalid("decode_attention: internal: a wide plan of " + std::to_string(kHeads) + " heads");
  }
  if (plan.cluster) {
    const auto kernel = attention_kernel<D, KV, kHeads, kSoftcap, true, kNewToken>;
    // Clusters above the portable 8 blocks: allowed once for each kernel (this instantiation).
    static const cudaError_t large = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (large != cudaSuccess) return Status::from_cuda(large, "decode_attention: clusters of up to 16 blocks");
    launch_chained_in_clusters(kernel, grid, dim3(1, 1, unsigned(plan.n_splits)), kAttnThreads, 0, stream, a,
                               plan.keys_per_split, plan.n_splits, plan.prefetch, plan.trigger_early, partial);
    return launch_status("attention_kernel (ranges merged in a cluster)");
  }
  launch_chained(attention_kernel<D, KV, kHeads, kSoftcap, false, kNewToken>, grid, kAttnThreads, 0, stream, a,
                 plan.keys_per_split, plan.n_splits, plan.prefetch, plan.trigger_early, partial);
  if (Status s = launch_status("attention_kernel"); !s.ok()) return s;
  if (plan.n_splits == 1) return Status();
  launch_chained(combine_kernel<D>, dim3(unsigned(a.n_seq), unsigned(a.n_head)), D, 0, stream, a,
                 plan.keys_per_split, plan.n_splits, partial);
  return launch_status("attention combine_kernel");
}

template <int D, typename KV, int kHeads>
Status launch_heads(const DecodeAttentionArgs& a, const DecodeAttentionPlan& plan, float* partial, cudaStream_t stream) {
  // The new token's head norms and rope (decode_attention refused them with softcap).
  if (a.new_token.k) return launch_ranges<D, KV, kHeads, false, true>(a, plan, partial, stream);
  if (a.softcap > 0.0f) return launch_ranges<D, KV, kHeads, true, false>(a, plan, partial, stream);
  return launch_ranges<D, KV, kHeads, false, false>(a, plan, partial, stream);
}

template <int D, typename KV>
Status launch_dim(const DecodeAttentionArgs& a, const DecodeAttentionPlan& plan, float* partial, cudaStream_t stream) {
  switch (plan.heads_per_block) {
    case 1: return launch_heads<D, KV, 1>(a, plan, partial, stream);
    case 2: return launch_heads<D, KV, 2>(a, plan, partial, stream);
    case 4: return launch_heads<D, KV, 4>(a, plan, partial, stream);
    default:
      if constexpr (D <= 128) return launch_heads<D, KV, 8>(a, plan, partial, stream);
      return Status::invalid("decode_attention: internal: 8 heads per block with head_dim 256");
  }
}

// Launches for one head size, both cache types (explicitly instantiated per head size).
template <int D>
Status launch_head_dim(const DecodeAttentionArgs& a, const DecodeAttentionPlan& plan, float* partial,
                       cudaStream_t stream) {
  if (a.cache_type == GgmlType::F16) return launch_dim<D, __half>(a, plan, partial, stream);
  return launch_dim<D, float>(a, plan, partial, stream);
}
extern template Status launch_head_dim<64>(const DecodeAttentionArgs&, const DecodeAttentionPlan&, float*, cudaStream_t);
extern template Status launch_head_dim<128>(const DecodeAttentionArgs&, const DecodeAttentionPlan&, float*, cudaStream_t);
extern template Status launch_head_dim<256>(const DecodeAttentionArgs&, const DecodeAttentionPlan&, float*, cudaStream_t);

}  // namespace kiln::cuda::detail
