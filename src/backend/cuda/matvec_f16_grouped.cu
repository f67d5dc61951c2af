// Decode matvec for f16 and bf16 weights, several parts per launch (see matvec_f16_grouped.h).
//
// A 16-bit weight is used once per token, so moving the bytes is the whole cost: the kernel
// must keep enough loads in flight to stream at the copy bandwidth, keep every warp busy to
// the end, and do little else.
//   - Work items: a row's columns in chunks of kChunkCols (2048). Each block of the grid
//     (sized to the resident capacity) owns a contiguous range of the stacked rows, as equal
//     as division makes them, and its warps take that range's items in turn, so warps and
//     blocks end together whatever the row count. A warp's sum over an item goes to shared
//     memory; the block adds each row's chunks in chunk order (deterministic, independent of
//     the grid) and writes the row.
//   - An item is 8 16-byte loads per lane (8 weights each), issued together straight into
//     registers -- 16-bit rows are 16-byte aligned, so nothing needs staging -- the 32 lanes
//     of one load covering 512 consecutive bytes.
//   - Before wait_for_previous_kernels(), which only the activations need, each warp loads
//     its first item and the block copies the norm weights to shared memory: no kernel of
//     the step writes weights, so they stream in while the kernel before drains.
//   - x is then copied to shared memory (asynchronous 16-byte copies: one round trip for any
//     width) in an order that gives each lane its 8 values in two conflict-free 16-byte
//     reads, and RMS-normalized there when asked.
// Sums: two f32 accumulators per lane, a warp reduction, then the chunks in order.
//
// Version 1 gave each warp whole rows (w, w + W, ...): at 6144 or 4096 rows some warps had
// twice the rows of others and the launch ran 3-4 us past its bytes (docs/perf-notes.md).
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matvec_f16_grouped.h"
#include "backend/cuda/matvec_segments.cuh"

#include <cstdlib>
#include <cstring>
#include <string>

