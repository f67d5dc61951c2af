// The 16-bit float decode matvec with a pair epilogue (matvec_f16_grouped.h): rows are
// finished in pairs and the op that would otherwise be the next kernel runs on them --
// rope + cache store after q/k/v (pair = rows 2i and 2i + 1 of q, k or v), or glu after
// gate/up (pair = row i of gate and row i of up).
//
// Either way every row's sum is the bits of the one-row kernel (matvec_f16_grouped.cu):
// each of its 32 lanes takes the same columns in the same order (spans in order, even and
// odd elements in two accumulators), and the lanes' values are added in the same butterfly.
//  - Rope (matvec_half_pairs_kernel): a warp takes a pair and reads both rows side by side:
//    a chunk is half as wide (kPairChunkCols) and a lane's kLoadsInFlight 16-byte loads are
//    half from each row, so the registers and the bytes in flight stay as they are, and one
//    x value read from shared memory serves two rows. q/k/v have fewer pairs than the grid
//    has warps: no warp takes more bytes than in the one-row kernel.
//  - Glu (matvec_half_glu_kernel): gate/up has ~3.4 pairs per warp, and whole pairs per warp
//    (the rope kernel's way, still there: KILN_CUDA_HALF_GLU_SPLIT=0) left the busiest warps
//    8 rows where the one-row kernel's have 7: the launch took ~2.8 us longer, more than the
//    glu kernel it saved (docs/perf-notes.md, round 10). So by default two warps
//    of a block share each pair: lanes 0-15 of both read gate's row, lanes 16-31 up's, the
//    even warp the columns of the one-row kernel's lanes 0-15, the odd one those of lanes
//    16-31 -- 8 KB each per pair, one row's worth, and the same balance as the one-row
//    kernel. The odd warp adds the even one's lane sums (handed over in shared memory: the
//    first step of the butterfly) and finishes both rows and the activation.
#include "backend/cuda/env_switch.h"
#include "backend/cuda/matvec_f16_kernel.cuh"
#include "backend/cuda/pair_epilogue.cuh"

namespace kiln::cuda {
namespace detail {

constexpr int kPairLoads = kLoadsInFlight / 2;          // 16-byte loads per lane, row and chunk
constexpr int kPairChunkCols = kSpanCols * kPairLoads;  // 1024

// The two rows (stacked numbering) of pair `item`: rows 2i, 2i + 1 for the rotation (whole
// pairs inside one part: its rows are even); gate row i and up row i for the glu.
__device__ __forceinline__ void pair_rows(const PairEpilogue& ep, const GroupedSegments& seg, int item, int& a,
                                          int& b) {
  if (ep.kind == PairEpilogueKind::Glu) {
    a = item, b = seg.end[0] + item;
  } else {
    a = 2 * item, b = 2 * item + 1;
  }
}

template <typename Weights>
__global__ void __launch_bounds__(kHalfThreads, 2)
    matvec_half_pairs_kernel(GroupedSegments seg, int64_t w_row_bytes, int pairs, int cols, F32Input in,
                             PairEpilogue ep) {
  extern __shared__ __align__(16) float x_s[];  // [half_smem_bytes(cols) / 4], x_slot order
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int pieces = cols / 8;  // 16-byte pieces of a row
  const int chunks = (cols + kPairChunkCols - 1) / kPairChunkCols;
  const int warps_total = int(gridDim.x) * kHalfWarps;
  const int first_pair = int(blockIdx.x) * kHalfWarps + warp;

  uint4 wa[kPairLoads], wb[kPairLoads];  // the chunk of row a, of row b
  auto row_start = [&](int row) {
    int part, local;
    seg.locate(row, part, local);
    return GroupedSegments::pick(seg.w, part) + int64_t(local) * w_row_bytes;
  };
  auto load_chunk = [&](int pair, int chunk) {
    int a, b;
    pair_rows(ep, seg, pair, a, b);
    const int first_piece = chunk * (kPairChunkCols / 8) + lane;
    const uint4* src_a = reinterpret_cast<const uint4*>(row_start(a)) + first_piece;
    const uint4* src_b = reinterpret_cast<const uint4*>(row_start(b)) + first_piece;
#pragma unroll
    for (int u = 0; u < kPairLoads; ++u) {
      const bool in_row = first_piece + u * kWarpSize < pieces;
      wa[u] = in_row ? load_weights_16(src_a + u * kWarpSize) : make_uint4(0, 0, 0, 0);
      wb[u] = in_row ? load_weights_16(src_b + u * kWarpSize) : make_uint4(0, 0, 0, 0);
    }
  };

  if (first_pair < pairs) load_chunk(first_pair, 0);
  stage_input_after_wait(in, cols, x_s);

  const float4* x4 = reinterpret_cast<const float4*>(x_s);
  for (int pair = first_pair; pair < pairs; pair += warps_total) {
    int a, b, part_a, local_a, part_b, local_b;
    pair_rows(ep, seg, pair, a, b);
    seg.locate(a, part_a, local_a);
    seg.locate(b, part_b, local_b);
    // The biases, requested before the dot products so that their round trips overlap them.
    const float* add_a = GroupedSegments::pick(seg.add, part_a);
    const float* add_b = GroupedSegments::pick(seg.add, part_b);
    const float bias_a = add_a && lane < 2 ? add_a[local_a] : 0.0f;
    const float bias_b = add_b && lane < 2 ? add_b[local_b] : 0.0f;
    float a0 = 0.0f, a1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      if (pair != first_pair || chunk != 0) load_chunk(pair, chunk);
#pragma unroll
      for (int u = 0; u < kPairLoads; ++u) {
        const int span = chunk * kPairLoads + u;
        if (span * kWarpSize + lane >= pieces) continue;
        const float4 xa = x4[span * (kSpanCols / 4) + lane], xb = x4[span * (kSpanCols / 4) + kWarpSize + lane];
        dot8<Weights>(wa[u], xa, xb, a0, a1);
        dot8<Weights>(wb[u], xa, xb, b0, b1);
      }
    }
    // Every lane holds both sums (a butterfly reduction): lanes 0 and 1 share the epilogue.
    const float sum_a = warp_sum(a0 + a1), sum_b = warp_sum(b0 + b1);
    const float ya = add_a ? sum_a + bias_a : sum_a;
    const float yb = add_b ? sum_b + bias_b : sum_b;
    if (ep.kind == PairEpilogueKind::Glu) {
      if (lane == 0) glu_pair(ep, local_a, ya, yb, GroupedSegments::pick(seg.y, 0), GroupedSegments::pick(seg.y, 1));
    } else if (lane < 2) {  // lane 0 the even row, lane 1 the odd one
      rope_store_pair(ep, part_a, lane == 0 ? local_a : local_b, lane, lane == 0 ? ya : yb, lane == 0 ? yb : ya,
                      GroupedSegments::pick(seg.y, part_a));
    }
  }
}

constexpr int kGluDuos = kHalfWarps / 2;  // warp pairs of a block

// Waits until both warps of duo d have arrived (named barrier 1 + d; 0 is __syncthreads').
__device__ __forceinline__ void duo_barrier(int d) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + d), "r"(2 * kWarpSize) : "memory");
}

