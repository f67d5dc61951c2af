#pragma once
// The MoE down product's flattened walk over a warp's segments (used by moe_matvec.cu).
//
// segments_dot_q8 (moe_matvec.cu) walks each segment -- one slot's expert row -- in chunks of
// 32 slices of 32 columns, a slice a lane. Where a segment's slice count is not a multiple of
// 32 its last chunk leaves lanes idle: Qwen3-30B-A3B's down rows are 768 columns, 24 slices,
// so a quarter of the lanes idle in every chunk. Here the warp's segments form one sequence of
// slices instead: chunk c covers the flattened slices [32c, 32c + 32), which may come from
// two or more segments, and every chunk but the last is whole (8 slots x 24 slices: 6 chunks
// instead of 8).
//
// A chunk's weight blocks are then not one contiguous range of memory, so every block
// (k-quant super-block, or 32-element block) is copied into its own slot of the stage:
// 16-byte aligned, room for up to 15 bytes of misalignment ahead of the block (its head), the
// block, and the rest of its last 16-byte piece. The block lane l reads is in slot
// l / slices_per_block, whatever segment it came from, at the slot's start plus the block's
// own head. Each lane takes the activations, scales and factor of its own segment.
//
// Summation order: lane l accumulates, in order, factor(s) * dot(slice) over the flattened
// slices l, l + 32, l + 64, ...; the per-segment walk gives it slices l, l + 32, ... of each
// segment in turn. Every term is computed exactly as there (the same dot_q8 on the same bytes,
// the same fmaf), so the two walks differ only in which lane sums which terms, and so in the
// order of the sum: by f32 rounding of the sum, no more. Where the segments are whole chunks
// each lane gets the same terms in the same order, and the results are equal bit for bit.
#include <cstdint>

#include "backend/cuda/block_formats.cuh"
#include "backend/cuda/common.cuh"

