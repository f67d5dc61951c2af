// Decode matvec for f16 and bf16 weights, several parts per launch (see matvec_f16_grouped.h).
//
// A 16-bit weight is used once per token, so moving the bytes is the whole cost: the kernel
// must keep enough loads in flight to stream at the copy bandwidth and do little else.
//   - A block of kHalfWarps warps stays resident (grid sized to the resident capacity); warp
//     w of the grid owns rows w, w + W, w + 2W, ... of the stacked parts (W warps in all).
//   - A warp reads its row in chunks of kChunkCols columns: every lane issues kLoadsInFlight
//     16-byte loads (8 weights each) at once, straight into registers -- 16-bit rows are
//     16-byte aligned, so nothing needs staging -- and the 32 lanes of one load cover 512
//     consecutive bytes.
//   - The warp's first chunk is requested before wait_for_previous_kernels(): no kernel of
//     the step writes weights, so they stream in while the kernel before drains.
//   - x (RMS-normalized when asked) is staged once per block into shared memory as f32, in
//     an order that gives each lane its 8 values in two conflict-free 16-byte reads.
// Sums: two f32 accumulators per lane, then a warp reduction.
//
// Measured and not kept (docs/perf-notes.md, "F16 decode through a grouped kernel"): an L2
// bulk prefetch of each warp's next weights before the wait (tg128 -4%), and blocks of 8
// warps taking (row, chunk) items of a contiguous row range (1.3-2x slower launches).
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matvec_f16_grouped.h"
#include "backend/cuda/matvec_segments.cuh"

#include <string>

namespace kiln::cuda {
namespace detail {

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

// Where column c (c % 4 == 0) of x sits in shared memory, in floats: spans of 256 columns
// (one warp load), each as [half of a lane's 8 columns][lane][4 floats], so that lane l
// reads its columns 8l..8l+3 and 8l+4..8l+7 of a span as float4 l of either half.
__device__ __forceinline__ int x_slot(int c) {
  const unsigned u = unsigned(c);
  return int((u / kSpanCols) * kSpanCols + ((u / 4) % 2) * (kSpanCols / 2) + ((u % kSpanCols) / 8) * 4);
}

// Shared memory of a block: x in x_slot order, whole spans.
size_t half_smem_bytes(int64_t cols) {
  return size_t((cols + kSpanCols - 1) / kSpanCols) * kSpanCols * sizeof(float);
}

// x into shared memory in x_slot order, normalized as rmsnorm() does (x / rms(x) * weight,
// the same rounding steps) when in.norm_weight is set; block s % grid then writes step s of
// the normalized vector to in.normed. Loads go out kStageBatch at a time so that the block
// waits for L2 about once per batch. The caller synchronizes the block afterwards.
__device__ void stage_input(const F32Input& in, int cols, float* x_s) {
  __shared__ float partial[kHalfWarps];
  const int tid = threadIdx.x;
  float sum_sq = 0.0f;
  for (int base = 0; base < cols; base += kStageStep * kStageBatch) {
    float4 v[kStageBatch];
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int i = base + b * kStageStep + tid * 4;
      v[b] = i < cols ? *reinterpret_cast<const float4*>(in.x + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
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
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int i = base + b * kStageStep + tid * 4;
      g[b] = i < cols ? *reinterpret_cast<const float4*>(in.norm_weight + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
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

template <typename Weights>
__global__ void __launch_bounds__(kHalfThreads, 2)
    matvec_half_kernel(GroupedSegments seg, int64_t w_row_bytes, int rows, int cols, F32Input in) {
  extern __shared__ __align__(16) float x_s[];  // [half_smem_bytes(cols) / 4], x_slot order
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int pieces = cols / 8;  // 16-byte pieces of a row
  const int chunks = (cols + kChunkCols - 1) / kChunkCols;
  const int warps_total = int(gridDim.x) * kHalfWarps;
  const int first_row = int(blockIdx.x) * kHalfWarps + warp;

  uint4 w[kLoadsInFlight];
  auto load_chunk = [&](int row, int chunk) {
    const int part = seg.part_of(row);
    const uint8_t* row_start = GroupedSegments::pick(seg.w, part) + int64_t(row - seg.first_row(part)) * w_row_bytes;
    const int first_piece = chunk * (kChunkCols / 8) + lane;
    const uint4* src = reinterpret_cast<const uint4*>(row_start) + first_piece;
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u)
      w[u] = first_piece + u * kWarpSize < pieces ? load_weights_16(src + u * kWarpSize) : make_uint4(0, 0, 0, 0);
  };

  if (first_row < rows) load_chunk(first_row, 0);
  wait_for_previous_kernels();
  allow_next_kernel();
  stage_input(in, cols, x_s);
  __syncthreads();

  const float4* x4 = reinterpret_cast<const float4*>(x_s);
  for (int row = first_row; row < rows; row += warps_total) {
    // The bias and residual this row's result joins, requested before its dot product so that
    // their L2 round trips overlap it rather than follow the reduction.
    const int part = seg.part_of(row);
    const int local = row - seg.first_row(part);
    const float* add = GroupedSegments::pick(seg.add, part);
    float* residual = GroupedSegments::pick(seg.acc, part);
    const float bias = add && lane == 0 ? add[local] : 0.0f;
    const float residual_before = residual && lane == 0 ? residual[local] : 0.0f;
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      if (row != first_row || chunk != 0) load_chunk(row, chunk);
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        const int span = chunk * kLoadsInFlight + u;
        if (span * kWarpSize + lane >= pieces) continue;
        float v[8];
        Weights::unpack(w[u], v);
        const float4 a = x4[span * (kSpanCols / 4) + lane], b = x4[span * (kSpanCols / 4) + kWarpSize + lane];
        acc0 = fmaf(v[0], a.x, acc0), acc1 = fmaf(v[1], a.y, acc1);
        acc0 = fmaf(v[2], a.z, acc0), acc1 = fmaf(v[3], a.w, acc1);
        acc0 = fmaf(v[4], b.x, acc0), acc1 = fmaf(v[5], b.y, acc1);
        acc0 = fmaf(v[6], b.z, acc0), acc1 = fmaf(v[7], b.w, acc1);
      }
    }
    const float sum = warp_sum(acc0 + acc1);
    if (lane == 0) {
      const float y = add ? sum + bias : sum;
      GroupedSegments::pick(seg.y, part)[local] = y;
      if (residual) residual[local] = residual_before + y;
    }
  }
}

template <typename Weights>
Status launch_half(const GroupedSegments& seg, int64_t total_rows, int64_t cols, int64_t w_row_bytes,
                   const F32Input& in, cudaStream_t stream) {
  auto kernel = matvec_half_kernel<Weights>;
  // Once per kernel: the dynamic shared-memory limit raised to the widest x, the shared
  // memory / L1 split set to the most shared memory (so that the resident blocks counted here
  // are what the SMs take), and the resident blocks per SM at that width (registers allow 2;
  // narrower x fits no fewer).
  static int blocks_per_sm = 0, sms = 0;
  if (blocks_per_sm == 0) {
    const size_t max_smem = half_smem_bytes(kMaxHalfMatvecCols);
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_smem));
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaFuncSetAttribute (matvec_half_kernel)");
    const int most_shared = int(cudaSharedmemCarveoutMaxShared);
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, most_shared) != cudaSuccess)
      cudaGetLastError();  // a preference only: not an error of this launch
    int device = 0, per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kHalfThreads, max_smem);
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor (matvec_half_kernel)");
    blocks_per_sm = max(1, per_sm);
  }
  const int64_t blocks_needed = (total_rows + kHalfWarps - 1) / kHalfWarps;
  const int grid = int(min64(blocks_needed, int64_t(blocks_per_sm) * max(1, sms)));
  launch_chained(kernel, grid, kHalfThreads, half_smem_bytes(cols), stream, seg, w_row_bytes, int(total_rows),
                 int(cols), in);
  return launch_status("matvec_half_kernel");
}

}  // namespace detail

