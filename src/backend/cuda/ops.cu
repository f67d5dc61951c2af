// Small fused ops (see ops.h): one block per row or token, simple and exact-minded.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/glu_math.cuh"
#include "backend/cuda/half_copy.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/rope_math.cuh"

namespace kiln::cuda {
namespace detail {

constexpr int kRowThreads = 256;

// Sum over the block (kThreads threads); every thread gets the result.
template <int kThreads>
__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / kWarpSize];
  __shared__ float total;
  v = warp_sum(v);
  if (threadIdx.x % kWarpSize == 0) partial[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  if (threadIdx.x < kWarpSize) {
    float s = threadIdx.x < kThreads / kWarpSize ? partial[threadIdx.x] : 0.0f;
    s = warp_sum(s);
    if (threadIdx.x == 0) total = s;
  }
  __syncthreads();
  return total;
}

// One block per row. Few rows (decode) take 1024 threads so that a row costs one round of
// loads per thread rather than a chain of them.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(RmsNormArgs a) {
  begin_chained_kernel();
  const int64_t r = blockIdx.x;
  const float* __restrict__ x = a.x + r * a.x_stride;
  float* __restrict__ h = a.residual ? a.residual + r * a.residual_stride : nullptr;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < a.dim; i += kThreads) {
    float v = x[i];
    if (h) {
      v = h[i] + v;
      h[i] = v;
    }
    sum_sq = fmaf(v, v, sum_sq);
  }
  const float inv = rsqrtf(block_sum<kThreads>(sum_sq) / float(a.dim) + a.eps);
  const float* src = h ? h : x;
  float* y = a.y + r * a.y_stride;
  int8_t* qs = a.q8 ? reinterpret_cast<int8_t*>(a.q8 + r * a.q8_row_bytes) : nullptr;
  float2* ds = a.q8 ? reinterpret_cast<float2*>(a.q8 + r * a.q8_row_bytes + (a.dim + 15) / 16 * 16) : nullptr;
  for (int64_t i = threadIdx.x; i < a.dim; i += kThreads) {  // warp-uniform when dim % 32 == 0
    const float v = __fmul_rn(src[i], inv);
    const float out = a.weight ? __fmul_rn(v, a.weight[i]) : v;
    y[i] = out;
    if (qs) {
      const float one[1] = {out};
      quantize_block_spread<32, 1>(one, qs + i, ds + i / 32);
    }
  }
}

// A thread's kSteps float4 of row r, element groups i = s * kStride + t (a block of kStride
// threads, or a warp with kStride = 32), with the residual added (and stored back) when
// there is one; returns the thread's sum of squares (the block- and warp-per-row kernels).
template <int kSteps, int kStride>
__device__ __forceinline__ float load_row_part(const RmsNormArgs& a, int64_t r, int t, float4 (&v)[kSteps]) {
  const float4* x = reinterpret_cast<const float4*>(a.x + r * a.x_stride);
  float4* h = a.residual ? reinterpret_cast<float4*>(a.residual + r * a.residual_stride) : nullptr;
  float sum_sq = 0.0f;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int i = s * kStride + t;
    v[s] = x[i];
    if (h) {
      const float4 hv = h[i];
      v[s] = make_float4(hv.x + v[s].x, hv.y + v[s].y, hv.z + v[s].z, hv.w + v[s].w);
      h[i] = v[s];
    }
    sum_sq = fmaf(v[s].x, v[s].x, sum_sq);
    sum_sq = fmaf(v[s].y, v[s].y, sum_sq);
    sum_sq = fmaf(v[s].z, v[s].z, sum_sq);
    sum_sq = fmaf(v[s].w, v[s].w, sum_sq);
  }
  return sum_sq;
}

// y = v * inv (* weight) for the same element groups as load_row_part.
template <int kSteps, int kStride>
__device__ __forceinline__ void store_normed_row_part(const RmsNormArgs& a, int64_t r, int t, const float4 (&v)[kSteps],
                                                      float inv) {
  float4* y = reinterpret_cast<float4*>(a.y + r * a.y_stride);
  const float4* w = reinterpret_cast<const float4*>(a.weight);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int i = s * kStride + t;
    float4 out = make_float4(__fmul_rn(v[s].x, inv), __fmul_rn(v[s].y, inv), __fmul_rn(v[s].z, inv),
                             __fmul_rn(v[s].w, inv));
    if (w) {
      const float4 wv = w[i];
      out = make_float4(__fmul_rn(out.x, wv.x), __fmul_rn(out.y, wv.y), __fmul_rn(out.z, wv.z), __fmul_rn(out.w, wv.w));
    }
    y[i] = out;
    if (a.y_half) store_half4(static_cast<uint2*>(a.y_half) + r * (a.dim / 4) + i, out, a.y_half_bf16);
  }
}

