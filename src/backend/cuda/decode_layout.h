#pragma once
// The warp-interleaved layout of q4_0 / q8_0 / q4_K / q6_K weights, which the int8 decode
// products read.
//
// The grouped decode kernel (matvec_grouped_kernel.cuh) gives each lane one group of 256
// weights of a row per item (8 blocks of q4_0, 144 bytes, or of q8_0, 272; one q4_K block,
// 144). In the GGUF block layout a lane's group is contiguous, so a warp can only read its
// groups coalesced by copying them through shared memory (the kernel's copy stages). In this
// layout the same bytes are permuted so that a warp's 16-byte load k brings word k of every
// lane's group from consecutive addresses: the lanes load their groups straight into
// registers, coalesced.
//
// Layout (16-byte words; W = 9 or 17 words a group, q6_K below; L lanes a row: 16 for rows of
// at most 16 groups, two rows a tile, else 32, one row a tile; S = 32 / L rows a tile): the rows' bytes
// stay where they were by row blocks of S rows; within a row block, chunk c (groups
// c*L .. c*L + G - 1, G = min(L, groups - c*L)) starts at word c*S*L*W, and word k of the group
// of row slot s, chunk lane li is at k*S*G + s*G + li. A permutation within each row block, so
// weights loaded side by side keep their offsets.
//
// The backend permutes q4_0 / q8_0 matrices in place at load (CudaOptions::interleaved_decode,
// on by default; KILN_CUDA_INTERLEAVED=0 turns it off; q4_K and q6_K ones as interleaved_q4_k
// and interleaved_q6_k say) and
// registers them here. The readers that know the layout (the grouped products, the int8 glu
// kernel, dequantize_rows for prefill's slabs and get_rows) look their weights up by address;
// every other reader of these types refuses registered ones rather than read them as blocks.
// Measured: Llama-3-8B tg128 Q8_0 +3.8%, Q4_0 +1.1% (docs/perf-notes.md, round 14).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/status.h"
#include "quant/types.h"

namespace kiln::cuda {

// Lanes a row of `groups` groups of 256 weights takes in the layout: 16 for at most 16 groups
// (two rows a tile), else 32 (one row a tile). A kernel with another number of lanes a row
// reads it too: interleaved_word gives every word's place.
constexpr int interleave_lanes(int64_t groups) { return groups <= 16 ? 16 : 32; }
// Rows a tile of the layout holds (the slots of a warp): 2 or 1.
constexpr int interleave_tile_rows(int64_t groups) { return 32 / interleave_lanes(groups); }

// Where word k (16 bytes) of group `group` of row `row` lies in a matrix in the layout whose
// rows have `groups` groups of `words` words, in words from the matrix's start.
constexpr int64_t interleaved_word(int64_t row, int64_t group, int k, int64_t groups, int words) {
  // Shifts and masks, not divisions: 64-bit division is a subroutine call in device code.
  const int shift = groups <= 16 ? 4 : 5;  // log2 of the lanes
  const int lanes = 1 << shift, slots = 32 >> shift;
  const int chunk = int(group) >> shift, rest = int(groups) - (chunk << shift);
  const int chunk_groups = rest < lanes ? rest : lanes;
  const int slot = int(row) & (slots - 1);
  return (row - slot) * groups * words + int64_t(chunk) * slots * lanes * words + int64_t(k) * slots * chunk_groups +
         slot * chunk_groups + (int(group) & (lanes - 1));
}

// q6_K groups are 210 bytes: 13 words (ql, qh and the scales, bytes 0-207) and d (2 bytes). A
// tile of S rows of G groups (S * G * 210 bytes, whole words when G is a multiple of 8) holds
// the groups' 13 words as interleaved_word places them (words = 13, counted from the tile's
// start), then the tile's d's, slot-major: d of (slot, group) at byte S * G * 208 +
// 2 * (slot * G + group) of the tile. A permutation within the tile, as for the other types.
constexpr int kQ6KGroupBytes = 210, kQ6KLayoutWords = 13;
constexpr int64_t interleaved_q6_k_word(int64_t row, int64_t group, int k, int64_t groups) {
  const int slot = int(row) & (interleave_tile_rows(groups) - 1);
  return (row - slot) * groups * kQ6KGroupBytes / 16 + interleaved_word(slot, group, k, groups, kQ6KLayoutWords);
}
constexpr int64_t interleaved_q6_k_d_byte(int64_t row, int64_t group, int64_t groups) {
  const int slots = interleave_tile_rows(groups), slot = int(row) & (slots - 1);
  return (row - slot) * groups * kQ6KGroupBytes + slots * groups * 16 * kQ6KLayoutWords + 2 * (slot * groups + group);
}

// The types the layout takes: groups of 256 weights in whole 16-byte words, and q6_K.
constexpr bool interleaved_type(GgmlType type) {
  return type == GgmlType::Q4_0 || type == GgmlType::Q8_0 || type == GgmlType::Q4_K || type == GgmlType::Q6_K;
}
// Whether a rows x cols matrix of `type` can take the layout: an interleaved_type, whole
// groups of 256 weights, whole tiles of rows (for q6_K, rows of a multiple of 8 groups).
bool interleavable(GgmlType type, int64_t rows, int64_t cols);

// Permutes w's rows x cols weights (device memory) into the layout, through a temporary copy
// of w; synchronizes `stream`. Does not register them.
Status interleave_in_place(GgmlType type, void* w, int64_t rows, int64_t cols, cudaStream_t stream);

// The registry of matrices in the layout, one entry a matrix.
void register_interleaved(const void* base, size_t bytes);
void unregister_interleaved(const void* base);
// Whether any byte of [p, p + span) lies inside a registered matrix.
bool is_interleaved(const void* p, size_t span);
// The registered matrix that holds p: its first byte and size; false where none does.
bool interleaved_matrix(const void* p, const uint8_t*& base, size_t& bytes);
// Whether [p, p + span) lies inside one registered matrix and starts a whole number of tiles
// (tile_bytes: a tile's rows) from its start: what a product reading the layout needs.
bool interleaved_tiles(const void* p, size_t span, size_t tile_bytes);


}  // namespace kiln::cuda
