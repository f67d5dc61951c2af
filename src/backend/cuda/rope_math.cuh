#pragma once
// Rotary position embedding on the device, shared by the plain rope kernel (ops.cu), the
// one that also stores the rotated keys into the cache (rope_store.cu) and the decode
// attention that does both itself (attention_new_token.cuh): the host-side YaRN constants,
// each token's angles (double precision, as the CPU backend computes them), the rotation of
// a group of heads or of one element, and Qwen3's per-head RMS norm that runs before it.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/rope_store.h"

namespace kiln::cuda::detail {

// In decode a block rotates kRopeHeadsPerBlock heads of one token; each block computes its
// token's angles (cheap next to one SM working through all heads, which made rope a 10 us
// kernel). With many tokens there are blocks enough without splitting a token's heads, and
// computing the angles once per token instead of once per 4 heads matters more (prefill
// profile: rope q 16 us and rope k 8.5 us per layer at T = 512 for 8 and 2 MB).
constexpr int kRopeHeadsPerBlock = 4;
constexpr int kRopeMaxHeadsPerBlock = 64;
inline int rope_heads_per_block(int64_t n_tokens, int64_t n_heads) {
  return n_tokens > 8 ? int(n_heads < kRopeMaxHeadsPerBlock ? n_heads : kRopeMaxHeadsPerBlock) : kRopeHeadsPerBlock;
}
constexpr int kMaxRopeHalf = 512;  // n_rot <= 1024

struct RopeConstants {
  float corr_low = 0.0f, corr_high = 0.0f, mscale_yarn = 1.0f;
};

// The dimension whose wavelength fits `n_rotations` times into the original context (YaRN).
inline float correction_dim(int n_rot, int n_ctx_orig, float n_rotations, float base) {
  return float(n_rot) * std::log(float(n_ctx_orig) / (n_rotations * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

// Checks the arguments and computes the YaRN correction range (host).
inline Status rope_constants(const RopeArgs& a, RopeConstants* c) {
  if (!a.x || !a.positions || a.n_tokens <= 0 || a.n_heads <= 0 || a.n_tokens > 0x7fffffff)
    return Status::invalid("rope: x and positions must be set and the shape positive");
  if (a.n_rot <= 0 || a.n_rot % 2 != 0 || a.n_rot > a.head_dim || a.n_rot > 2 * kMaxRopeHalf)
    return Status::invalid("rope: n_rot " + std::to_string(a.n_rot) + " must be even, positive, at most head_dim (" +
                           std::to_string(a.head_dim) + ") and at most " + std::to_string(2 * kMaxRopeHalf));
  *c = RopeConstants{};
  if (a.ext_factor != 0.0f) {
    if (a.n_ctx_orig <= 0) return Status::invalid("rope: YaRN needs the original context length");
    const float low = correction_dim(a.n_rot, a.n_ctx_orig, a.beta_fast, a.freq_base);
    const float high = correction_dim(a.n_rot, a.n_ctx_orig, a.beta_slow, a.freq_base);
    c->corr_low = std::max(0.0f, a.yarn_truncate ? std::floor(low) : low);
    c->corr_high = std::min(float(a.n_rot - 1), a.yarn_truncate ? std::ceil(high) : high);
    c->mscale_yarn = 1.0f + 0.1f * std::log(1.0f / a.freq_scale);
  }
  return Status();
}

// Whether q and k rotate by the same angles (one table, or one computation, serves both).
inline bool same_rotation(const RopeArgs& q, const RopeArgs& k) {
  return q.positions == k.positions && q.n_tokens == k.n_tokens && q.n_rot == k.n_rot && q.neox == k.neox &&
         q.freq_base == k.freq_base && q.freq_scale == k.freq_scale && q.freq_factors == k.freq_factors &&
         q.ext_factor == k.ext_factor && q.attn_factor == k.attn_factor && q.beta_fast == k.beta_fast &&
         q.beta_slow == k.beta_slow && q.n_ctx_orig == k.n_ctx_orig && q.yarn_truncate == k.yarn_truncate;
}

__device__ inline float yarn_ramp(float low, float high, int i0) {
  const float y = (float(i0 / 2) - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

// cos_s / sin_s [n_rot / 2] = token t's rotation, mscale included (the whole block loops).
// Reads only the positions and constants, which no kernel of the step writes.
__device__ inline void rope_angles(const RopeArgs& a, const RopeConstants& c, int64_t t, float* cos_s, float* sin_s) {
  const int half = a.n_rot / 2;
  const double pos = double(a.positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // Angles in double: positions times small frequencies lose digits in f32.
    double theta_extrap = pos * pow(double(a.freq_base), -2.0 * i / a.n_rot);
    if (a.freq_factors) theta_extrap /= double(a.freq_factors[i]);
    double theta = theta_extrap * a.freq_scale;
    float mscale = a.attn_factor;
    if (a.ext_factor != 0.0f) {
      const double mix = double(yarn_ramp(c.corr_low, c.corr_high, 2 * i)) * a.ext_factor;
      theta = theta * (1.0 - mix) + theta_extrap * mix;
      mscale *= c.mscale_yarn;
    }
    double s, co;
    sincos(theta, &s, &co);
    cos_s[i] = float(co) * mscale;
    sin_s[i] = float(s) * mscale;
  }
}

// The pair (x0, x1) rotated by the angle whose cosine and sine are c and s (mscale
// included), rounded as the CPU backend does: no fused multiply-adds.
__device__ __forceinline__ float rotated_first(float x0, float x1, float c, float s) {
  return __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
}
__device__ __forceinline__ float rotated_second(float x0, float x1, float c, float s) {
  return __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// Element d (< n_rot) of a rotated head: the index of its pair (its angle), its partner in
// the pair, and whether it is the pair's first element (neox: the pairs (i, i + half), else
// (2i, 2i + 1)). Its rotated value is rotated_element().
struct RopeElement {
  int pair, partner;
  bool first;
};
__device__ __forceinline__ RopeElement rope_element(int d, int half, bool neox) {
  if (neox) return d < half ? RopeElement{d, d + half, true} : RopeElement{d - half, d - half, false};
  return RopeElement{d / 2, d ^ 1, (d & 1) == 0};
}
__device__ __forceinline__ float rotated_element(const RopeElement& e, float x, float partner, float c, float s) {
  return e.first ? rotated_first(x, partner, c, s) : rotated_second(partner, x, c, s);
}

// Qwen3's per-head RMS norm (rmsnorm() over heads as rows: x / rms(x) * weight) in pieces that
// every kernel uses alike, so that they all give the same bits: lane l of a warp holds the
// head's values l, l + 32, ... and adds their squares in that order (lane_sum_of_squares),
// the warp adds the lanes' sums (head_rms_inverse), each value is scaled (head_normed).
template <int kPerLane>
__device__ __forceinline__ float lane_sum_of_squares(const float (&v)[kPerLane]) {
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) sum_sq = fmaf(v[j], v[j], sum_sq);
  return sum_sq;
}
__device__ __forceinline__ float head_rms_inverse(float lane_sum, int head_dim, float eps) {
  return rsqrtf(warp_sum(lane_sum) / float(head_dim) + eps);
}
__device__ __forceinline__ float head_normed(float v, float inv, float weight) {
  return __fmul_rn(__fmul_rn(v, inv), weight);
}

// One head of head_dim (<= kMaxHeadNormDim) values RMS-normalized in place by the calling
// warp (lanes past head_dim hold zeros, which add nothing to the sum).
__device__ inline void norm_head_in_place(float* x, int head_dim, const float* weight, float eps) {
  constexpr int kPerLane = kMaxHeadNormDim / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  float v[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = j * kWarpSize + lane;
    v[j] = d < head_dim ? x[d] : 0.0f;
  }
  const float inv = head_rms_inverse(lane_sum_of_squares(v), head_dim, eps);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = j * kWarpSize + lane;
    if (d < head_dim) x[d] = head_normed(v[j], inv, weight[d]);
  }
}

// Rotates heads [first_head, first_head + heads_per_block) of token t in place. With
// cache_row (the token's key row of the cache, heads packed head_dim apart), every element
// of those heads, rotated or passed through, is stored there too.
template <typename KV>
__device__ inline void rotate_heads(const RopeArgs& a, int64_t t, int64_t first_head, int heads_per_block,
                                    KV* cache_row, const float* cos_s, const float* sin_s) {
  const int64_t n_heads = min64(heads_per_block, a.n_heads - first_head);
  const int half = a.n_rot / 2;
  float* xt = a.x + t * a.token_stride + first_head * a.head_stride;
  for (int64_t j = threadIdx.x; j < n_heads * half; j += blockDim.x) {
    const int64_t head = j / half;
    const int i = int(j % half);
    float* v = xt + head * a.head_stride;
    const int first = a.neox ? i : 2 * i, second = a.neox ? i + half : 2 * i + 1;
    const float x0 = v[first], x1 = v[second];
    const float y0 = rotated_first(x0, x1, cos_s[i], sin_s[i]);
    const float y1 = rotated_second(x0, x1, cos_s[i], sin_s[i]);
    v[first] = y0;
    v[second] = y1;
    if (cache_row) {
      KV* c = cache_row + (first_head + head) * a.head_dim;
      store_as(c + first, y0);
      store_as(c + second, y1);
    }
  }
  if (!cache_row) return;
  const int64_t pass = a.head_dim - a.n_rot;  // dims past n_rot keep their values
  for (int64_t j = threadIdx.x; j < n_heads * pass; j += blockDim.x) {
    const int64_t head = j / pass, d = a.n_rot + j % pass;
    store_as(cache_row + (first_head + head) * a.head_dim + d, xt[head * a.head_stride + d]);
  }
}

}  // namespace kiln::cuda::detail
