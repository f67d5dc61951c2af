#pragma once
// The router sums of PairEpilogueKind::RouterSums (matvec_grouped.h), the part the grouped
// kernel (matvec_grouped_kernel.cuh) adds to an attention output product whose rows
// accumulate into the residual stream: each block adds, for every expert e, its rows' terms
// router_t[i][e] * norm_weight[i] * h_i (h_i the residual's new value) to sums[e]. The MoE
// front that ran as a kernel of its own between that product and the experts (norm, router
// logits, routing: moe_router.cu) then needs no launch: logit_e = sums[e] / rms(h) (+ bias),
// and the experts' gate / up kernel computes rms(h) and the routing from them itself
// (moe_tiled_decode.cu).
//
// Lane l of a warp holds the terms of experts l, l + 32, l + 64, l + 96; a task's router rows
// (and norm weights) are loaded at its first chunk, so that they have arrived by its end. The
// block adds its warps' sums in a fixed order, then one double atomic an expert. Block 0 also
// sets router.zero back to zero after the wait (the sums of the MoE layer before: their
// readers, that layer's experts, have ended by then).
#include "backend/cuda/common.cuh"
#include "backend/cuda/matvec_grouped.h"

namespace kiln::cuda::detail {

constexpr int kRouterSumsPerLane = kRouterSumsMaxExperts / kWarpSize;

// After the wait: the previous layer's sums set back to zero. Every thread of the block calls it.
__device__ __forceinline__ void zero_previous_router_sums(const RouterSumsEpilogue& r) {
  if (r.zero && blockIdx.x == 0 && threadIdx.x < kRouterSumsMaxExperts) r.zero[threadIdx.x] = 0.0;
}

// One task's rows of the router (this lane's experts) and their norm weights.
template <int kSlots>
struct RouterRows {
  float w[kSlots][kRouterSumsPerLane];
  float g[kSlots];
};

// Rows first_row .. first_row + kSlots - 1 (those below `rows`; zeros past it). The whole warp
// calls it.
template <int kSlots>
__device__ __forceinline__ void load_router_rows(const RouterSumsEpilogue& r, int first_row, int rows,
                                                 RouterRows<kSlots>& out) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int row = first_row + s;
    const bool in = row < rows;
    out.g[s] = in ? __ldg(r.norm_weight + row) : 0.0f;
#pragma unroll
    for (int k = 0; k < kRouterSumsPerLane; ++k) {
      const int e = lane + k * kWarpSize;
      out.w[s][k] = in && e < r.n_expert ? __ldg(r.router_t + int64_t(row) * r.n_expert + e) : 0.0f;
    }
  }
}

// Adds the task's rows' terms: slot s's new residual value is `h` of lane s * kLanesPerRow.
// The whole warp calls it.
template <int kSlots, int kLanesPerRow>
__device__ __forceinline__ void add_router_rows(const RouterRows<kSlots>& rows, float h,
                                                float (&acc)[kRouterSumsPerLane]) {
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const float hs = __fmul_rn(__shfl_sync(kFullMask, h, s * kLanesPerRow), rows.g[s]);
#pragma unroll
    for (int k = 0; k < kRouterSumsPerLane; ++k) acc[k] = fmaf(rows.w[s][k], hs, acc[k]);
  }
}

// The block's sums (its warps' in order) added to r.sums. Every thread of the block calls it.
template <int kWarps>
__device__ __forceinline__ void add_block_router_sums(const RouterSumsEpilogue& r,
                                                      const float (&acc)[kRouterSumsPerLane]) {
  __shared__ float warp_sums[kWarps][kRouterSumsMaxExperts];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int k = 0; k < kRouterSumsPerLane; ++k) warp_sums[warp][lane + k * kWarpSize] = acc[k];
  __syncthreads();
  const int e = threadIdx.x;
  if (e >= r.n_expert) return;
  float sum = warp_sums[0][e];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) sum += warp_sums[w][e];
  atomicAdd(r.sums + e, double(sum));
}

}  // namespace kiln::cuda::detail