template <typename Weights>
__global__ void __launch_bounds__(kHalfThreads, 2)
    matvec_half_glu_kernel(GroupedSegments seg, int64_t w_row_bytes, int pairs, int cols, F32Input in,
                           PairEpilogue ep) {
  extern __shared__ __align__(16) float x_s[];  // [half_smem_bytes(cols) / 4], x_slot order
  // The even warp's lane sums of a duo, by the parity of the round: one barrier per round
  // keeps a round's slot from being written again before the odd warp has read it.
  __shared__ float handed[kGluDuos][2][kWarpSize];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int odd = warp % 2, duo = warp / 2;
  const int row_lane = kWarpSize / 2 * odd + lane % 16;  // the one-row kernel's lane whose columns this lane reads
  const int part = lane < 16 ? 0 : 1;                    // gate, up
  const int pieces = cols / 8;
  const int chunks = (cols + kChunkCols - 1) / kChunkCols;
  const int duos_total = int(gridDim.x) * kGluDuos;
  const int first_pair = int(blockIdx.x) * kGluDuos + duo;

  uint4 w[kLoadsInFlight];
  auto load_chunk = [&](int pair, int chunk) {
    const int first_piece = chunk * (kChunkCols / 8) + row_lane;
    const uint8_t* row = GroupedSegments::pick(seg.w, part) + int64_t(pair) * w_row_bytes;
    const uint4* src = reinterpret_cast<const uint4*>(row) + first_piece;
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u)
      w[u] = first_piece + u * kWarpSize < pieces ? load_weights_16(src + u * kWarpSize) : make_uint4(0, 0, 0, 0);
  };

  if (first_pair < pairs) load_chunk(first_pair, 0);
  stage_input_after_wait(in, cols, x_s);

  const float4* x4 = reinterpret_cast<const float4*>(x_s);
  for (int pair = first_pair; pair < pairs; pair += duos_total) {
    // The bias, requested before the dot product (by the lanes that will add it).
    const float* add = GroupedSegments::pick(seg.add, part);
    const float bias = add && odd && lane % 16 == 0 ? add[pair] : 0.0f;
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      if (pair != first_pair || chunk != 0) load_chunk(pair, chunk);
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        const int span = chunk * kLoadsInFlight + u;
        if (span * kWarpSize + row_lane >= pieces) continue;
        const float4 a = x4[span * (kSpanCols / 4) + row_lane], b = x4[span * (kSpanCols / 4) + kWarpSize + row_lane];
        dot8<Weights>(w[u], a, b, acc0, acc1);
      }
    }
    float v = acc0 + acc1;
    float* slot = handed[duo][(pair - first_pair) / duos_total % 2];  // by the round's parity
    if (!odd) slot[lane] = v;
    duo_barrier(duo);
    if (!odd) continue;
    // The one-row kernel's butterfly: lane l + lane l + 16 first (here: the even warp's lane
    // sum + this one's, a commutative add), then offsets 8, 4, 2, 1 within each half.
    v = slot[lane] + v;
