#pragma once
// The start of a decode attention block that takes its token's head norms, rope and cache
// store in (DecodeNewToken, attention.h): what rope_store_kernel (rope_store.cu) does for the
// token's heads, done in shared memory on the heads this block uses, with the same norm and
// rotation arithmetic (rope_math.cuh), so that the values are the same bits.
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

// A block's shared memory for its token (n_rot <= D).
template <int D>
struct NewTokenShared {
  float key[D], value[D];  // the token's key and value of the block's kv head
  float angles[D];         // the token's rotation: n_rot / 2 cosines, then the sines
  float q_norm[D], k_norm[D];
};
struct NoNewToken {};  // the shared memory of a block that does not take its token in

// Before the wait for the kernel before: the norm weights (loaded with the model, written by
// no kernel of the step) into shared memory.
template <int D, int kThreads>
__device__ void load_head_norm_weights(const DecodeNewToken& nt, NewTokenShared<D>& s) {
  for (int i = threadIdx.x; i < D; i += kThreads) {
    if (nt.q_norm) s.q_norm[i] = nt.q_norm[i];
    if (nt.k_norm) s.k_norm[i] = nt.k_norm[i];
  }
}

// After the wait (q, k and v are the kernel before's outputs; the angles a kernel's earlier
// in the step): loads the block's kHeads query heads (from head0) of sequence seq into q_s,
// RMS-normalized where a q weight is given, rotated and rounded as the cache's type (the
// query an f16 cache takes is f16). With holds_key (the block's key range holds the token's
// position), also the token's key of kv head kv_head into s.key (normalized, rotated,
// rounded) and its value into s.value (rounded); the block of the kv head's first query head
// writes both into the cache slot. All loads in one round, then a warp per head. Every
// thread of the block calls this; the caller syncs before reading what it leaves.
template <int D, typename KV, int kHeads, int kThreads>
__device__ void prepare_new_token(const DecodeAttentionArgs& a, int seq, int head0, int kv_head, bool holds_key,
                                  float (&q_s)[kHeads][D], NewTokenShared<D>& s) {
  constexpr int kWarps = kThreads / kWarpSize;
  const DecodeNewToken& nt = a.new_token;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  for (int i = tid; i < kHeads * D; i += kThreads)
    q_s[i / D][i % D] = a.q[int64_t(seq) * a.q_stride + int64_t(head0 + i / D) * D + i % D];
  for (int i = tid; i < nt.n_rot; i += kThreads) s.angles[i] = nt.angles[i];
  if (holds_key)
    for (int i = tid; i < D; i += kThreads) {
      s.key[i] = nt.k[int64_t(kv_head) * D + i];
      s.value[i] = nt.v[int64_t(kv_head) * D + i];
    }
  __syncthreads();
  // Every block of the group computes the same key and value; one writes them.
  const int64_t slot = *nt.slot;
  const bool writes = holds_key && head0 % (a.n_head / a.n_head_kv) == 0 && slot >= 0 && slot < nt.n_slots;
  const int half = nt.n_rot / 2;
  const int items = kHeads + (holds_key ? 2 : 0);  // the query heads, then the key, then the value
  for (int item = warp; item < items; item += kWarps) {
    const bool is_key = item == kHeads, is_value = item == kHeads + 1;
    float* x = is_value ? s.value : is_key ? s.key : q_s[item];
    KV* cache_row = nullptr;
    if (writes && is_key) cache_row = static_cast<KV*>(nt.k_cache) + slot * a.k_slot_stride;
    if (writes && is_value) cache_row = static_cast<KV*>(nt.v_cache) + slot * a.v_slot_stride;
    if (cache_row) cache_row += int64_t(kv_head) * D;
    if (!is_value) {
      if (is_key ? nt.k_norm : nt.q_norm) norm_head_in_place(x, D, is_key ? s.k_norm : s.q_norm, nt.eps);
      __syncwarp();  // the rotation pairs values of other lanes
      for (int i = lane; i < half; i += kWarpSize) {
        const int first = rope_first(i, nt.neox), second = rope_second(i, half, nt.neox);
        const float c = s.angles[i], sn = s.angles[half + i];
        const float x0 = x[first], x1 = x[second];
        x[first] = rotated_first(x0, x1, c, sn);
        x[second] = rotated_second(x0, x1, c, sn);
      }
      __syncwarp();
    }
    for (int d = lane; d < D; d += kWarpSize) {
      if (cache_row) store_as(cache_row + d, x[d]);
      x[d] = rounded_as<KV>(x[d]);
    }
  }
}

}  // namespace kiln::cuda::detail
