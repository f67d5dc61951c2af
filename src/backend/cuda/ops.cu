// Small fused ops (see ops.h): one block per row or token, simple and exact-minded.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace kiln::cuda {
namespace detail {

constexpr int kRowThreads = 256;

// Sum over the block (kRowThreads threads); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float partial[kRowThreads / kWarpSize];
  __shared__ float total;
  v = warp_sum(v);
  if (threadIdx.x % kWarpSize == 0) partial[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  if (threadIdx.x < kWarpSize) {
    float s = threadIdx.x < kRowThreads / kWarpSize ? partial[threadIdx.x] : 0.0f;
    s = warp_sum(s);
    if (threadIdx.x == 0) total = s;
  }
  __syncthreads();
  return total;
}

__global__ void __launch_bounds__(kRowThreads) rmsnorm_kernel(RmsNormArgs a) {
  const int64_t r = blockIdx.x;
  const float* x = a.x + r * a.x_stride;
  float* h = a.residual ? a.residual + r * a.residual_stride : nullptr;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < a.dim; i += kRowThreads) {
    float v = x[i];
    if (h) {
      v = h[i] + v;
      h[i] = v;
    }
    sum_sq = fmaf(v, v, sum_sq);
  }
  const float inv = rsqrtf(block_sum(sum_sq) / float(a.dim) + a.eps);
  const float* src = h ? h : x;
  float* y = a.y + r * a.y_stride;
  for (int64_t i = threadIdx.x; i < a.dim; i += kRowThreads) {
    const float v = __fmul_rn(src[i], inv);
    y[i] = a.weight ? __fmul_rn(v, a.weight[i]) : v;
  }
}

struct RopeConstants {
  float corr_low = 0.0f, corr_high = 0.0f, mscale_yarn = 1.0f;
};

__device__ float yarn_ramp(float low, float high, int i0) {
  const float y = (float(i0 / 2) - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

__global__ void __launch_bounds__(128) rope_kernel(RopeArgs a, RopeConstants c) {
  __shared__ float cos_s[512], sin_s[512];
  const int64_t t = blockIdx.x;
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
  __syncthreads();
  float* xt = a.x + t * a.token_stride;
  for (int64_t j = threadIdx.x; j < a.n_heads * half; j += blockDim.x) {
    const int64_t head = j / half;
    const int i = int(j % half);
    float* v = xt + head * a.head_stride;
    const int first = a.neox ? i : 2 * i, second = a.neox ? i + half : 2 * i + 1;
    const float x0 = v[first], x1 = v[second];
    v[first] = __fsub_rn(__fmul_rn(x0, cos_s[i]), __fmul_rn(x1, sin_s[i]));
    v[second] = __fadd_rn(__fmul_rn(x0, sin_s[i]), __fmul_rn(x1, cos_s[i]));
  }
}

template <GluKind kKind>
__global__ void glu_kernel(GluArgs a) {
  const int64_t r = blockIdx.y;
  const float* g = a.gate + r * a.gate_stride;
  const float* u = a.up + r * a.up_stride;
  float* o = a.out + r * a.out_stride;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gv = g[i], uv = u[i];
    float y;
    if constexpr (kKind == GluKind::Silu) {
      y = gv / (1.0f + expf(-gv)) * uv;
    } else if constexpr (kKind == GluKind::GeluTanh) {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      y = 0.5f * gv * (1.0f + tanhf(kSqrt2OverPi * (gv + 0.044715f * gv * gv * gv))) * uv;
    } else {
      const float gc = fminf(gv, a.limit);
      const float uc = fminf(fmaxf(uv, -a.limit), a.limit);
      y = gc / (1.0f + expf(-a.alpha * gc)) * (uc + 1.0f);
    }
    o[i] = y;
  }
}

// (value, index) with the larger value winning, the smaller index among equals.
__device__ __forceinline__ void argmax_merge(float& v, int64_t& i, float ov, int64_t oi) {
  if (oi < 0) return;
  if (i < 0 || ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void __launch_bounds__(1024) argmax_kernel(const float* x, int64_t stride, int64_t n, int32_t* out) {
  __shared__ float best_v[32];
  __shared__ int64_t best_i[32];
  const float* row = x + int64_t(blockIdx.x) * stride;
  float v = 0.0f;
  int64_t idx = -1;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = row[i];
    if (!isnan(e)) argmax_merge(v, idx, e, i);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, offset);
    const int64_t oi = __shfl_xor_sync(kFullMask, idx, offset);
    argmax_merge(v, idx, ov, oi);
  }
  const int warp = threadIdx.x / kWarpSize, n_warps = blockDim.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) best_v[warp] = v, best_i[warp] = idx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < n_warps; ++w) argmax_merge(v, idx, best_v[w], best_i[w]);
    out[blockIdx.x] = int32_t(idx < 0 ? 0 : idx);
  }
}