#pragma unroll
    for (int offset = 8; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
    const float y = add ? v + bias : v;  // lane 0 gate's row, lane 16 up's
    const float up = __shfl_sync(kFullMask, y, 16);
    if (lane == 0) glu_pair(ep, pair, y, up, GroupedSegments::pick(seg.y, 0), GroupedSegments::pick(seg.y, 1));
  }
}

template <typename Weights>
Status launch_pairs(const GroupedSegments& seg, int pairs, int64_t cols, int64_t w_row_bytes, const F32Input& in,
                    const PairEpilogue& ep, cudaStream_t stream) {
  const int64_t blocks_needed = (pairs + kHalfWarps - 1) / kHalfWarps;
  return launch_resident<matvec_half_pairs_kernel<Weights>>(blocks_needed, cols, stream, "matvec_half_pairs_kernel",
                                                             seg, w_row_bytes, pairs, int(cols), in, ep);
}

template <typename Weights>
Status launch_glu(const GroupedSegments& seg, int pairs, int64_t cols, int64_t w_row_bytes, const F32Input& in,
                  const PairEpilogue& ep, cudaStream_t stream) {
  const int64_t blocks_needed = (pairs + kGluDuos - 1) / kGluDuos;
  return launch_resident<matvec_half_glu_kernel<Weights>>(blocks_needed, cols, stream, "matvec_half_glu_kernel", seg,
                                                           w_row_bytes, pairs, int(cols), in, ep);
}

// KILN_CUDA_HALF_GLU_SPLIT=0: the glu takes whole pairs per warp (measured slower, above).
bool glu_split() {
  static const bool split = !env_is("KILN_CUDA_HALF_GLU_SPLIT", "0");
  return split;
}

Status launch_half_pairs(GgmlType type, const GroupedSegments& seg, int64_t total_rows, int64_t cols,
                         int64_t w_row_bytes, const F32Input& in, const PairEpilogue& ep, cudaStream_t stream) {
  const int pairs = int(total_rows / 2);  // glu: gate's rows; rope: half of q + k + v
  const bool bf16 = type == GgmlType::BF16;
  if (ep.kind == PairEpilogueKind::Glu && glu_split())
    return bf16 ? launch_glu<HalfBF16>(seg, pairs, cols, w_row_bytes, in, ep, stream)
                : launch_glu<HalfF16>(seg, pairs, cols, w_row_bytes, in, ep, stream);
  return bf16 ? launch_pairs<HalfBF16>(seg, pairs, cols, w_row_bytes, in, ep, stream)
              : launch_pairs<HalfF16>(seg, pairs, cols, w_row_bytes, in, ep, stream);
}

}  // namespace detail

namespace {

bool overlaps(const float* a, int64_t a_floats, const float* b, int64_t b_floats) {
  return a && b && a < b + b_floats && b < a + a_floats;
}

}  // namespace

bool matvec_half_pairs_fit(int64_t cols, std::span<const MatvecPart> parts, const F32Input& in,
                           const PairEpilogue& ep) {
  if (ep.kind == PairEpilogueKind::None) return true;
  if (!pair_epilogue_parts_fit(parts, ep)) return false;
  if (ep.kind == PairEpilogueKind::RopeStore) return ep.angles != nullptr;
  // Glu: other warps write gate and up rows, and read x, while this one writes its
  // activation: only a row's own place in gate or up may be shared.
  const int64_t n = parts[0].rows;
  const float* out = ep.glu.out + ep.token * ep.glu.out_stride;
  if (out == parts[0].y || out == parts[1].y) return true;
  return !overlaps(out, n, parts[0].y, n) && !overlaps(out, n, parts[1].y, n) && !overlaps(out, n, in.x, cols) &&
         !overlaps(out, n, in.normed, cols);
}

}  // namespace kiln::cuda