// Many rows (prefill) of dim = kSteps * 1024, 16-byte aligned, no int8 copy: each thread
// holds its 4 * kSteps values in registers, so a row is read once with 16-byte loads (the
// general kernel reads it twice, 4 bytes at a time; 18 us for an add_rmsnorm of 512 x 4096,
// ~2x its bandwidth floor).
template <int kSteps>
__global__ void __launch_bounds__(kRowThreads) rmsnorm_rows_vec_kernel(RmsNormArgs a) {
  begin_chained_kernel();
  const int64_t r = blockIdx.x;
  float4 v[kSteps];
  const float sum_sq = load_row_part<kSteps, kRowThreads>(a, r, int(threadIdx.x), v);
  const float inv = rsqrtf(block_sum<kRowThreads>(sum_sq) / float(a.dim) + a.eps);
  store_normed_row_part<kSteps, kRowThreads>(a, r, int(threadIdx.x), v, inv);
}

// Short rows (head norms: dim 128 or 256, one row per head and token, often 16K rows in a
// prefill pass) one warp each, 8 rows per block: with a block per row, a 128-wide row left
// half of a 256-thread block idle and the pass was thousands of tiny blocks (25 us for the q
// norm of a 512-token Qwen3 prefill, ~2 us of bytes). Each lane holds kSteps float4 of its
// row (dim = kSteps * 128), so a row is read once; the sum of squares is a warp sum.
constexpr int kWarpRowsPerBlock = kRowThreads / kWarpSize;
constexpr int kMaxWarpRowSteps = 4;  // rows of up to 512 values
template <int kSteps>
__global__ void __launch_bounds__(kRowThreads) rmsnorm_warp_rows_kernel(RmsNormArgs a) {
  begin_chained_kernel();
  const int64_t r = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / kWarpSize;
  if (r >= a.rows) return;  // whole warps: nothing below synchronizes the block
  const int lane = int(threadIdx.x % kWarpSize);
  float4 v[kSteps];
  const float sum_sq = load_row_part<kSteps, kWarpSize>(a, r, lane, v);
  const float inv = rsqrtf(warp_sum(sum_sq) / float(a.dim) + a.eps);
  store_normed_row_part<kSteps, kWarpSize>(a, r, lane, v, inv);
}

// Whether the 16-byte loads of the row kernels can read and write these rows: aligned bases
// and strides, no int8 copy.
bool rows_vectorizable(const RmsNormArgs& a) {
  if (a.q8) return false;
  if (a.x_stride % 4 || a.y_stride % 4 || (a.residual && a.residual_stride % 4)) return false;
  return aligned16(a.x) && aligned16(a.y) && (!a.residual || aligned16(a.residual)) &&
         (!a.weight || aligned16(a.weight));
}

// The warp kernel's steps for these arguments, or 0 when it does not apply (or when
// KILN_CUDA_NORM_WARP_ROWS=0, read once, for measuring).
int rmsnorm_warp_steps(const RmsNormArgs& a) {
  static const bool enabled = !env_is("KILN_CUDA_NORM_WARP_ROWS", "0");
  if (!enabled || a.dim % (kWarpSize * 4) != 0 || a.dim > kMaxWarpRowSteps * kWarpSize * 4 || !rows_vectorizable(a)) return 0;
  return int(a.dim / (kWarpSize * 4));
}

// The vector kernel's steps for these arguments, or 0 when it does not apply.
int rmsnorm_vec_steps(const RmsNormArgs& a) {
  if (a.rows <= 8 || a.dim % (kRowThreads * 4) != 0 || a.dim > 8 * kRowThreads * 4 || !rows_vectorizable(a)) return 0;
  return int(a.dim / (kRowThreads * 4));
}

