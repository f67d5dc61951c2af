#pragma once
// The routing of one token by one warp, shared by the routing kernel (moe_route.cu) and the
// fused norm + router + routing kernel (moe_router.cu).
//
// Lane i holds the scores of experts i, i + 32, ... in registers (kPerLane of them), the
// scores are computed once, then k rounds of "largest not yet taken" across the warp; equal
// choices keep the lower expert index first, the order of the CPU backend's stable sort.
// Lane j keeps slot j's id and weight, so the optional softmax over the chosen k, the
// normalization and the scale are warp reductions too.
#include <cmath>
#include <string>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops_extra.h"

namespace kiln::cuda::route_detail {

using detail::kFullMask;
using detail::kWarpSize;

constexpr int kMaxPerLane = 32;  // n_expert <= 1024
constexpr int kMaxUsed = kWarpSize;

__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// The scores of the experts lane + 32 i (the gating applied) and the values they are chosen
// by (score + selection bias), from the logits read through `logit(e)`. The whole warp calls it.
template <int kPerLane, typename Logit>
__device__ __forceinline__ void route_scores(const MoeRouteArgs& a, Logit&& logit, float (&score)[kPerLane],
                                             float (&choose)[kPerLane]) {
  const int lane = threadIdx.x % kWarpSize;
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + kWarpSize * i;
    score[i] = e < a.n_expert ? logit(e) : -INFINITY;
    m = fmaxf(m, score[i]);
  }
  if (a.gating == 0) {  // softmax over all experts: exp in f32 and the sum in double, as the CPU
    m = detail::warp_max(m);
    double sum = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      score[i] = lane + kWarpSize * i < a.n_expert ? expf(score[i] - m) : 0.0f;
      sum += score[i];
    }
    sum = warp_sum_double(sum);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score[i] = float(double(score[i]) / sum);
  } else if (a.gating == 1) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score[i] = 1.0f / (1.0f + expf(-score[i]));
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + kWarpSize * i;
    choose[i] = score[i] + (a.selection_bias && e < a.n_expert ? a.selection_bias[e] : 0.0f);
  }
}

// Whether expert `o` (chosen by co) goes before expert `e` (chosen by ce): the larger first,
// equal ones in index order (the CPU backend's stable sort).
__device__ __forceinline__ bool goes_before(float co, int o, float ce, int e) {
  return co > ce || (co == ce && o < e);
}

// The k picks as k rounds of "first not yet taken" across the warp: lane j gets slot j's
// expert and score.
template <int kPerLane>
__device__ __forceinline__ void pick_by_rounds(const MoeRouteArgs& a, const float (&score)[kPerLane],
                                               const float (&choose)[kPerLane], int& my_id, float& my_w) {
  const int lane = threadIdx.x % kWarpSize;
  uint32_t taken = 0;  // bit i: expert lane + 32 i is chosen
  my_id = 0, my_w = 0.0f;
  for (int j = 0; j < a.n_used; ++j) {
    int best = -1;
    float best_choice = 0.0f, best_score = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + kWarpSize * i;
      if (e >= a.n_expert || ((taken >> i) & 1u)) continue;
      if (best < 0 || choose[i] > best_choice) best = e, best_choice = choose[i], best_score = score[i];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const int other = __shfl_xor_sync(kFullMask, best, offset);
      const float other_choice = __shfl_xor_sync(kFullMask, best_choice, offset);
      const float other_score = __shfl_xor_sync(kFullMask, best_score, offset);
      const bool better = other >= 0 && (best < 0 || goes_before(other_choice, other, best_choice, best));
      if (better) best = other, best_choice = other_choice, best_score = other_score;
    }
    // n_used <= n_expert, so some expert is always left: best >= 0 here.
    if (best % kWarpSize == lane) taken |= 1u << (best / kWarpSize);
    if (lane == j) my_id = best, my_w = best_score;
  }
}

// The weights of the picks (lane j: slot j's expert and score) and the stores of token t's
// ids and weights. The whole warp calls it.
__device__ __forceinline__ void finish_route(const MoeRouteArgs& a, int64_t t, int my_id, float my_w) {
  const int lane = threadIdx.x % kWarpSize;
  const bool slot = lane < a.n_used;
  if (a.gating == 2) {  // softmax over the chosen k (slot 0 holds the largest)
    const float top = __shfl_sync(kFullMask, my_w, 0);
    my_w = slot ? expf(my_w - top) : 0.0f;
    const double s = warp_sum_double(my_w);
    my_w = float(double(my_w) / s);
  }
  if (a.normalize) {
    const double s = warp_sum_double(slot ? double(my_w) : 0.0);
    my_w = float(double(my_w) / s);
  }
  if (slot) {
    a.ids[t * a.ids_stride + lane] = my_id;
    a.weights[t * a.weights_stride + lane] = my_w * a.scale;
  }
}