bool matvec_half_parts_fit(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                           const F32Input& in) {
  if (type != GgmlType::F16 && type != GgmlType::BF16) return false;
  if (parts.empty() || parts.size() > size_t(kMaxMatvecParts)) return false;
  if (cols <= 0 || cols % 8 != 0 || cols > kMaxHalfMatvecCols) return false;
  if (w_row_bytes % 16 != 0 || w_row_bytes < 2 * cols) return false;
  if (!in.x || !detail::aligned16(in.x)) return false;
  if (in.norm_weight && !detail::aligned16(in.norm_weight)) return false;
  if (in.normed && (!in.norm_weight || !detail::aligned16(in.normed))) return false;
  int64_t total = 0;
  for (const MatvecPart& p : parts) {
    if (p.rows <= 0 || !p.y || !p.w || !detail::aligned16(p.w)) return false;
    total += p.rows;
  }
  return total < (int64_t(1) << 30);
}

Status matvec_half_parts(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                         const F32Input& in, cudaStream_t stream) {
  if (!matvec_half_parts_fit(type, cols, w_row_bytes, parts, in))
    return Status::invalid("matvec_half_parts: " + std::to_string(parts.size()) + " parts of " +
                           std::string(type_name(type)) + " weights, " + std::to_string(cols) +
                           " columns, rows of " + std::to_string(w_row_bytes) +
                           " bytes do not fit the kernel (f16 / bf16; 1.." + std::to_string(kMaxMatvecParts) +
                           " parts; columns a multiple of 8 up to " + std::to_string(kMaxHalfMatvecCols) +
                           "; weights, rows, x, norm weight and normed 16-byte aligned)");
  int64_t total = 0;
  const detail::GroupedSegments seg = detail::segments_of(parts, &total);
  if (type == GgmlType::BF16) return detail::launch_half<detail::HalfBF16>(seg, total, cols, w_row_bytes, in, stream);
  return detail::launch_half<detail::HalfF16>(seg, total, cols, w_row_bytes, in, stream);
}

}  // namespace kiln::cuda