__global__ void __launch_bounds__(128) rope_kernel(RopeArgs a, RopeConstants c, int heads_per_block) {
  __shared__ float cos_s[kMaxRopeHalf], sin_s[kMaxRopeHalf];
  const int64_t t = blockIdx.x;
  const int64_t first_head = int64_t(blockIdx.y) * heads_per_block;
  rope_angles(a, c, t, cos_s, sin_s);
  // The angles need only the positions, uploaded before the step; x comes from the kernels
  // before this one.
  begin_chained_kernel();
  __syncthreads();
  rotate_heads(a, t, first_head, heads_per_block, static_cast<float*>(nullptr), cos_s, sin_s);
}

// Grid (x blocks per row, rows); each thread takes 4 consecutive elements per step (16-byte
// accesses when kVector) and, for many rows, a few steps, so that blocks are not too
// short-lived.
template <GluKind kKind, bool kVector>
__global__ void __launch_bounds__(256) glu_kernel(GluArgs a) {
  begin_chained_kernel();
  const int64_t r = blockIdx.y;
  const float* g = a.gate + r * a.gate_stride;
  const float* u = a.up + r * a.up_stride;
  float* o = a.out + r * a.out_stride;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * 4;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < a.n; i += stride) {
    if constexpr (kVector) {
      const float4 gv = *reinterpret_cast<const float4*>(g + i), uv = *reinterpret_cast<const float4*>(u + i);
      float4 y;
      y.x = glu_of(kKind, gv.x, uv.x, a.alpha, a.limit);
      y.y = glu_of(kKind, gv.y, uv.y, a.alpha, a.limit);
      y.z = glu_of(kKind, gv.z, uv.z, a.alpha, a.limit);
      y.w = glu_of(kKind, gv.w, uv.w, a.alpha, a.limit);
      *reinterpret_cast<float4*>(o + i) = y;
      if (a.q8) {  // n % 128 == 0 (glu_can_quantize): whole warps take each step
        const float four[4] = {y.x, y.y, y.z, y.w};
        uint8_t* row_q8 = a.q8 + r * a.q8_row_bytes;
        quantize_block_spread<8, 4>(four, reinterpret_cast<int8_t*>(row_q8) + i,
                                    reinterpret_cast<float2*>(row_q8 + (a.n + 15) / 16 * 16) + i / 32);
      }
    } else {
      for (int64_t k = i; k < i + 4 && k < a.n; ++k) o[k] = glu_of(kKind, g[k], u[k], a.alpha, a.limit);
    }
  }
}

bool glu_vector(const GluArgs& a) {
  return a.n % 4 == 0 && a.gate_stride % 4 == 0 && a.up_stride % 4 == 0 && a.out_stride % 4 == 0 &&
         reinterpret_cast<uintptr_t>(a.gate) % 16 == 0 && reinterpret_cast<uintptr_t>(a.up) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
}

template <GluKind kKind>
void launch_glu(const GluArgs& a, cudaStream_t stream) {
  const bool vector = glu_vector(a);
  // Decode rows (a few): one step of 4 elements per thread, so that a 14336-wide row takes 14
  // blocks rather than 4 latency-bound ones; more rows: 4 steps per thread.
  const int64_t per_block = 256 * 4 * (a.rows <= 8 ? 1 : 4);
  const dim3 grid(unsigned(std::min<int64_t>((a.n + per_block - 1) / per_block, 1024)), unsigned(a.rows));
  if (vector)
    launch_chained(glu_kernel<kKind, true>, grid, 256, 0, stream, a);
  else
    launch_chained(glu_kernel<kKind, false>, grid, 256, 0, stream, a);
}

// (value, index) with the larger value winning, the smaller index among equals.
__device__ __forceinline__ void argmax_merge(float& v, int64_t& i, float ov, int64_t oi) {
  if (oi < 0) return;
  if (i < 0 || ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// Pass 1: grid (pieces, rows); each block reduces a piece of a row to (value, index).
// Pass 2: one warp per row reduces the pieces. Many blocks read a row at once: a single
// block per row would be bound by one SM's memory latency (a vocabulary row is 0.5 MB).
constexpr int kArgmaxThreads = 256;
constexpr int64_t kArgmaxPiece = 8192;  // elements per block in pass 1

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_pieces_kernel(const float* x, int64_t stride, int64_t n, float* piece_v, int64_t* piece_i) {
  begin_chained_kernel();
  __shared__ float best_v[kArgmaxThreads / kWarpSize];
  __shared__ int64_t best_i[kArgmaxThreads / kWarpSize];
  const float* row = x + int64_t(blockIdx.y) * stride;
  const int64_t begin = int64_t(blockIdx.x) * kArgmaxPiece, end = min64(begin + kArgmaxPiece, n);
  float v = 0.0f;
  int64_t idx = -1;
  for (int64_t i = begin + threadIdx.x; i < end; i += kArgmaxThreads) {
    const float e = row[i];
    if (!isnan(e)) argmax_merge(v, idx, e, i);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, offset);
    const int64_t oi = __shfl_xor_sync(kFullMask, idx, offset);
    argmax_merge(v, idx, ov, oi);
  }
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) best_v[warp] = v, best_i[warp] = idx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / kWarpSize; ++w) argmax_merge(v, idx, best_v[w], best_i[w]);
    const int64_t slot = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    piece_v[slot] = v;
    piece_i[slot] = idx;
  }
}

