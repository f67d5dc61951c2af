#pragma once
// The grouped decode matvec for 16-bit float weights, f16 and bf16 (matvec_f16_grouped.cu):
// the parts of matvec_grouped.h -- up to kMaxMatvecParts matrices over one x stacked by rows
// in one launch, each with an optional bias (`add`) and residual (`accumulate`) -- with x
// in f32 as an F32Input, RMS-normalized inside every block when norm_weight is set (the
// normalized vector then written once to `normed`). Weights are multiplied as they are,
// in f32 with f32 sums: no int8 activations. With a pair epilogue (matvec_grouped.h's
// PairEpilogue: rope + cache store after q/k/v, or glu after gate/up) rows are finished in
// pairs instead (matvec_f16_pairs.cu) and the op after the products runs in the launch.
//
// x (normalized) lives in each block's shared memory as f32, 4 bytes per column, so at
// most kMaxHalfMatvecCols columns.
#include <span>

#include "backend/cuda/matvec_grouped.h"

namespace kiln::cuda {

constexpr int64_t kMaxHalfMatvecCols = 16384;

// What the kernel takes: f16 or bf16 weights; 1..kMaxMatvecParts parts, each with rows > 0
// and y set, together fewer than 2^30 rows; cols a positive multiple of 8 and at most
// kMaxHalfMatvecCols; every weight matrix 16-byte aligned with w_row_bytes a multiple of 16
// and >= 2 * cols; x, norm_weight and normed 16-byte aligned, normed only with norm_weight.
// No output (y, accumulate, normed) may overlap x: other blocks may still be reading it.
bool matvec_half_parts_fit(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                           const F32Input& in);
// Whether a launch can run pair epilogue `ep` (matvec_grouped.h; always true for None):
// pair_epilogue_parts_fit, the angle table set for RopeStore, and for Glu token ep.token's
// activation row (ep.glu.out + token * out_stride, gate's rows long) either exactly gate's or
// up's output row, or overlapping none of the outputs, x and normed. Any width the kernel
// takes.
bool matvec_half_pairs_fit(int64_t cols, std::span<const MatvecPart> parts, const F32Input& in,
                           const PairEpilogue& ep);
// y_i = W_i x' + add_i (and accumulate_i += y_i) for every part, x' = x or its RMS norm, and
// what `ep` asks with the finished pairs of rows: the same bits as the products followed by
// rope_store() or glu(). Refuses (Status::invalid, naming the limits) what
// matvec_half_parts_fit or matvec_half_pairs_fit refuses.
Status matvec_half_parts(GgmlType type, int64_t cols, int64_t w_row_bytes, std::span<const MatvecPart> parts,
                         const F32Input& in, cudaStream_t stream, const PairEpilogue& ep = {});

}  // namespace kiln::cuda