namespace kiln::cuda {
namespace detail {

constexpr int kLoadsInFlight = 8;                        // 16-byte loads per lane and item
constexpr int kSpanCols = 8 * kWarpSize;                 // the columns of one load of a warp
constexpr int kChunkCols = kSpanCols * kLoadsInFlight;   // 2048: one item
constexpr int kPartials = 256;                           // item sums a block holds per round
static_assert(kPartials >= int(kMaxHalfMatvecCols) / kChunkCols, "a round holds at least one whole row");

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
// volatile keeps the loads where they are written: the first item before the wait for the
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

// Floats of one vector of `cols` in x_slot order (whole spans).
__host__ __device__ constexpr int slot_floats(int cols) { return (cols + kSpanCols - 1) / kSpanCols * kSpanCols; }

size_t half_smem_bytes(int64_t cols, bool norm) {
  return size_t(slot_floats(int(cols))) * sizeof(float) * (norm ? 2 : 1);
}

// A vector of `cols` floats from global to shared memory in x_slot order, with 16-byte
// asynchronous copies (committed as one group by the caller).
template <int kThreads>
__device__ __forceinline__ void copy_in_slot_order(const float* src, int cols, float* dst) {
  for (int i = int(threadIdx.x) * 4; i < cols; i += kThreads * 4) cp_async_16(dst + x_slot(i), src + i);
}

// x_s <- x_s / rms(x_s) * g_s as rmsnorm() computes it (the same rounding steps); block
// s % grid writes step s of the result to `normed`. Each thread works on the slots it copied
// in, so only the sum needs the block.
template <int kThreads>
__device__ void normalize_in_place(float* x_s, const float* g_s, int cols, float eps, float* normed) {
  constexpr int kWarps = kThreads / kWarpSize;
  __shared__ float partial[kWarps];
  float sum_sq = 0.0f;
  for (int i = int(threadIdx.x) * 4; i < cols; i += kThreads * 4) {
    const float4 v = *reinterpret_cast<const float4*>(x_s + x_slot(i));
    sum_sq = fmaf(v.x, v.x, sum_sq);
    sum_sq = fmaf(v.y, v.y, sum_sq);
    sum_sq = fmaf(v.z, v.z, sum_sq);
    sum_sq = fmaf(v.w, v.w, sum_sq);
  }
  sum_sq = warp_sum(sum_sq);
  if (threadIdx.x % kWarpSize == 0) partial[threadIdx.x / kWarpSize] = sum_sq;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += partial[w];
  const float inv = rsqrtf(total / float(cols) + eps);  // rmsnorm()'s formula
  for (int i = int(threadIdx.x) * 4, step = 0; i < cols; i += kThreads * 4, ++step) {
    float4* slot = reinterpret_cast<float4*>(x_s + x_slot(i));
    const float4 g = *reinterpret_cast<const float4*>(g_s + x_slot(i));
    float4 v = *slot;
    v.x = __fmul_rn(__fmul_rn(v.x, inv), g.x);
    v.y = __fmul_rn(__fmul_rn(v.y, inv), g.y);
    v.z = __fmul_rn(__fmul_rn(v.z, inv), g.z);
    v.w = __fmul_rn(__fmul_rn(v.w, inv), g.w);
    *slot = v;
    // Every block computed the whole vector; one block writes each step of it.
    if (normed && step % int(gridDim.x) == int(blockIdx.x)) *reinterpret_cast<float4*>(normed + i) = v;
  }
}

template <typename Weights, int kWarps>
__global__ void __launch_bounds__(kWarps * kWarpSize, 32 / kWarps)
    matvec_half_kernel(GroupedSegments seg, int64_t w_row_bytes, int rows, int cols, F32Input in) {
  constexpr int kThreads = kWarps * kWarpSize;
  extern __shared__ __align__(16) float smem[];
  float* x_s = smem;                      // [slot_floats(cols)] x, then x normalized
  float* g_s = smem + slot_floats(cols);  // [slot_floats(cols)] the norm weights, when normalizing
  __shared__ float item_sum[kPartials];   // [row of the round][chunk]

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int pieces = cols / 8;  // 16-byte pieces of a row
  const int chunks = (cols + kChunkCols - 1) / kChunkCols;
  const int rows_per_round = kPartials / chunks;
  const int row_end = int(int64_t(blockIdx.x + 1) * rows / gridDim.x);
  int round_row = int(int64_t(blockIdx.x) * rows / gridDim.x);
  auto items_from = [&](int row) { return min(row_end - row, rows_per_round) * chunks; };

  uint4 w[kLoadsInFlight];
  auto load_item = [&](int row, int chunk) {
    const int part = seg.part_of(row);
    const uint8_t* row_start = GroupedSegments::pick(seg.w, part) + int64_t(row - seg.first_row(part)) * w_row_bytes;
    const int first_piece = chunk * (kChunkCols / 8) + lane;
    const uint4* src = reinterpret_cast<const uint4*>(row_start) + first_piece;
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u)
      w[u] = first_piece + u * kWarpSize < pieces ? load_weights_16(src + u * kWarpSize) : make_uint4(0, 0, 0, 0);
  };

  int items = items_from(round_row);
  if (warp < items) load_item(round_row + warp / chunks, warp % chunks);
  if (in.norm_weight) copy_in_slot_order<kThreads>(in.norm_weight, cols, g_s);
  cp_async_commit();
  wait_for_previous_kernels();
  allow_next_kernel();
  copy_in_slot_order<kThreads>(in.x, cols, x_s);
  cp_async_commit();
  cp_async_wait<0>();
  if (in.norm_weight) normalize_in_place<kThreads>(x_s, g_s, cols, in.eps, in.normed);
  __syncthreads();