__global__ void argmax_rows_kernel(const float* piece_v, const int64_t* piece_i, int pieces, int32_t* out,
                                   int32_t* host_out) {
  begin_chained_kernel();
  const int lane = threadIdx.x;
  float v = 0.0f;
  int64_t idx = -1;
  for (int p = lane; p < pieces; p += kWarpSize)
    argmax_merge(v, idx, piece_v[int64_t(blockIdx.x) * pieces + p], piece_i[int64_t(blockIdx.x) * pieces + p]);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, offset);
    const int64_t oi = __shfl_xor_sync(kFullMask, idx, offset);
    argmax_merge(v, idx, ov, oi);
  }
  if (lane == 0) {
    const int32_t best = int32_t(idx < 0 ? 0 : idx);
    out[blockIdx.x] = best;
    if (host_out) {
      host_out[blockIdx.x] = best;
      __threadfence_system();  // before the step's event tells the host it is there
    }
  }
}

}  // namespace detail

bool rmsnorm_writes_half(const RmsNormArgs& a) {
  const int steps = detail::rmsnorm_vec_steps(a);
  return detail::rmsnorm_warp_steps(a) == 0 && (steps == 1 || steps == 2 || steps == 4 || steps == 8);
}

Status rmsnorm(const RmsNormArgs& a, cudaStream_t stream) {
  if (!a.x || !a.y || a.rows <= 0 || a.dim <= 0 || a.rows > 0x7fffffff)
    return Status::invalid("rmsnorm: x and y must be set and rows (" + std::to_string(a.rows) + ") and dim (" +
                           std::to_string(a.dim) + ") positive");
  if (a.q8 && (a.dim % 32 != 0 || reinterpret_cast<uintptr_t>(a.q8) % 16 != 0 || a.q8_row_bytes % 16 != 0))
    return Status::invalid("rmsnorm: the int8 copy needs dim % 32 == 0 (dim " + std::to_string(a.dim) +
                           ") and 16-byte aligned rows");
  if (a.y_half && (!rmsnorm_writes_half(a) || reinterpret_cast<uintptr_t>(a.y_half) % 256 != 0))
    return Status::invalid("rmsnorm: a half copy of y needs the row kernel (rows of a multiple of 1024 values, "
                           "aligned) and a 256-byte aligned copy");
  if (const int warp_steps = detail::rmsnorm_warp_steps(a); warp_steps > 0) {
    const unsigned blocks = unsigned((a.rows + detail::kWarpRowsPerBlock - 1) / detail::kWarpRowsPerBlock);
    const unsigned threads = detail::kRowThreads;
    if (warp_steps == 1) launch_chained(detail::rmsnorm_warp_rows_kernel<1>, blocks, threads, 0, stream, a);
    if (warp_steps == 2) launch_chained(detail::rmsnorm_warp_rows_kernel<2>, blocks, threads, 0, stream, a);
    if (warp_steps == 3) launch_chained(detail::rmsnorm_warp_rows_kernel<3>, blocks, threads, 0, stream, a);
    if (warp_steps == 4) launch_chained(detail::rmsnorm_warp_rows_kernel<4>, blocks, threads, 0, stream, a);
    return launch_status("rmsnorm_warp_rows_kernel");
  }
  const int steps = detail::rmsnorm_vec_steps(a);
  if (steps == 1 || steps == 2 || steps == 4 || steps == 8) {  // else the general kernels
    const unsigned rows = unsigned(a.rows), threads = detail::kRowThreads;
    if (steps == 1) launch_chained(detail::rmsnorm_rows_vec_kernel<1>, rows, threads, 0, stream, a);
    if (steps == 2) launch_chained(detail::rmsnorm_rows_vec_kernel<2>, rows, threads, 0, stream, a);
    if (steps == 4) launch_chained(detail::rmsnorm_rows_vec_kernel<4>, rows, threads, 0, stream, a);
    if (steps == 8) launch_chained(detail::rmsnorm_rows_vec_kernel<8>, rows, threads, 0, stream, a);
    return launch_status("rmsnorm_rows_vec_kernel");
  }
  if (a.rows < 256 && a.dim >= 2048)
    launch_chained(detail::rmsnorm_kernel<1024>, unsigned(a.rows), 1024, 0, stream, a);
  else
    launch_chained(detail::rmsnorm_kernel<detail::kRowThreads>, unsigned(a.rows), detail::kRowThreads, 0, stream, a);
  return launch_status("rmsnorm_kernel");
}

