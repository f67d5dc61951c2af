// Ops that walk the keys or the tokens of a sequence (ops_extra.h): attention of any head
// size over the paged cache, and the GatedDeltaNet short convolution and delta rule with
// their per-sequence state on the device.
#include <cmath>
#include <string>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops_extra.h"

namespace kiln::cuda {
namespace sequence_detail {

using detail::kWarpSize;
constexpr int kMaxDimsPerLane = 8;  // head sizes up to 256

__device__ __forceinline__ float load_element(const float* p) { return *p; }
__device__ __forceinline__ float load_element(const __half* p) { return __half2float(*p); }

// One warp per (token, query head): lanes split the head dims, keys go one at a time with
// an online softmax (running max, rescaled sum and output).
template <typename KV>
__global__ void general_attention_kernel(GeneralAttentionArgs a) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, lane = threadIdx.x;
  const int kv_head = h / (a.n_head / a.n_head_kv);
  const int pos = a.positions[t];
  const int first = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  const int32_t* table = a.block_tables + int64_t(a.seq_rows[t]) * a.table_width;
  const float* q = a.q + t * a.q_stride + int64_t(h) * a.head_dim_k;

  float qv[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    qv[i] = d < a.head_dim_k ? q[d] : 0.0f;
    if constexpr (std::is_same_v<KV, __half>) qv[i] = __half2float(__float2half_rn(qv[i]));
    acc[i] = 0.0f;
  }
  float m = a.sinks ? a.sinks[h] : -INFINITY;
  float l = a.sinks ? 1.0f : 0.0f;
  for (int j = first; j <= pos; ++j) {
    const int64_t slot = int64_t(table[j / a.block_size]) * a.block_size + j % a.block_size;
    const KV* k = static_cast<const KV*>(a.k_cache) + slot * a.k_slot_stride + int64_t(kv_head) * a.head_dim_k;
    const KV* v = static_cast<const KV*>(a.v_cache) + slot * a.v_slot_stride + int64_t(kv_head) * a.head_dim_v;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < a.head_dim_k) dot = fmaf(qv[i], load_element(k + d), dot);
    }
    float s = detail::warp_sum(dot) * a.scale;
    if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new), p = expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < a.head_dim_v) acc[i] = acc[i] * correction + p * load_element(v + d);
    }
    m = m_new;
  }
  float* out = a.out + t * a.out_stride + int64_t(h) * a.head_dim_v;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    if (d < a.head_dim_v) out[d] = acc[i] / l;
  }
}

// One thread per channel walks the batch in order, keeping each sequence's last K-1 inputs
// in the state tensor itself.
__global__ void conv_silu_kernel(ConvSiluArgs a) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= a.channels) return;
  const int taps = a.kernel - 1;
  const float* w = a.weight + c * a.kernel;
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const int64_t seq = a.seq_rows[t];
    if (seq < 0 || seq >= a.n_state_rows) continue;
    float* window = a.state + (seq * a.channels + c) * taps;  // oldest first
    if (a.positions[t] == 0)
      for (int j = 0; j < taps; ++j) window[j] = 0.0f;
    const float x = a.x[t * a.x_stride + c];
    float acc = w[taps] * x;
    for (int j = 0; j < taps; ++j) acc = fmaf(w[j], window[j], acc);
    a.out[t * a.out_stride + c] = acc / (1.0f + expf(-acc));
    for (int j = 0; j + 1 < taps; ++j) window[j] = window[j + 1];
    window[taps - 1] = x;
  }
}

// Sum over the block; every thread gets the result. `scratch` holds one float per warp + 1.
__device__ float block_sum(float v, float* scratch) {
  v = detail::warp_sum(v);
  const int warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int i = 0; i < warps; ++i) s += scratch[i];
    scratch[warps] = s;
  }
  __syncthreads();
  const float total = scratch[warps];
  __syncthreads();
  return total;
}

