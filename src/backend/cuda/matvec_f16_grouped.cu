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
#include "backend/cuda/matvec_f16_kernel.cuh"

#include <string>

namespace kiln::cuda {
namespace detail {

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
  stage_input_after_wait(in, cols, x_s);

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
        const float4 a = x4[span * (kSpanCols / 4) + lane], b = x4[span * (kSpanCols / 4) + kWarpSize + lane];
        dot8<Weights>(w[u], a, b, acc0, acc1);
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
  const int64_t blocks_needed = (total_rows + kHalfWarps - 1) / kHalfWarps;
  return launch_resident<matvec_half_kernel<Weights>>(blocks_needed, cols, stream, "matvec_half_kernel", seg,
                                                      w_row_bytes, int(total_rows), int(cols), in);
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
                         const F32Input& in, cudaStream_t stream, const PairEpilogue& ep) {
  if (!matvec_half_parts_fit(type, cols, w_row_bytes, parts, in))
    return Status::invalid("matvec_half_parts: " + std::to_string(parts.size()) + " parts of " +
                           std::string(type_name(type)) + " weights, " + std::to_string(cols) +
                           " columns, rows of " + std::to_string(w_row_bytes) +
                           " bytes do not fit the kernel (f16 / bf16; 1.." + std::to_string(kMaxMatvecParts) +
                           " parts; columns a multiple of 8 up to " + std::to_string(kMaxHalfMatvecCols) +
                           "; weights, rows, x, norm weight and normed 16-byte aligned)");
  int64_t total = 0;
  const detail::GroupedSegments seg = detail::segments_of(parts, &total);
  if (ep.kind != PairEpilogueKind::None) {
    if (!matvec_half_pairs_fit(cols, parts, in, ep))
      return Status::invalid("matvec_half_parts: the pair epilogue does not fit (rope + store: q/k/v of even rows "
                             "and whole heads, k and v as wide as the cache, the angle table set; glu: gate and "
                             "up of equal rows, the activation not overlapping x or the outputs but its own row)");
    return detail::launch_half_pairs(type, seg, total, cols, w_row_bytes, in, ep, stream);
  }
  if (type == GgmlType::BF16) return detail::launch_half<detail::HalfBF16>(seg, total, cols, w_row_bytes, in, stream);
  return detail::launch_half<detail::HalfF16>(seg, total, cols, w_row_bytes, in, stream);
}

}  // namespace kiln::cuda