Status rope(const RopeArgs& a, cudaStream_t stream) {
  detail::RopeConstants c;
  if (Status st = detail::rope_constants(a, &c); !st.ok()) return st;
  const int heads = detail::rope_heads_per_block(a.n_tokens, a.n_heads);
  const dim3 grid(unsigned(a.n_tokens), unsigned((a.n_heads + heads - 1) / heads));
  launch_chained(detail::rope_kernel, grid, 128, 0, stream, a, c, heads);
  return launch_status("rope_kernel");
}

bool glu_can_quantize(const GluArgs& a) {
  return a.n % 128 == 0 && detail::glu_vector(a);
}

Status glu(const GluArgs& a, cudaStream_t stream) {
  if (!a.gate || !a.up || !a.out || a.rows <= 0 || a.n <= 0 || a.rows > 65535)
    return Status::invalid("glu: gate, up and out must be set, rows in 1..65535 (got " + std::to_string(a.rows) + ")");
  if (a.q8 && (!glu_can_quantize(a) || reinterpret_cast<uintptr_t>(a.q8) % 16 != 0 || a.q8_row_bytes % 16 != 0))
    return Status::invalid("glu: the int8 copy needs n % 128 == 0 and 16-byte aligned rows (n " + std::to_string(a.n) +
                           ")");
  switch (a.kind) {
    case GluKind::Silu: detail::launch_glu<GluKind::Silu>(a, stream); break;
    case GluKind::GeluTanh: detail::launch_glu<GluKind::GeluTanh>(a, stream); break;
    case GluKind::SwigluOai: detail::launch_glu<GluKind::SwigluOai>(a, stream); break;
    default: return Status::invalid("glu: unknown kind; supported: silu gelu_tanh swiglu_oai");
  }
  return launch_status("glu_kernel");
}

size_t argmax_scratch_bytes(int64_t rows, int64_t n) {
  if (rows <= 0 || n <= 0) return 0;
  const int64_t pieces = (n + detail::kArgmaxPiece - 1) / detail::kArgmaxPiece;
  return size_t(rows * pieces) * (sizeof(float) + sizeof(int64_t)) + 16;
}

Status argmax_rows(const float* x, int64_t x_stride, int64_t rows, int64_t n, int32_t* out, void* scratch,
                   size_t scratch_bytes, cudaStream_t stream, int32_t* host_out) {
  if (!x || !out || rows <= 0 || n <= 0 || rows > 65535)
    return Status::invalid("argmax_rows: x and out must be set, rows in 1..65535 and n positive");
  const size_t need = argmax_scratch_bytes(rows, n);
  if (!scratch || scratch_bytes < need)
    return Status::invalid("argmax_rows: needs " + std::to_string(need) + " bytes of scratch, got " +
                           std::to_string(scratch_bytes));
  const int64_t pieces = (n + detail::kArgmaxPiece - 1) / detail::kArgmaxPiece;
  auto* piece_i = static_cast<int64_t*>(scratch);  // 8-byte values first: alignment
  auto* piece_v = reinterpret_cast<float*>(piece_i + rows * pieces);
  launch_chained(detail::argmax_pieces_kernel, dim3(unsigned(pieces), unsigned(rows)), detail::kArgmaxThreads, 0,
                 stream, x, x_stride, n, piece_v, piece_i);
  if (Status s = launch_status("argmax_pieces_kernel"); !s.ok()) return s;
  launch_chained(detail::argmax_rows_kernel, unsigned(rows), detail::kWarpSize, 0, stream, piece_v, piece_i,
                 int(pieces), out, host_out);
  return launch_status("argmax_rows_kernel");
}

}  // namespace kiln::cuda