__device__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One block per value head. Shared memory: S [dk][dv], q [dk], k [dk], reduction scratch.
__global__ void delta_rule_kernel(DeltaRuleArgs a) {
  extern __shared__ float shared[];
  const int dk = a.head_dim_k, dv = a.head_dim_v;
  float* S = shared;
  float* qs = S + dk * dv;
  float* ks = qs + dk;
  float* red = ks + dk;
  const int h = blockIdx.x, tid = threadIdx.x;
  const int key_head = a.tiled_heads ? h % a.n_k_heads : h / (a.n_v_heads / a.n_k_heads);
  const float q_scale = rsqrtf(float(dk));
  const float ssm_a = a.ssm_a[h], dt_bias = a.dt_bias[h];
  const int64_t gate0 = h % a.gate_n0, gate1 = h / a.gate_n0;
  int64_t current = -1;  // sequence row whose state S holds

  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const int64_t seq = a.seq_rows[t];
    if (seq < 0 || seq >= a.n_state_rows) continue;
    const bool fresh = a.positions[t] == 0;
    if (seq != current) {
      float* rows = a.state + (seq * a.n_v_heads + h) * int64_t(dk) * dv;
      if (current >= 0) {
        float* old = a.state + (current * a.n_v_heads + h) * int64_t(dk) * dv;
        for (int i = tid; i < dk * dv; i += blockDim.x) old[i] = S[i];
      }
      for (int i = tid; i < dk * dv; i += blockDim.x) S[i] = fresh ? 0.0f : rows[i];
      current = seq;
    } else if (fresh) {
      for (int i = tid; i < dk * dv; i += blockDim.x) S[i] = 0.0f;
    }
    float qq = 0.0f, kk = 0.0f;
    for (int i = tid; i < dk; i += blockDim.x) {
      const float qv = a.q[t * a.q_stride + int64_t(key_head) * dk + i];
      const float kv = a.k[t * a.k_stride + int64_t(key_head) * dk + i];
      qs[i] = qv, ks[i] = kv;
      qq += qv * qv, kk += kv * kv;
    }
    const float q_inv = rsqrtf(block_sum(qq, red) + a.l2_eps) * q_scale;
    const float k_inv = rsqrtf(block_sum(kk, red) + a.l2_eps);
    for (int i = tid; i < dk; i += blockDim.x) qs[i] *= q_inv, ks[i] *= k_inv;
    __syncthreads();

    const float alpha = a.alpha[gate0 * a.alpha_s0 + gate1 * a.alpha_s1 + t * a.alpha_s2];
    const float beta = a.beta[gate0 * a.beta_s0 + gate1 * a.beta_s1 + t * a.beta_s2];
    const float decay = expf(ssm_a * softplus(alpha + dt_bias));
    const float b = 1.0f / (1.0f + expf(-beta));
    for (int j = tid; j < dv; j += blockDim.x) {  // each thread owns columns of S
      float kv = 0.0f;
      for (int i = 0; i < dk; ++i) {
        const float s = S[i * dv + j] * decay;
        S[i * dv + j] = s;
        kv = fmaf(s, ks[i], kv);
      }
      const float delta = b * (a.v[t * a.v_stride + int64_t(h) * dv + j] - kv);
      float o = 0.0f;
      for (int i = 0; i < dk; ++i) {
        const float s = fmaf(ks[i], delta, S[i * dv + j]);
        S[i * dv + j] = s;
        o = fmaf(s, qs[i], o);
      }
      a.out[t * a.out_stride + int64_t(h) * dv + j] = o;
    }
    __syncthreads();
  }
  if (current >= 0) {
    float* rows = a.state + (current * a.n_v_heads + h) * int64_t(dk) * dv;
    for (int i = tid; i < dk * dv; i += blockDim.x) rows[i] = S[i];
  }
}

}  // namespace sequence_detail

Status general_attention(const GeneralAttentionArgs& a, cudaStream_t stream) {
  constexpr int kMaxDim = sequence_detail::kMaxDimsPerLane * detail::kWarpSize;
  if (a.head_dim_k <= 0 || a.head_dim_v <= 0 || a.head_dim_k > kMaxDim || a.head_dim_v > kMaxDim)
    return Status::invalid("general_attention: head sizes " + std::to_string(a.head_dim_k) + "/" +
                           std::to_string(a.head_dim_v) + " are not supported (1.." + std::to_string(kMaxDim) + ")");
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.n_head > 65535)
    return Status::invalid("general_attention: " + std::to_string(a.n_head) + " query heads cannot share " +
                           std::to_string(a.n_head_kv) + " kv heads");
  if (a.cache_type != GgmlType::F32 && a.cache_type != GgmlType::F16)
    return Status::invalid("general_attention: cache type " + std::string(type_name(a.cache_type)) + " (f32 or f16)");
  if (a.n_tokens <= 0) return Status();
  const dim3 grid(unsigned(a.n_tokens), unsigned(a.n_head));
  if (a.cache_type == GgmlType::F16)
    sequence_detail::general_attention_kernel<__half><<<grid, detail::kWarpSize, 0, stream>>>(a);
  else
    sequence_detail::general_attention_kernel<float><<<grid, detail::kWarpSize, 0, stream>>>(a);
  return launch_status("general_attention_kernel");
}

Status causal_conv_silu(const ConvSiluArgs& a, cudaStream_t stream) {
  if (a.kernel < 2) return Status::invalid("causal_conv_silu: kernel " + std::to_string(a.kernel) + " < 2");
  if (a.n_tokens <= 0 || a.channels <= 0) return Status();
  sequence_detail::conv_silu_kernel<<<unsigned((a.channels + 127) / 128), 128, 0, stream>>>(a);
  return launch_status("conv_silu_kernel");
}

Status gated_delta_rule(const DeltaRuleArgs& a, cudaStream_t stream) {
  const int dk = a.head_dim_k, dv = a.head_dim_v;
  if (dk <= 0 || dv <= 0 || a.n_k_heads <= 0 || a.n_v_heads % a.n_k_heads != 0)
    return Status::invalid("gated_delta_rule: " + std::to_string(a.n_v_heads) + " value heads over " +
                           std::to_string(a.n_k_heads) + " key heads of " + std::to_string(dk) + "/" +
                           std::to_string(dv));
  if (a.n_tokens <= 0) return Status();
  const int threads = dv >= 256 ? 256 : (dv + 31) / 32 * 32;
  const size_t shared = (size_t(dk) * dv + 2 * size_t(dk) + threads / 32 + 2) * sizeof(float);
  if (shared > 48 * 1024) {
    static size_t raised = 0;  // the kernel's dynamic shared-memory limit, raised once per size
    if (shared > raised) {
      const cudaError_t e = cudaFuncSetAttribute(sequence_detail::delta_rule_kernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
      if (e != cudaSuccess) return Status::from_cuda(e, "gated_delta_rule: shared memory of " + std::to_string(shared));
      raised = shared;
    }
  }
  sequence_detail::delta_rule_kernel<<<unsigned(a.n_v_heads), threads, shared, stream>>>(a);
  return launch_status("delta_rule_kernel");
}

}  // namespace kiln::cuda