// The dimension whose wavelength fits `n_rotations` times into the original context (YaRN).
float correction_dim(int n_rot, int n_ctx_orig, float n_rotations, float base) {
  return float(n_rot) * std::log(float(n_ctx_orig) / (n_rotations * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

}  // namespace detail

Status rmsnorm(const RmsNormArgs& a, cudaStream_t stream) {
  if (!a.x || !a.y || a.rows <= 0 || a.dim <= 0 || a.rows > 0x7fffffff)
    return Status::invalid("rmsnorm: x and y must be set and rows (" + std::to_string(a.rows) + ") and dim (" +
                           std::to_string(a.dim) + ") positive");
  detail::rmsnorm_kernel<<<unsigned(a.rows), detail::kRowThreads, 0, stream>>>(a);
  return launch_status("rmsnorm_kernel");
}

Status rope(const RopeArgs& a, cudaStream_t stream) {
  if (!a.x || !a.positions || a.n_tokens <= 0 || a.n_heads <= 0 || a.n_tokens > 0x7fffffff)
    return Status::invalid("rope: x and positions must be set and the shape positive");
  if (a.n_rot <= 0 || a.n_rot % 2 != 0 || a.n_rot > a.head_dim || a.n_rot > 1024)
    return Status::invalid("rope: n_rot " + std::to_string(a.n_rot) + " must be even, positive, at most head_dim (" +
                           std::to_string(a.head_dim) + ") and at most 1024");
  detail::RopeConstants c;
  if (a.ext_factor != 0.0f) {
    if (a.n_ctx_orig <= 0) return Status::invalid("rope: YaRN needs the original context length");
    c.corr_low = std::max(0.0f, std::floor(detail::correction_dim(a.n_rot, a.n_ctx_orig, a.beta_fast, a.freq_base)));
    c.corr_high = std::min(float(a.n_rot - 1),
                           std::ceil(detail::correction_dim(a.n_rot, a.n_ctx_orig, a.beta_slow, a.freq_base)));
    c.mscale_yarn = 1.0f + 0.1f * std::log(1.0f / a.freq_scale);
  }
  detail::rope_kernel<<<unsigned(a.n_tokens), 128, 0, stream>>>(a, c);
  return launch_status("rope_kernel");
}

Status glu(const GluArgs& a, cudaStream_t stream) {
  if (!a.gate || !a.up || !a.out || a.rows <= 0 || a.n <= 0 || a.rows > 65535)
    return Status::invalid("glu: gate, up and out must be set, rows in 1..65535 (got " + std::to_string(a.rows) + ")");
  const dim3 grid(unsigned(std::min<int64_t>((a.n + 255) / 256, 1024)), unsigned(a.rows));
  switch (a.kind) {
    case GluKind::Silu: detail::glu_kernel<GluKind::Silu><<<grid, 256, 0, stream>>>(a); break;
    case GluKind::GeluTanh: detail::glu_kernel<GluKind::GeluTanh><<<grid, 256, 0, stream>>>(a); break;
    case GluKind::SwigluOai: detail::glu_kernel<GluKind::SwigluOai><<<grid, 256, 0, stream>>>(a); break;
    default: return Status::invalid("glu: unknown kind; supported: silu gelu_tanh swiglu_oai");
  }
  return launch_status("glu_kernel");
}

Status argmax_rows(const float* x, int64_t x_stride, int64_t rows, int64_t n, int32_t* out, cudaStream_t stream) {
  if (!x || !out || rows <= 0 || n <= 0 || rows > 0x7fffffff)
    return Status::invalid("argmax_rows: x and out must be set and the shape positive");
  detail::argmax_kernel<<<unsigned(rows), 1024, 0, stream>>>(x, x_stride, n, out);
  return launch_status("argmax_kernel");
}

}  // namespace kiln::cuda
