#pragma once
// What the grouped matvecs do with a pair of finished rows when a PairEpilogue asks
// (matvec_grouped.h): shared by the int8 kernels (matvec_grouped_kernel.cuh: rope;
// matvec_grouped_glu.cu: glu) and the f16 / bf16 one (matvec_f16_pairs.cu), so that all
// give the bits the separate rope_store and glu kernels give.
#include "backend/cuda/common.cuh"
#include "backend/cuda/glu_math.cuh"      // the activation
#include "backend/cuda/matvec_grouped.h"
#include "backend/cuda/rope_math.cuh"     // the rotation

namespace kiln::cuda::detail {

// RopeStore, for one row of a pair (slot 0: the even row 2i, slot 1: the odd one): `v` is
// this row's value, bias added, `partner` the other row's; `local` is the row within `part`
// (0 q, 1 k, 2 v) and `y` that part's output. q and k rows are rotated; the row goes to y,
// and for k and v into the cache at the token's slot.
__device__ __forceinline__ void rope_store_pair(const PairEpilogue& ep, int part, int local, int slot, float v,
                                                float partner, float* y) {
  if (part < 2) {  // q or k: rotate the pair
    const int d = local % ep.head_dim;
    if (d < ep.n_rot) {
      const int half = ep.n_rot / 2, i = d / 2;
      const float* angles = ep.angles + ep.token * ep.n_rot;  // written by a kernel before: after the wait
      const float c = angles[i], s = angles[half + i];
      const float x0 = slot == 0 ? v : partner, x1 = slot == 0 ? partner : v;
      v = slot == 0 ? rotated_first(x0, x1, c, s) : rotated_second(x0, x1, c, s);
    }
  }
  y[local] = v;
  if (part == 0) return;
  const int64_t cache_slot = ep.store.slots[ep.token];  // uploaded before the step
  if (cache_slot < 0 || cache_slot >= ep.store.n_slots) return;  // never write outside the cache
  void* cache = part == 1 ? ep.store.cache_k : ep.store.cache_v;
  const int64_t at = cache_slot * (part == 1 ? ep.store.cache_k_stride : ep.store.cache_v_stride) + local;
  if (ep.store.cache_type == GgmlType::F16)
    store_as(static_cast<__half*>(cache) + at, v);
  else
    store_as(static_cast<float*>(cache) + at, v);
}

// Glu, for row i of gate and up (biases added): both products as they are, then the
// activation, in that order, so that an activation written over gate's (or up's) own row
// is what stays. Returns the activation (the int8 kernel quantizes it too).
__device__ __forceinline__ float glu_pair(const PairEpilogue& ep, int i, float gate, float up, float* gate_y,
                                          float* up_y) {
  gate_y[i] = gate;
  up_y[i] = up;
  const float h = glu_of(ep.glu.kind, gate, up, ep.glu.alpha, ep.glu.limit);
  ep.glu.out[ep.token * ep.glu.out_stride + i] = h;
  return h;
}

}  // namespace kiln::cuda::detail
