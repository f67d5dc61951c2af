// Mixture-of-experts routing on the device (ops_extra.h's moe_route): each token's k experts
// and their weights from its router logits.
//
// One warp per token. Lane i holds the logits of experts i, i + 32, ... in registers
// (kPerLane of them), the scores are computed once, then k rounds of "largest not yet
// taken" across the warp; equal choices keep the lower expert index first, the order of
// the CPU backend's stable sort. Lane j keeps slot j's id and weight, so the optional
// softmax over the chosen k, the normalization and the scale are warp reductions too.
// (v1 ran one thread per token and recomputed every score, a double exp, in each of the k
// rounds: ~1,000 exps and ~4,000 dependent loads in one thread per token.)
#include <cmath>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops_extra.h"

namespace kiln::cuda {
namespace route_detail {

using detail::kFullMask;
using detail::kWarpSize;

constexpr int kRouteWarps = 4;  // tokens per block
constexpr int kMaxPerLane = 32;  // n_expert <= 1024
constexpr int kMaxUsed = kWarpSize;

__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

template <int kPerLane>
__global__ void __launch_bounds__(kRouteWarps * kWarpSize) moe_route_warp_kernel(MoeRouteArgs a) {
  detail::begin_chained_kernel();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + threadIdx.x / kWarpSize;
  if (t >= a.n_tokens) return;  // whole warps leave together
  const float* l = a.logits + t * a.logits_stride;

  float score[kPerLane], choose[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + kWarpSize * i;
    score[i] = e < a.n_expert ? l[e] : -INFINITY;
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

  uint32_t taken = 0;  // bit i: expert lane + 32 i is chosen
  int my_id = 0;       // lane j: slot j's expert and score
  float my_w = 0.0f;
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
      const bool better =
          other >= 0 && (best < 0 || other_choice > best_choice || (other_choice == best_choice && other < best));
      if (better) best = other, best_choice = other_choice, best_score = other_score;
    }
    // n_used <= n_expert, so some expert is always left: best >= 0 here.
    if (best % kWarpSize == lane) taken |= 1u << (best / kWarpSize);
    if (lane == j) my_id = best, my_w = best_score;
  }

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

template <int kPerLane>
cudaError_t launch_route(const MoeRouteArgs& a, cudaStream_t stream) {
  const unsigned grid = unsigned((a.n_tokens + kRouteWarps - 1) / kRouteWarps);
  return launch_chained(moe_route_warp_kernel<kPerLane>, dim3(grid), dim3(kRouteWarps * kWarpSize), 0, stream, a);
}

}  // namespace route_detail

Status moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  using namespace route_detail;
  if (a.n_used <= 0 || a.n_used > a.n_expert || a.n_used > kMaxUsed)
    return Status::invalid("moe_route: " + std::to_string(a.n_used) + " experts used of " +
                           std::to_string(a.n_expert) + " (at most " + std::to_string(kMaxUsed) + " used)");
  if (a.n_expert > int64_t(kWarpSize) * kMaxPerLane)
    return Status::invalid("moe_route: " + std::to_string(a.n_expert) + " experts; at most " +
                           std::to_string(kWarpSize * kMaxPerLane) + " are supported");
  if (a.gating < 0 || a.gating > 2) return Status::invalid("moe_route: unknown gating " + std::to_string(a.gating));
  if (a.n_tokens <= 0) return Status();
  const int64_t per_lane = (a.n_expert + kWarpSize - 1) / kWarpSize;
  cudaError_t e;
  if (per_lane <= 1)
    e = launch_route<1>(a, stream);
  else if (per_lane <= 2)
    e = launch_route<2>(a, stream);
  else if (per_lane <= 4)
    e = launch_route<4>(a, stream);
  else if (per_lane <= 8)
    e = launch_route<8>(a, stream);
  else if (per_lane <= 16)
    e = launch_route<16>(a, stream);
  else
    e = launch_route<32>(a, stream);
  if (e != cudaSuccess) return Status::from_cuda(e, "moe_route_warp_kernel");
  return launch_status("moe_route_warp_kernel");
}

}  // namespace kiln::cuda
