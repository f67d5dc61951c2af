#pragma once
// Prefill products in half precision through cuBLASLt, with the algorithm picked by timing
// (off by default: KILN_CUDA_GEMM_TUNE=1 or 2 turns it on). The first product of each shape
// (and pointer alignment) runs cublasGemmEx with cuBLAS's own choice and every candidate that
// the cuBLASLt heuristic offers (up to 8) three times on the real operands, and keeps the
// fastest; later products of that shape launch it directly.
//
// Why off: with any candidate allowed (mode 2) it measured +1% to +2% on llama3-8b pp512
// (docs/perf-notes.md, round 4), but such candidates round differently from cublasGemmEx and
// a choice by timing among them made two runs of one prompt give other logits (round 32).
// Keeping only candidates with cublasGemmEx's bits (mode 1) measured within the spread of
// cublasGemmEx alone (rounds 32 and 33), while each new shape, and so each new prompt length,
// paid the timing and the bit comparison's host copies: ~0.13 s for a 512-token Llama-3-8B
// prefill's first pass (round 33).
//
// Mode 1 times only candidates whose output has cublasGemmEx's bits, so the choice never
// changes a result; mode 2 takes the fastest whatever its bits.
//
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

// The tuning mode: KILN_CUDA_GEMM_TUNE (0 off, the default; 1 cublasGemmEx's bits; 2 any
// bits) until set_gemm_tuning_mode (for tests) changes it for the process. Plans are kept per
// mode.
int gemm_tuning_mode();
void set_gemm_tuning_mode(int mode);

// Whether the tuned path is off, or this shape already has its algorithm (or is known to
// have none): a product of an untimed shape times candidates, so callers that run products
// side by side run them one after the other until every shape is timed.
bool lt_planned(const LtProduct& p);

// The product by cublasGemmEx with cuBLAS's own algorithm, on `blas`'s stream: the reference
// whose bits every choice keeps. (Also for f32 operands, which the tuned path does not take.)
cublasStatus_t gemm_ex_product(cublasHandle_t blas, const LtProduct& p);

// Launches the product on `stream` (which `blas` is set to) by the chosen algorithm and
// returns true; false when the path is off (mode 0), cublasGemmEx was the
// fastest, the stream is being captured into a graph before the shape was timed, or nothing
// could be timed (nothing launched then: the caller runs gemm_ex_product). A failing launch of
// a chosen algorithm is an error in *status.
bool lt_product(const LtProduct& p, cublasHandle_t blas, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                Status* status);

}  // namespace kiln::cuda
