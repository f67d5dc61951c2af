#pragma once
// A warp-interleaved twin of q4_0 / q8_0 weights for the int8 decode products.
//
// The grouped decode kernel (matvec_grouped_kernel.cuh) gives each lane one group of 8 blocks
// (256 weights: 144 bytes of q4_0, 272 of q8_0) of a row per item. In the GGUF block layout a
// lane's group is contiguous, so a warp can only read its groups coalesced by copying them
// through shared memory (the kernel's copy stages). The twin holds the same bytes permuted so
// that a warp's 16-byte load k brings word k of every lane's group from consecutive
// addresses: the lanes load their groups straight into registers, coalesced.
//
// Layout (16-byte words; W = 9 or 17 words a group, L lanes a row: 16 for rows of at most 16
// groups, two rows a tile, else 32, one row a tile; S = 32 / L rows a tile): the rows' bytes
// stay where they were by row blocks of S rows; within a row block, chunk c (groups
// c*L .. c*L + G - 1, G = min(L, groups - c*L)) starts at word c*S*L*W, and word k of the group
// of row slot s, chunk lane li is at k*S*G + s*G + li. A permutation within each row block:
// the twin has the original's size, so weights loaded side by side keep their offsets.
//
// Twins are made at load (CudaOptions::interleaved_decode, KILN_CUDA_INTERLEAVED=1) and found
// by address (twin_of): the launch code sees only the original's pointer. Off by default: the
// originals stay (prefill's tiles and get_rows read them), so the weights are held twice, for
// +3.6% Llama-3-8B Q8_0 decode and +0.6% Q4_0 (docs/perf-notes.md, round 13).
// KILN_CUDA_INTERLEAVED=2 permutes the weights in place instead (no second copy): then
// dequantize_rows (prefill's slabs, get_rows) reads the layout too, and every other reader of
// q4_0 / q8_0 weights refuses them (in_place) rather than read them wrong.
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

// Where word k (16 bytes) of group `group` of row `row` lies in the twin of a matrix whose rows
// have `groups` groups of `words` words, in words from the twin's start (the layout above).
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
// Whether a rows x cols matrix of `type` can have a twin.
bool interleavable(GgmlType type, int64_t rows, int64_t cols);

// dst (as many bytes as src, device memory) = the twin of src's rows x cols weights.
Status interleave_weights(GgmlType type, const void* src, void* dst, int64_t rows, int64_t cols,
                          cudaStream_t stream);

// The twin registry, one entry a matrix: twin_of(p, span, tile_bytes) is the same offset into
// the twin of the registered matrix that holds [p, p + span), when p is a whole number of
// tiles (tile_bytes: a tile's rows) from the matrix's start; else null.
// A matrix interleaved in place is registered as its own twin (twin == base): then nothing may
// read it in the block layout, and in_place(p) says so for every p inside it.
void register_twin(const void* base, size_t bytes, const void* twin);
void unregister_twin(const void* base);
const uint8_t* twin_of(const void* p, size_t span, size_t tile_bytes);
bool in_place(const void* p);
// The matrix interleaved in place that holds p: its first byte and size; false where none does.
bool in_place_matrix(const void* p, const uint8_t*& base, size_t& bytes);

// The tile of rows of a matrix of `cols` weights a row, in bytes (twin_of's tile_bytes).
inline size_t interleave_tile_bytes(int64_t cols, int64_t row_bytes) {
  return size_t(32 / interleave_lanes(cols / 256)) * size_t(row_bytes);
}

}  // namespace kiln::cuda
