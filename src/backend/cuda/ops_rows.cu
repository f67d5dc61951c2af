// Row-wise and elementwise ops of the CUDA backend (ops_extra.h): add / scale / soft-cap /
// sigmoid gate, softmax, gated RMS norm, KV-cache stores, and the mixture-of-experts
// combine (the routing is in moe_route.cu). v1 kernels: one block per row, f32 arithmetic.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops_extra.h"

namespace kiln::cuda {
namespace rows_detail {

using detail::kWarpSize;
constexpr int kThreads = 256;

// Sum (or max) over a block of kThreads threads; every thread gets the result.
template <bool Max>
__device__ float block_reduce(float v) {
  __shared__ float partial[kThreads / kWarpSize];
  __shared__ float total;
  v = Max ? detail::warp_max(v) : detail::warp_sum(v);
  if (threadIdx.x % kWarpSize == 0) partial[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  if (threadIdx.x < kWarpSize) {
    float s = threadIdx.x < kThreads / kWarpSize ? partial[threadIdx.x] : (Max ? -INFINITY : 0.0f);
    s = Max ? detail::warp_max(s) : detail::warp_sum(s);
    if (threadIdx.x == 0) total = s;
  }
  __syncthreads();
  const float result = total;
  __syncthreads();  // the next call may overwrite `total`
  return result;
}

// Grid (rows, pieces of a row): a decode step's single row is spread over several blocks.
__global__ void eltwise_kernel(EltwiseArgs a) {
  detail::begin_chained_kernel();
  const int64_t r = blockIdx.x;
  const float* x = a.a.row(r);
  const float* y = a.b.base ? a.b.row(a.b_one_row ? 0 : r) : nullptr;
  float* o = a.out.row(r);
  for (int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < a.n; i += int64_t(gridDim.y) * blockDim.x) {
    const float v = x[i];
    switch (a.kind) {
      case EltwiseKind::Add: o[i] = v + y[i]; break;
      case EltwiseKind::Scale: o[i] = v * a.value; break;
      case EltwiseKind::SoftCap: o[i] = a.value * tanhf(v / a.value); break;
      case EltwiseKind::SigmoidMul: o[i] = v / (1.0f + expf(-y[a.b_one_value ? 0 : i])); break;
    }
  }
}

__global__ void softmax_kernel(RowLayout x, RowLayout out, int64_t n) {
  const float* a = x.row(blockIdx.x);
  float* y = out.row(blockIdx.x);
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) m = fmaxf(m, a[i]);
  m = block_reduce<true>(m);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) sum += expf(a[i] - m);
  sum = block_reduce<false>(sum);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) y[i] = expf(a[i] - m) / sum;
}

__global__ void rmsnorm_gated_kernel(RowLayout x, RowLayout z, const float* w, float eps, RowLayout out, int64_t n) {
  const float* a = x.row(blockIdx.x);
  const float* g = z.row(blockIdx.x);
  float* y = out.row(blockIdx.x);
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) sum_sq = fmaf(a[i], a[i], sum_sq);
  const float inv = 1.0f / sqrtf(block_reduce<false>(sum_sq) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) y[i] = a[i] * inv * w[i] * (g[i] / (1.0f + expf(-g[i])));
}

// Grid (tokens, pieces): a decode token's keys and values are spread over several blocks
// (one block looping over them all was a latency-bound 7 us).
constexpr int kKvStorePieces = 8;

template <typename KV>
__global__ void kv_store_kernel(KvStoreArgs a) {
  detail::begin_chained_kernel();
  const int64_t t = blockIdx.x;
  const int64_t slot = a.slots[t];
  if (slot < 0 || slot >= a.n_slots) return;  // checked on the host where it can be; never write outside
  KV* cache_k = static_cast<KV*>(a.cache_k) + slot * a.cache_k_stride;
  KV* cache_v = static_cast<KV*>(a.cache_v) + slot * a.cache_v_stride;
  const int64_t first = int64_t(blockIdx.y) * blockDim.x + threadIdx.x, step = int64_t(gridDim.y) * blockDim.x;
  for (int64_t i = first; i < a.k_width; i += step) detail::store_as(cache_k + i, a.k[t * a.k_stride + i]);
  for (int64_t i = first; i < a.v_width; i += step) detail::store_as(cache_v + i, a.v[t * a.v_stride + i]);
}

