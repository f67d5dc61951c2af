#pragma once
// The start of a decode attention block that takes its token's head norms, rope and cache
// store in (DecodeNewToken, attention.h): what rope_store_kernel (rope_store.cu) does for the
// token's heads, done on the heads this block uses with the same norm and rotation
// arithmetic (rope_math.cuh), so that the values are the same bits.
//
// A warp per head (a query head, the token's key, its value): lane l holds the head's values
// l, l + 32, ... in registers. A warp with several heads (8 query heads on 4 warps) takes
// them side by side, so that their dependent steps (loads, the norm's warp sum, the
// partner's value for the rotation) overlap instead of adding up.
#include <type_traits>

#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/rope_math.cuh"

namespace kiln::cuda::detail {

// x as a cache of KV stores it and gives it back (rounded to f16 for an f16 cache).
template <typename KV>
__device__ __forceinline__ float rounded_as(float x) {
  if constexpr (std::is_same_v<KV, __half>) return __half2float(__float2half_rn(x));
  return x;
}

// The token's key and value of the block's kv head, for the key loop (shared memory).
template <int D>
struct NewTokenShared {
  float key[D], value[D];
};
struct NoNewToken {};  // the shared memory of a block that does not take its token in

// This lane's norm weights (values lane, lane + 32, ...), loaded before the wait for the
// kernel before: weights are loaded with the model, no kernel of the step writes them.
template <int D>
struct LaneNormWeights {
  float q[D / kWarpSize], k[D / kWarpSize];
};
template <int D>
__device__ void load_lane_norm_weights(const DecodeNewToken& nt, LaneNormWeights<D>& w) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int j = 0; j < D / kWarpSize; ++j) {
    w.q[j] = nt.q_norm ? nt.q_norm[j * kWarpSize + lane] : 1.0f;
    w.k[j] = nt.k_norm ? nt.k_norm[j * kWarpSize + lane] : 1.0f;
  }
}

// After the wait (q, k and v are the kernel before's outputs; the angles are a kernel's
// earlier in the step): leaves the block's kHeads query heads (from head0) of sequence seq in
// q_s, RMS-normalized where a q weight is given, rotated and rounded as the cache's type (the
// query an f16 cache takes is f16). With holds_key (the block's key range holds the token's
// position), also the token's key of kv head kv_head in s.key (normalized, rotated, rounded)
// and its value in s.value (rounded); the block of the kv head's first query head writes
// both into the cache slot. Every thread of the block calls this; the caller syncs the block
// before reading what it leaves.
template <int D, typename KV, int kHeads, int kThreads>
__device__ void prepare_new_token(const DecodeAttentionArgs& a, int seq, int head0, int kv_head, bool holds_key,
                                  const LaneNormWeights<D>& w, float (&q_s)[kHeads][D], NewTokenShared<D>& s) {
  constexpr int kPerLane = D / kWarpSize;
  constexpr int kWarps = kThreads / kWarpSize;
  constexpr int kRounds = (kHeads + 2 + kWarps - 1) / kWarps;  // heads per warp at most
  const DecodeNewToken& nt = a.new_token;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int items = kHeads + (holds_key ? 2 : 0);  // the query heads, then the key, then the value
  const int half = nt.n_rot / 2;

  // One round of loads: every head of this warp, and the angles of this lane's elements.
  float v[kRounds][kPerLane], c[kPerLane], sn[kPerLane];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int item = warp + r * kWarps;
    const float* src = item < kHeads    ? a.q + int64_t(seq) * a.q_stride + int64_t(head0 + item) * D
                       : item == kHeads ? nt.k + int64_t(kv_head) * D
                                        : nt.v + int64_t(kv_head) * D;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) v[r][j] = item < items ? src[j * kWarpSize + lane] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = j * kWarpSize + lane;
    const RopeElement e = rope_element(d, half, nt.neox);
    c[j] = d < nt.n_rot ? nt.angles[e.pair] : 1.0f;
    sn[j] = d < nt.n_rot ? nt.angles[half + e.pair] : 0.0f;
  }

  // The norms (all of this warp's heads side by side; the value is not normalized).
  float inv[kRounds];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) inv[r] = head_rms_inverse(lane_sum_of_squares(v[r]), D, nt.eps);
  float* rows[kRounds];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int item = warp + r * kWarps;
    rows[r] = item < kHeads ? q_s[item < kHeads ? item : 0] : item == kHeads ? s.key : s.value;
    const bool normed = item < kHeads ? nt.q_norm != nullptr : item == kHeads && nt.k_norm != nullptr;
    if (normed)
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) v[r][j] = head_normed(v[r][j], inv[r], item < kHeads ? w.q[j] : w.k[j]);
    if (item < items)
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) rows[r][j * kWarpSize + lane] = v[r][j];
  }
  __syncwarp();  // each element's rotation reads its partner, another lane's value

  // Every block of the group computes the same key and value; one writes them.
  const int64_t slot = *nt.slot;
  const bool writes = holds_key && head0 % (a.n_head / a.n_head_kv) == 0 && slot >= 0 && slot < nt.n_slots;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int item = warp + r * kWarps;
    if (item < items && item < kHeads + 1)  // query heads and the key rotate
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int d = j * kWarpSize + lane;
        if (d < nt.n_rot) {
          const RopeElement e = rope_element(d, half, nt.neox);
          v[r][j] = rotated_element(e, v[r][j], rows[r][e.partner], c[j], sn[j]);
        }
      }
  }
  __syncwarp();  // the partners are read: the rows may be overwritten
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int item = warp + r * kWarps;
    if (item >= items) continue;
    KV* cache_row = nullptr;
    if (writes && item == kHeads) cache_row = static_cast<KV*>(nt.k_cache) + slot * a.k_slot_stride;
    if (writes && item == kHeads + 1) cache_row = static_cast<KV*>(nt.v_cache) + slot * a.v_slot_stride;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = j * kWarpSize + lane;
      if (cache_row) store_as(cache_row + int64_t(kv_head) * D + d, v[r][j]);
      rows[r][d] = rounded_as<KV>(v[r][j]);
    }
  }
}

}  // namespace kiln::cuda::detail