// rank_in_block's ranking once the values the experts are chosen by (choose_s) and their
// scores (score_s, or choose_s again) are in shared memory, written before this call: the
// slots start at id -1, a barrier, each expert counted by two threads, a barrier (at least
// 2 n threads).
__device__ __forceinline__ void rank_chosen(int n, int n_used, const float* choose_s, const float* score_s,
                                            int* slot_id, float* slot_score) {
  if (int(threadIdx.x) < n_used) slot_id[threadIdx.x] = -1, slot_score[threadIdx.x] = 0.0f;
  __syncthreads();
  const int e = threadIdx.x / 2, half = threadIdx.x % 2;
  int before = 0;
  if (e < n) {
    const float ce = choose_s[e];
    for (int o = half; o < n; o += 2) before += goes_before(choose_s[o], o, ce, e) ? 1 : 0;
  }
  before += __shfl_xor_sync(kFullMask, before, 1);
  if (e < n && half == 0 && before < n_used) slot_id[before] = e, slot_score[before] = score_s[e];
  __syncthreads();
}

// The k picks with a whole block of kThreads threads instead of a warp's k rounds: warp 0
// computes the scores; then every expert's slot is its rank, the experts that go before it
// (goes_before: the order the rounds of pick_by_rounds take, so the same picks in the same
// slots), counted by two threads an expert over halves of the others; the experts of rank < k
// write slot_id / slot_score (shared memory, n_used entries). Two block barriers instead of
// k dependent rounds of warp shuffles. Experts without a strict order (NaN logits) could share
// a rank: the slots start at id -1, which the expert kernels turn into NaN outputs, never into
// a wrong expert. Every thread of the block calls it; the slots are complete when it returns.
template <int kPerLane, int kThreads, typename Logit>
__device__ __forceinline__ void rank_in_block(const MoeRouteArgs& a, Logit&& logit, int* slot_id, float* slot_score) {
  static_assert(kPerLane * kWarpSize <= kThreads / 2, "two threads an expert");
  __shared__ float score_s[kPerLane * kWarpSize], choose_s[kPerLane * kWarpSize];
  if (threadIdx.x / kWarpSize == 0) {
    const int lane = threadIdx.x % kWarpSize;
    float score[kPerLane], choose[kPerLane];
    route_scores<kPerLane>(a, logit, score, choose);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score_s[lane + kWarpSize * i] = score[i], choose_s[lane + kWarpSize * i] = choose[i];
  }
  rank_chosen(int(a.n_expert), a.n_used, choose_s, score_s, slot_id, slot_score);
}

// Routes token t: reads its logits through `logit(e)`, writes its ids and weights. The whole
// warp calls it.
template <int kPerLane, typename Logit>
__device__ __forceinline__ void route_token(const MoeRouteArgs& a, int64_t t, Logit&& logit) {
  float score[kPerLane], choose[kPerLane];
  route_scores<kPerLane>(a, logit, score, choose);
  int my_id;
  float my_w;
  pick_by_rounds<kPerLane>(a, score, choose, my_id, my_w);
  finish_route(a, t, my_id, my_w);
}

// The same, token t's logits read from global memory through L2 (other blocks, or the kernel
// before, wrote them).
template <int kPerLane>
__device__ __forceinline__ void route_token(const MoeRouteArgs& a, int64_t t) {
  const float* l = a.logits + t * a.logits_stride;
  route_token<kPerLane>(a, t, [&](int e) { return __ldcg(l + e); });
}

// What the routing cannot take, or an empty string.
inline std::string route_refusal(const MoeRouteArgs& a) {
  if (a.n_used <= 0 || a.n_used > a.n_expert || a.n_used > kMaxUsed)
    return std::to_string(a.n_used) + " experts used of " + std::to_string(a.n_expert) + " (at most " +
           std::to_string(kMaxUsed) + " used)";
  if (a.n_expert > int64_t(kWarpSize) * kMaxPerLane)
    return std::to_string(a.n_expert) + " experts; at most " + std::to_string(kWarpSize * kMaxPerLane) +
           " are supported";
  if (a.gating < 0 || a.gating > 2) return "unknown gating " + std::to_string(a.gating);
  return {};
}

// Calls f(std::integral_constant<int, kPerLane>{}) with the smallest kPerLane that holds
// n_expert (at most 1024, see route_refusal).
template <typename F>
auto visit_per_lane(int64_t n_expert, F&& f) {
  const int64_t per_lane = (n_expert + kWarpSize - 1) / kWarpSize;
  if (per_lane <= 1) return f(std::integral_constant<int, 1>{});
  if (per_lane <= 2) return f(std::integral_constant<int, 2>{});
  if (per_lane <= 4) return f(std::integral_constant<int, 4>{});
  if (per_lane <= 8) return f(std::integral_constant<int, 8>{});
  if (per_lane <= 16) return f(std::integral_constant<int, 16>{});
  return f(std::integral_constant<int, 32>{});
}

}  // namespace kiln::cuda::route_detail
