#pragma once
// What the two 16-bit float decode matvecs share (matvec_f16_grouped.cu: a warp per row;
// matvec_f16_pairs.cu: a warp per pair of rows, with a pair epilogue): the block shape, the
// weight loads and unpacking, x staged into shared memory (normalized when asked), and the
// grid sized to the resident blocks. Why the design: matvec_f16_grouped.cu's comment.
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matvec_f16_grouped.h"
#include "backend/cuda/matvec_segments.cuh"

namespace kiln::cuda::detail {

constexpr int kHalfWarps = 16;
constexpr int kHalfThreads = kHalfWarps * kWarpSize;
constexpr int kLoadsInFlight = 8;                        // 16-byte loads per lane and chunk
constexpr int kSpanCols = 8 * kWarpSize;                 // the columns of one load of a warp
constexpr int kChunkCols = kSpanCols * kLoadsInFlight;   // 2048
constexpr int kStageBatch = 4;                           // float4s of x per thread in flight when staging
constexpr int kStageStep = kHalfThreads * 4;             // columns a block stages per float4 step

struct HalfF16 {
  __device__ static void unpack(const uint4& u, float (&v)[8]) {
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  }
};

struct HalfBF16 {
  __device__ static void unpack(const uint4& u, float (&v)[8]) {
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(words[i] << 16);
      v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
};

// 16 bytes of weights through the read-only path, not kept in L1 (each byte is used once).
// volatile keeps the loads where they are written: the first chunk before the wait for the
// previous kernel (a plain load could be moved after it, next to its first use).
__device__ __forceinline__ uint4 load_weights_16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One 16-byte load's 8 weights dotted with the lane's 8 columns of x (`a`: its first 4, `b`:
// the next 4), even and odd elements into two accumulators. Every 16-bit kernel adds in this
// order, so a row's sum has the same bits whichever kernel computes it.
template <typename Weights>
__device__ __forceinline__ void dot8(const uint4& w, const float4& a, const float4& b, float& acc0, float& acc1) {
  float v[8];
  Weights::unpack(w, v);
  acc0 = fmaf(v[0], a.x, acc0), acc1 = fmaf(v[1], a.y, acc1);
  acc0 = fmaf(v[2], a.z, acc0), acc1 = fmaf(v[3], a.w, acc1);
  acc0 = fmaf(v[4], b.x, acc0), acc1 = fmaf(v[5], b.y, acc1);
  acc0 = fmaf(v[6], b.z, acc0), acc1 = fmaf(v[7], b.w, acc1);
}

// Where column c (c % 4 == 0) of x sits in shared memory, in floats: spans of 256 columns
// (one warp load), each as [half of a lane's 8 columns][lane][4 floats], so that lane l
// reads its columns 8l..8l+3 and 8l+4..8l+7 of a span as float4 l of either half.
__device__ __forceinline__ int x_slot(int c) {
  const unsigned u = unsigned(c);
  return int((u / kSpanCols) * kSpanCols + ((u / 4) % 2) * (kSpanCols / 2) + ((u % kSpanCols) / 8) * 4);
}

// Shared memory of a block: x in x_slot order, whole spans.
inline size_t half_smem_bytes(int64_t cols) {
  return size_t((cols + kSpanCols - 1) / kSpanCols) * kSpanCols * sizeof(float);
}

// kStageBatch float4s of `src` for this thread, kStageStep columns apart from base + 4 * tid:
// all issued before any is used, so that the block waits for L2 once per batch; zeros past
// cols.
__device__ __forceinline__ void load_stage_batch(const float* src, int base, int cols, float4 (&v)[kStageBatch]) {
#pragma unroll
  for (int b = 0; b < kStageBatch; ++b) {
    const int i = base + b * kStageStep + int(threadIdx.x) * 4;
    v[b] = i < cols ? *reinterpret_cast<const float4*>(src + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// x into shared memory in x_slot order, normalized as rmsnorm() does (x / rms(x) * weight,
// the same rounding steps) when in.norm_weight is set; block s % grid then writes step s of
// the normalized vector to in.normed. Loads go out a batch at a time (load_stage_batch). The
// caller synchronizes the block afterwards.
__device__ inline void stage_input(const F32Input& in, int cols, float* x_s) {
  __shared__ float partial[kHalfWarps];
  const int tid = threadIdx.x;
  float sum_sq = 0.0f;
  for (int base = 0; base < cols; base += kStageStep * kStageBatch) {
    float4 v[kStageBatch];
    load_stage_batch(in.x, base, cols, v);
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int i = base + b * kStageStep + tid * 4;
      if (i >= cols) break;
      sum_sq = fmaf(v[b].x, v[b].x, sum_sq);
      sum_sq = fmaf(v[b].y, v[b].y, sum_sq);
      sum_sq = fmaf(v[b].z, v[b].z, sum_sq);
      sum_sq = fmaf(v[b].w, v[b].w, sum_sq);
      *reinterpret_cast<float4*>(x_s + x_slot(i)) = v[b];
    }
  }
  if (!in.norm_weight) return;

  const float inv = rsqrtf(block_sum<kHalfWarps>(sum_sq, partial) / float(cols) + in.eps);  // rmsnorm()'s formula
  // Each thread rescales the very elements it stored above: no barrier needed in between.
  for (int base = 0; base < cols; base += kStageStep * kStageBatch) {
    float4 g[kStageBatch];
    load_stage_batch(in.norm_weight, base, cols, g);
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int i = base + b * kStageStep + tid * 4;
      if (i >= cols) break;
      float4* slot = reinterpret_cast<float4*>(x_s + x_slot(i));
      float4 v = *slot;
      v.x = __fmul_rn(__fmul_rn(v.x, inv), g[b].x);
      v.y = __fmul_rn(__fmul_rn(v.y, inv), g[b].y);
      v.z = __fmul_rn(__fmul_rn(v.z, inv), g[b].z);
      v.w = __fmul_rn(__fmul_rn(v.w, inv), g[b].w);
      *slot = v;
      // Every block computed the whole vector; one block writes each step of it.
      if (in.normed && (i / kStageStep) % int(gridDim.x) == int(blockIdx.x))
        *reinterpret_cast<float4*>(in.normed + i) = v;
    }
  }
}

// The start of every 16-bit matvec once its warps have requested their first weights: wait
// for the kernels before (they write x), let the next one be scheduled, stage x, and
// synchronize the block.
__device__ __forceinline__ void stage_input_after_wait(const F32Input& in, int cols, float* x_s) {
  wait_for_previous_kernels();
  allow_next_kernel();
  stage_input(in, cols, x_s);
  __syncthreads();
}

// Resident blocks of `kernel` (kHalfThreads threads) per multiprocessor and the
// multiprocessors, found once per kernel: the dynamic shared-memory limit raised to the
// widest x, the shared memory / L1 split set to the most shared memory (so that the
// resident blocks counted here are what the SMs take), and the count at that width
// (registers allow 2; narrower x fits no fewer).
template <auto kernel>
Status half_resident_blocks(int& blocks_per_sm, int& sms) {
  static int per_sm_found = 0;
  if (per_sm_found == 0) {
    const size_t max_smem = half_smem_bytes(kMaxHalfMatvecCols);
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_smem));
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaFuncSetAttribute (16-bit matvec)");
    const int most_shared = int(cudaSharedmemCarveoutMaxShared);
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, most_shared) != cudaSuccess)
      cudaGetLastError();  // a preference only: not an error of this launch
    int per_sm = 0;
    if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kHalfThreads, max_smem);
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor (16-bit matvec)");
    per_sm_found = max(1, per_sm);
  }
  blocks_per_sm = per_sm_found, sms = max(1, multiprocessor_count());
  return Status();
}

// Launches a 16-bit matvec kernel of kHalfThreads-thread blocks over x of `cols` values:
// `blocks_needed` blocks, or as many as are resident if fewer.
template <auto kernel, typename... Args>
Status launch_resident(int64_t blocks_needed, int64_t cols, cudaStream_t stream, const char* name, Args&&... args) {
  int blocks_per_sm = 0, sms = 0;
  if (Status st = half_resident_blocks<kernel>(blocks_per_sm, sms); !st.ok()) return st;
  const int grid = int(min64(blocks_needed, int64_t(blocks_per_sm) * sms));
  launch_chained(kernel, grid, kHalfThreads, half_smem_bytes(cols), stream, std::forward<Args>(args)...);
  return launch_status(name);
}

// The pair kernel's launch (matvec_f16_pairs.cu), after matvec_half_pairs_fit.
Status launch_half_pairs(GgmlType type, const GroupedSegments& seg, int64_t total_rows, int64_t cols,
                         int64_t w_row_bytes, const F32Input& in, const PairEpilogue& ep, cudaStream_t stream);

}  // namespace kiln::cuda::detail
