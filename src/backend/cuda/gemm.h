#pragma once
// Prefill matrix products on the tensor cores through cuBLAS:
//
//   Y[t][n] = sum_k X[t][k] * W[n][k]        X f32 [T, K], W [N, K] of any supported type
//
// f16 / bf16 weights: X is rounded to the weights' type, then one product with f32
// accumulation and f32 output by cublasGemmEx (above 8 rows, with KILN_CUDA_GEMM_TUNE on,
// through cuBLASLt with a timed algorithm choice: gemm_lt.h; the scratch holds its
// workspace). f32 weights: a plain f32 cuBLAS product (no TF32).
// Quantized weights (v1): W is dequantized to bf16 in slabs of rows into the scratch buffer,
// then each slab is one bf16 GEMM. This reads the quantized weight once and writes and
// reads a bf16 copy of it (2 bytes per weight) per call: at T = 512 that costs about half
// as much time again as the product itself (see docs/perf-notes.md).
//
// Rounding: with X and W rounded to bf16 each product carries up to 2^-8 relative error,
// so |Y - Y_exact| <= ~2^-8 * sum_k |X W| (f16: 2^-10); against the same rounded inputs the
// f32 accumulation is good to ~1e-5 of sum_k |X W|.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/cuda/status.h"
#include "quant/types.h"

namespace kiln::cuda {

struct GemmArgs {
  GgmlType type = GgmlType::BF16;
  const void* w = nullptr;  // n rows of k elements of `type`, row i at (uint8_t*)w + i * w_row_bytes
  int64_t w_row_bytes = 0;
  int64_t n = 0, k = 0;
  const float* x = nullptr;  // t rows of k, row j at x + j * x_stride
  int64_t x_stride = 0;
  int64_t t = 0;
  float* y = nullptr;        // t rows of n, row j at y + j * y_stride
  int64_t y_stride = 0;
  // Optional, for half and quantized weights: X already rounded to the product's half type
  // (f16 for f16 weights, else bf16), t packed rows of k, 256-byte aligned (glu_half.h
  // writes it). gemm() then reads this instead of rounding x (which may be null).
  const void* x_half = nullptr;
};

bool gemm_supports(GgmlType type);

// Scratch bytes gemm() needs: the rounded copy of X, the cuBLASLt workspace and, for
// quantized weights, one slab of `slab_rows` bf16 weight rows (0: the whole matrix in one slab).
size_t gemm_scratch_bytes(const GemmArgs& args, int64_t slab_rows = 0);

// `blas` is the caller's handle (cublasCreate is slow: make one per stream and keep it);
// gemm() binds it to `stream`. Quantized weights go in slabs of as many rows as fit.
Status gemm(const GemmArgs& args, cublasHandle_t blas, void* scratch, size_t scratch_bytes, cudaStream_t stream);

// Several weights of one width over the same X (q/k/v, gate/up), of one type or, quantized,
// of several (GemmPart::own_type):
//
//   Y_i[t][n] = sum_k X[t][k] * W_i[n][k]
//
// X is rounded to the half type once for all parts, quantized weights are dequantized into
// one slab holding every part's rows, and the products run on the lanes' streams (side by
// side when there are several lanes; measured slower than one lane on an H200, see
// cuda_backend_prefill.cpp). Same rounding as gemm(). With KILN_CUDA_GEMM_TUNE on, products
// of more than 8 rows take the timed cuBLASLt algorithms (gemm_lt.h), each lane with its own
// workspace.
struct GemmPart {
  const void* w = nullptr;  // n rows, row i at (uint8_t*)w + i * w_row_bytes
  int64_t n = 0;
  float* y = nullptr;       // t rows of n, row j at y + j * y_stride
  int64_t y_stride = 0;
  // Quantized parts may each have their own type (Q4_K_M's q/k in q4_K, v in q6_K): the slab
  // is bf16 whatever the source. 0: the args' type and row bytes.
  int64_t own_row_bytes = 0;
  GgmlType own_type = GgmlType::F32;
};

// Joined parts: where every part's weight rows follow the previous part's in memory (as the
// dequantized slab of quantized weights always does, or half weights loaded side by side)
// and every part's output is the next columns of one Y (same y_stride, part i's y right
// after part i-1's last column), the parts run as ONE product of all their rows: a
// 1024-row product (k, v of Llama-3-8B at T = 512) leaves most of an H200 idle, one of
// 6144 rows does not. Same inputs and rounding, so the same result up to the order of the
// f32 accumulation that the chosen algorithm uses.
struct GemmPartsArgs {
  GgmlType type = GgmlType::BF16;  // not f32 (those take gemm()); parts' own types: quantized only
  int64_t w_row_bytes = 0, k = 0;
  const float* x = nullptr;
  int64_t x_stride = 0, t = 0;
  std::span<const GemmPart> parts;
  bool join = true;  // false: one product per part even where they could be joined
  // Optional: X already rounded to the products' half type, as GemmArgs::x_half (then x may
  // be null); the scratch's room for the rounded copy goes unused.
  const void* x_half = nullptr;
};

inline constexpr int kMaxGemmLanes = 4;

// Streams for the parts: lane 0 is the caller's stream and handle; parts 1.. go to lanes
// 1.. (part i to lane i % count), which wait for `fork` (recorded on lane 0 once X and the
// slab are ready) and signal their `join` event, which lane 0 waits for before returning.
// Each lane's handle has its own workspace. count = 1: everything on the caller's stream.
struct GemmLanes {
  int count = 1;
  cudaStream_t stream[kMaxGemmLanes] = {};
  cublasHandle_t blas[kMaxGemmLanes] = {};
  cudaEvent_t fork = nullptr;
  cudaEvent_t join[kMaxGemmLanes] = {};
};

// Scratch bytes gemm_parts() needs: X's half copy, a cuBLASLt workspace per lane and, for
// quantized weights, all parts' rows in bf16.
size_t gemm_parts_scratch_bytes(const GemmPartsArgs& args);

Status gemm_parts(const GemmPartsArgs& args, const GemmLanes& lanes, void* scratch, size_t scratch_bytes);

}  // namespace kiln::cuda
