#pragma once
// The row-tile layout of stacked q4_K / q6_K expert matrices (ffn_*_exps), which the MoE
// decode kernels load straight into registers and the MoE prefill GEMM copies back into rows.
//
// Why: in the GGUF block layout a lane that owns a group of 256 weights of a row (one q4_K
// block, 144 bytes; one q6_K block, 210) finds its bytes contiguous, so the lanes of a warp
// read 144 or 210 bytes apart: each 16-byte load touches a sector of its own, and q6_K's
// blocks are only 2-byte aligned. Staging them through shared memory costs more instructions
// than the products themselves (the MoE kernels ran ~0.45 instructions a weight byte against
// 0.13 for the dense products' layout, docs/perf-notes.md, round 25).
//
// Layout (16-byte words): rows stay in their tiles of 8 rows (tile t holds rows 8t .. 8t + 7
// of the stacked [expert][row] matrix, at the bytes those rows had). Inside a tile, group g
// of every row sits together at g * 8 * group_bytes, its words interleaved by row: word k of
// row slot s (row % 8) at (k * 8 + s) * 16. So the rows of a tile read word k of a group
// from one run of 128 bytes. q4_K groups are 9 words. q6_K groups are 13 words (ql, qh, the
// scales: bytes 0-207) and d: the 8 rows' d's fill word 104 of the group's 105, d of slot s
// at byte 104 * 16 + 2 s. A permutation within each tile (whole words: 8 x 144 and 8 x 210
// are multiples of 16), in place.
//
// The backend permutes expert matrices at load where expert_tiles_fit says they can
// (CudaOptions::expert_tiles; not in exact mode) and says so in ExpertMatrix::row_tiles; only
// the MoE kernels read them.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/status.h"
#include "quant/types.h"

namespace kiln::cuda {

constexpr int kExpertTileRows = 8;
constexpr int kExpertTileGroupWeights = 256;

// Bytes of a group of 256 weights (144 q4_K, 210 q6_K) and its words in the layout before d.
constexpr int expert_tile_group_bytes(GgmlType type) { return type == GgmlType::Q6_K ? 210 : 144; }
constexpr int expert_tile_group_words(GgmlType type) { return type == GgmlType::Q6_K ? 13 : 9; }

// The layout's terms, each a byte offset: the tile holding row `row` from the matrix's start
// (rows of `groups` groups of `group_bytes`); group `group`'s region from its tile's start; word
// k of the row in tile slot `slot` from its group's region; a q6_K row's d from its group's
// region. Kernels that keep a row's tile and slot add them up themselves (fewer 64-bit sums).
__host__ __device__ constexpr int64_t expert_tile_start(int64_t row, int64_t groups, int group_bytes) {
  return row / kExpertTileRows * kExpertTileRows * groups * group_bytes;
}
__host__ __device__ constexpr int64_t expert_tile_group_start(int64_t group, int group_bytes) {
  return group * kExpertTileRows * group_bytes;
}
__host__ __device__ constexpr int expert_tile_word_in_group(int k, int slot) { return (k * kExpertTileRows + slot) * 16; }
__host__ __device__ constexpr int expert_tile_q6_k_d_in_group(int slot) {
  return expert_tile_word_in_group(expert_tile_group_words(GgmlType::Q6_K), 0) + 2 * slot;
}

// Byte offset of word k of group `group` of row `row` (of the stacked matrix) from the
// matrix's start, for rows of `groups` groups of `group_bytes`.
__host__ __device__ constexpr int64_t expert_tile_word_byte(int64_t row, int64_t group, int k, int64_t groups,
                                                            int group_bytes) {
  return expert_tile_start(row, groups, group_bytes) + expert_tile_group_start(group, group_bytes) +
         expert_tile_word_in_group(k, int(row % kExpertTileRows));
}

// Byte offset of a q6_K group's d (2 bytes) in the layout.
__host__ __device__ constexpr int64_t expert_tile_q6_k_d_byte(int64_t row, int64_t group, int64_t groups) {
  constexpr int kBytes = expert_tile_group_bytes(GgmlType::Q6_K);
  return expert_tile_start(row, groups, kBytes) + expert_tile_group_start(group, kBytes) +
         expert_tile_q6_k_d_in_group(int(row % kExpertTileRows));
}

// Whether stacked experts of `rows` rows of `cols` weights each can take the layout: q4_K or
// q6_K, whole groups of 256, rows a multiple of 32 (whole tiles per expert, and the decode
// gate / up kernel's blocks of 32 rows, one int8 block of h each).
constexpr bool expert_tiles_fit(GgmlType type, int64_t rows, int64_t cols) {
  return (type == GgmlType::Q4_K || type == GgmlType::Q6_K) && cols > 0 && cols % kExpertTileGroupWeights == 0 &&
         rows > 0 && rows % 32 == 0;
}

// Permutes n_expert stacked matrices of rows x cols weights (device memory) into the layout,
// one expert at a time through a temporary copy of its bytes; synchronizes `stream`.
Status tile_experts_in_place(GgmlType type, void* data, int64_t n_expert, int64_t rows, int64_t cols,
                             cudaStream_t stream);

}  // namespace kiln::cuda
