#pragma once
// Prefill products in half precision through cuBLASLt, with the algorithm picked by timing:
// the first product of each shape (and pointer alignment) runs cublasGemmEx with cuBLAS's own
// choice and every candidate that the cuBLASLt heuristic offers (up to 8) three times on the
// real operands, and keeps the fastest; later products of that shape launch it directly.
// Against cublasGemmEx alone this measured +1% to +2% end to end on llama3-8b pp512 when any
// candidate could win (docs/perf-notes.md, round 4); with the bits kept (below), within the
// spread of cublasGemmEx alone (round 32). Timing the candidates, and copying each one's output
// to the host to compare its bits, costs a few to tens of milliseconds per new shape, once per
// process.
//
// Only candidates whose output has cublasGemmEx's bits are timed, so the choice never changes
// a result: two runs of one prompt give the same logits, and so does KILN_CUDA_GEMM_TUNE=0
// (cublasGemmEx alone). Candidates that split k or order its sums otherwise round differently;
// a choice by timing among them made runs differ (docs/perf-notes.md, round 32).
// KILN_CUDA_GEMM_TUNE=2 takes the fastest whatever its bits.
//
// Column-major, as cuBLAS: Y (rows x t, ld ldy, f32) = W^T (W: k x rows, ld ldw) * X (k x t,
// ld ldx), W and X of `type` (CUDA_R_16F or CUDA_R_16BF), f32 accumulation.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/status.h"

namespace kiln::cuda {

struct LtProduct {
  cudaDataType_t type = CUDA_R_16BF;
  int64_t rows = 0, t = 0, k = 0;
  const void* w = nullptr;
  int64_t ldw = 0;
  const void* x = nullptr;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};

// Workspace each concurrent product needs (split-K algorithms keep partial sums there).
inline constexpr size_t kLtWorkspaceBytes = size_t(8) << 20;

// Whether the tuned path is on and this shape already has its algorithm (or is known to
// have none): a product of an untimed shape times candidates, so callers that run products
// side by side run them one after the other until every shape is timed.
bool lt_planned(const LtProduct& p);

// The product by cublasGemmEx with cuBLAS's own algorithm, on `blas`'s stream: the reference
// whose bits every choice keeps. (Also for f32 operands, which the tuned path does not take.)
cublasStatus_t gemm_ex_product(cublasHandle_t blas, const LtProduct& p);

// Launches the product on `stream` (which `blas` is set to) by the chosen algorithm and
// returns true; false when the path is off (KILN_CUDA_GEMM_TUNE=0), cublasGemmEx was the
// fastest, the stream is being captured into a graph before the shape was timed, or nothing
// could be timed (nothing launched then: the caller runs gemm_ex_product). A failing launch of
// a chosen algorithm is an error in *status.
bool lt_product(const LtProduct& p, cublasHandle_t blas, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                Status* status);

}  // namespace kiln::cuda