namespace kiln::cuda::detail {

template <typename Fmt>
struct FlatChunkShape {
  static constexpr int kSlicesPerBlock = Fmt::kElems / 32;
  static constexpr int kBlocksPerChunk = kWarpSize / kSlicesPerBlock;
  // 16-byte pieces one block may need: up to 15 bytes of head, the block, the last piece's tail.
  static constexpr int kSlotPieces = (15 + Fmt::kBytes + 15) / 16;
  static constexpr int kSlotBytes = 16 * kSlotPieces;
  // + the word load_words may read past the last slot's bytes.
  static constexpr int kStageBytes = kBlocksPerChunk * kSlotBytes + 16;
  // Rounds of the warp's lanes that copy one chunk (every piece of every slot).
  static constexpr int kIssueRounds = (kBlocksPerChunk * kSlotPieces + kWarpSize - 1) / kWarpSize;
};

// Flattened block index -> (segment, block within it), the division by the warp-uniform
// blocks per segment d done as one multiply: n * ceil(2^32 / d) >> 32 == n / d exactly while
// n * d < 2^32 (the host checks n_segs * d * d < 2^32, see moe_flat_walk_fits).
struct SegmentLocator {
  uint64_t magic;
  int n_blocks;
  __device__ explicit SegmentLocator(int blocks_per_seg)
      : magic(((uint64_t(1) << 32) + uint64_t(blocks_per_seg) - 1) / uint64_t(blocks_per_seg)),
        n_blocks(blocks_per_seg) {}
  __device__ __forceinline__ void locate(int block, int& seg, int& b) const {
    seg = int((uint64_t(uint32_t(block)) * magic) >> 32);
    b = block - seg * n_blocks;
  }
};

// Whether SegmentLocator is exact for every block of n_segs segments of n_blocks blocks.
inline bool moe_flat_walk_fits(int64_t n_segs, int64_t n_blocks) {
  return n_segs > 0 && n_blocks > 0 && n_segs * n_blocks <= INT32_MAX / 2 &&
         n_segs * n_blocks * n_blocks < (int64_t(1) << 32);
}

// dot_q8 of the block at byte `off` of the stage `st`, through the widest loads that the
// block's head (its address modulo 16) allows.
template <typename Fmt>
__device__ __forceinline__ float dot_q8_at(const uint8_t* st, int off, int head, int sub, const int* x, float2 ds) {
  if (Fmt::kMaxAlign >= 16 && head == 0) return Fmt::template dot_q8<Fmt::kMaxAlign >= 16 ? 16 : 1>(st, off, sub, x, ds);
  if (Fmt::kMaxAlign >= 4 && (head & 3) == 0) return Fmt::template dot_q8<Fmt::kMaxAlign >= 4 ? 4 : 1>(st, off, sub, x, ds);
  return Fmt::template dot_q8<1>(st, off, sub, x, ds);
}

// A warp's dot products of kRows weight rows with int8 activations over n_segs segments of
// n_blocks blocks each, flattened (see the top):
//   acc[r] += sum_s factor(s) * (row(s, r) . x(s))   (per-lane partial sums)
// `stage` is this warp's [kStages][kRows][kStageBytes] shared buffer; `ready()` runs once the
// first chunks' copies are issued and before any activation is read (as segments_dot_q8).
template <typename Fmt, int kRows, int kStages, typename Segments, typename Ready>
__device__ __forceinline__ void segments_dot_q8_flat(const Segments& segs, int n_segs, int n_blocks, uint8_t* stage,
                                                     float (&acc)[kRows], Ready&& ready) {
  using S = FlatChunkShape<Fmt>;
  const int lane = threadIdx.x % kWarpSize;
  const SegmentLocator where(n_blocks);
  const int all_blocks = n_segs * n_blocks;
  const int total = (all_blocks + S::kBlocksPerChunk - 1) / S::kBlocksPerChunk;
  auto stage_of = [&](int k, int r) { return stage + ((k % kStages) * kRows + r) * S::kStageBytes; };

  // Chunk k's blocks, each into its slot: piece q of the chunk is piece q % kSlotPieces of
  // slot q / kSlotPieces (the pieces a block's head and size do not need are skipped).
  auto issue = [&](int k) {
    if (k < total) {
#pragma unroll
      for (int round = 0; round < S::kIssueRounds; ++round) {
        const int q = round * kWarpSize + lane;
        const int slot = q / S::kSlotPieces, piece = q % S::kSlotPieces;
        const int block = k * S::kBlocksPerChunk + slot;
        if (slot < S::kBlocksPerChunk && block < all_blocks) {
          int seg, b;
          where.locate(block, seg, b);
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const uintptr_t addr = reinterpret_cast<uintptr_t>(segs.row(seg, r) + int64_t(b) * Fmt::kBytes);
            if (piece < (int(addr & 15) + Fmt::kBytes + 15) / 16)
              cp_async_16(stage_of(k, r) + slot * S::kSlotBytes + 16 * piece,
                          reinterpret_cast<const uint8_t*>(addr & ~uintptr_t(15)) + 16 * piece);
          }
        }
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue(k);
  ready();
  const int slot = lane / S::kSlicesPerBlock, sub = lane % S::kSlicesPerBlock;
  for (int k = 0; k < total; ++k) {
    issue(k + kStages - 1);
    const int block = k * S::kBlocksPerChunk + slot;
    const bool active = block < all_blocks;
    int seg = 0, b = 0;
    if (active) where.locate(block, seg, b);
    int x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float2 ds = make_float2(0.0f, 0.0f);
    if (active) {
      const int slice = b * S::kSlicesPerBlock + sub;
      const int4* xv = reinterpret_cast<const int4*>(segs.xqs(seg) + 32 * int64_t(slice));
      // Written by the kernel before, read after ready()'s wait.
      const int4 lo = __ldg(xv), hi = __ldg(xv + 1);
      x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
      ds = __ldg(segs.xds(seg) + slice);
    }
    cp_async_wait<kStages - 1>();  // chunk k has landed (this lane's copies)
    __syncwarp();                  // ... and every lane's
    if (active) {
      const float factor = segs.factor(seg);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int head = int(reinterpret_cast<uintptr_t>(segs.row(seg, r) + int64_t(b) * Fmt::kBytes) & 15);
        const float d = dot_q8_at<Fmt>(stage_of(k, r), slot * S::kSlotBytes + head, head, sub, x, ds);
        acc[r] = fmaf(factor, d, acc[r]);
      }
    }
    __syncwarp();  // the stage is refilled next iteration
  }
  cp_async_wait<0>();
}

}  // namespace kiln::cuda::detail