  const float4* x4 = reinterpret_cast<const float4*>(x_s);
  bool loaded = warp < items;  // w holds this warp's first item of the round
  while (items > 0) {
    const int round_rows = items / chunks;
    const int next_items = items_from(round_row + round_rows);
    for (int i = warp; i < items; i += kWarps) {
      const int chunk = i % chunks;
      if (!loaded) load_item(round_row + i / chunks, chunk);
      loaded = false;
      float acc0 = 0.0f, acc1 = 0.0f;
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
      const float sum = warp_sum(acc0 + acc1);
      if (lane == 0) item_sum[i] = sum;
    }
    // This warp's first item of the next round goes out before the block meets.
    loaded = warp < next_items;
    if (loaded) load_item(round_row + round_rows + warp / chunks, warp % chunks);
    __syncthreads();
    for (int r = threadIdx.x; r < round_rows; r += kThreads) {
      float sum = 0.0f;
      for (int c = 0; c < chunks; ++c) sum += item_sum[r * chunks + c];
      const int row = round_row + r;
      const int part = seg.part_of(row);
      const int local = row - seg.first_row(part);
      const float* add = GroupedSegments::pick(seg.add, part);
      const float y = add ? sum + add[local] : sum;
      GroupedSegments::pick(seg.y, part)[local] = y;
      if (float* residual = GroupedSegments::pick(seg.acc, part)) residual[local] += y;
    }
    round_row += round_rows;
    items = next_items;
    if (items > 0) __syncthreads();  // item_sum is refilled
  }
}

// Warps per block: 8 unless KILN_CUDA_HALF_WARPS=16 (for measurements).
int half_block_warps() {
  static const int warps = [] {
    const char* env = std::getenv("KILN_CUDA_HALF_WARPS");
    return env && std::strcmp(env, "16") == 0 ? 16 : 8;
  }();
  return warps;
}

template <typename Weights, int kWarps>
Status launch_half(const GroupedSegments& seg, int64_t total_rows, int64_t cols, int64_t w_row_bytes,
                   const F32Input& in, cudaStream_t stream) {
  auto kernel = matvec_half_kernel<Weights, kWarps>;
  constexpr int kThreads = kWarps * kWarpSize;
  const size_t smem = half_smem_bytes(cols, in.norm_weight != nullptr);
  // Per kernel: the dynamic shared-memory limit raised once to the largest need; resident
  // blocks per SM for the last few sizes seen.
  static int sms = 0;
  static size_t sizes[4] = {};
  static int per_sm[4] = {};
  if (sms == 0) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             int(half_smem_bytes(kMaxHalfMatvecCols, true)));
        e != cudaSuccess)
      return Status::from_cuda(e, "cudaFuncSetAttribute (matvec_half_kernel)");
    int device = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  int slot = 0;
  while (slot < 4 && sizes[slot] != smem && sizes[slot] != 0) ++slot;
  if (slot == 4) slot = 0, sizes[0] = 0;  // evict the first
  if (sizes[slot] != smem) {
    int blocks = 0;
    if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem); e != cudaSuccess)
      return Status::from_cuda(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor (matvec_half_kernel)");
    sizes[slot] = smem, per_sm[slot] = max(1, blocks);
  }
  // Enough blocks for every warp to have an item, at most what is resident at once.
  const int64_t chunks = (cols + kChunkCols - 1) / kChunkCols;
  const int64_t blocks_needed = (total_rows * chunks + kWarps - 1) / kWarps;
  const int grid = int(min64(blocks_needed, int64_t(per_sm[slot]) * max(1, sms)));
  launch_chained(kernel, grid, kThreads, smem, stream, seg, w_row_bytes, int(total_rows), int(cols), in);
  return launch_status("matvec_half_kernel");
}

template <typename Weights>
Status dispatch_warps(const GroupedSegments& seg, int64_t total_rows, int64_t cols, int64_t w_row_bytes,
                      const F32Input& in, cudaStream_t stream) {
  if (half_block_warps() == 16) return launch_half<Weights, 16>(seg, total_rows, cols, w_row_bytes, in, stream);
  return launch_half<Weights, 8>(seg, total_rows, cols, w_row_bytes, in, stream);
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
    return Status::invalid("matvec_half_parts: " + std::to_string(parts.size()) + " parts of " + std::string(type_name(type)) +
                           " weights, " + std::to_string(cols) + " columns, rows of " + std::to_string(w_row_bytes) +
                           " bytes do not fit the kernel (f16 / bf16; 1.." + std::to_string(kMaxMatvecParts) +
                           " parts; columns a multiple of 8 up to " + std::to_string(kMaxHalfMatvecCols) +
                           "; weights, rows, x, norm weight and normed 16-byte aligned)");
  int64_t total = 0;
  const detail::GroupedSegments seg = detail::segments_of(parts, &total);
  if (type == GgmlType::BF16) return detail::dispatch_warps<detail::HalfBF16>(seg, total, cols, w_row_bytes, in, stream);
  return detail::dispatch_warps<detail::HalfF16>(seg, total, cols, w_row_bytes, in, stream);
}

}  // namespace kiln::cuda