__global__ void moe_combine_kernel(MoeCombineArgs a) {
  const int64_t t = blockIdx.x;
  float weight = 0.0f;
  for (int j = 0; j < a.n_used; ++j)
    if (a.ids[t * a.ids_stride + j] == a.expert) weight += a.weights[t * a.weights_stride + j];
  const float* y = a.y + t * a.y_stride;
  float* o = a.out + t * a.out_stride;
  for (int64_t i = threadIdx.x; i < a.n; i += blockDim.x) {
    const float add = weight != 0.0f ? weight * y[i] : 0.0f;  // an unrouted expert's rows may hold anything
    o[i] = a.accumulate ? o[i] + add : add;
  }
}

int threads_for(int64_t n) { return n >= kThreads ? kThreads : int((n + 31) / 32 * 32); }

}  // namespace rows_detail

Status eltwise(const EltwiseArgs& a, cudaStream_t stream) {
  if (a.rows <= 0 || a.n <= 0) return Status();
  if (a.rows > 0x7fffffff) return Status::invalid("eltwise: too many rows");
  if ((a.kind == EltwiseKind::Add || a.kind == EltwiseKind::SigmoidMul) && !a.b.base)
    return Status::invalid("eltwise: the second operand is missing");
  const int threads = rows_detail::threads_for(a.n);
  const int64_t pieces = std::min<int64_t>((a.n + 4 * threads - 1) / (4 * threads), a.rows >= 64 ? 1 : 16);
  launch_chained(rows_detail::eltwise_kernel, dim3(unsigned(a.rows), unsigned(pieces)), threads, 0, stream, a);
  return launch_status("eltwise_kernel");
}

Status softmax_rows(const RowLayout& x, const RowLayout& out, int64_t rows, int64_t n, cudaStream_t stream) {
  if (rows <= 0) return Status();
  rows_detail::softmax_kernel<<<unsigned(rows), rows_detail::kThreads, 0, stream>>>(x, out, n);
  return launch_status("softmax_kernel");
}

Status rmsnorm_gated(const RowLayout& x, const RowLayout& z, const float* weight, float eps, const RowLayout& out,
                     int64_t rows, int64_t n, cudaStream_t stream) {
  if (rows <= 0) return Status();
  if (!weight) return Status::invalid("rmsnorm_gated: weight is missing");
  rows_detail::rmsnorm_gated_kernel<<<unsigned(rows), rows_detail::kThreads, 0, stream>>>(x, z, weight, eps, out, n);
  return launch_status("rmsnorm_gated_kernel");
}

Status kv_store(const KvStoreArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return Status();
  if (a.n_tokens > 0x7fffffff) return Status::invalid("kv_store: too many tokens");
  if (a.cache_type != GgmlType::F32 && a.cache_type != GgmlType::F16)
    return Status::invalid("kv_store: cache type " + std::string(type_name(a.cache_type)) + " (f32 or f16)");
  const dim3 grid(unsigned(a.n_tokens), rows_detail::kKvStorePieces);
  if (a.cache_type == GgmlType::F16)
    launch_chained(rows_detail::kv_store_kernel<__half>, grid, 128, 0, stream, a);
  else
    launch_chained(rows_detail::kv_store_kernel<float>, grid, 128, 0, stream, a);
  return launch_status("kv_store_kernel");
}

Status moe_combine(const MoeCombineArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return Status();
  rows_detail::moe_combine_kernel<<<unsigned(a.n_tokens), rows_detail::threads_for(a.n), 0, stream>>>(a);
  return launch_status("moe_combine_kernel");
}

}  // namespace kiln::cuda
