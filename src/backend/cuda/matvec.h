#pragma once
// Decode matrix-vector products against weights in their GGUF block layout:
//
//   y[r] = sum_i W[r][i] * x[i]  (+ add[r])          r < rows, i < cols
//
// Quantized weights (q4_0 q4_1 q5_0 q5_1 q8_0 q2_K..q6_K iq4_nl iq4_xs mxfp4) are read as
// stored and multiplied with x quantized to int8 in blocks of 32 (as llama.cpp's MMVQ does):
// integer dot products per block, one float scaling per (sub-)block, f32 accumulation.
// Quantizing x costs at most half a step of its block's scale per element:
//   |y - y_exact| <= sum_b (max|x in b| / 254) * sum_{i in b} |W[r][i]|  (+ f32 rounding).
// f32 / f16 / bf16 weights use x as it is, with f32 accumulation.
//
// Weight rows are read in aligned 16-byte pieces: the weight buffer must stay readable up to
// the next 16-byte boundary after its last byte (cudaMalloc'd buffers always are).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/status.h"
#include "quant/types.h"

namespace kiln::cuda {

// x quantized for the integer dot products: qs[i] = round(x[i] / d_b) with
// d_b = max|x in block b| / 127 (0 for an all-zero block), ds[b] = (d_b, d_b * sum of qs in b).
struct Q8Vector {
  int8_t* qs = nullptr;  // [n], 16-byte aligned
  float2* ds = nullptr;  // [n / 32], 8-byte aligned
  int64_t n = 0;         // a multiple of 32
};

struct MatvecArgs {
  GgmlType type = GgmlType::F32;
  const void* w = nullptr;     // rows x cols of `type`; row r starts at (uint8_t*)w + r * w_row_bytes
  int64_t w_row_bytes = 0;
  int64_t rows = 0, cols = 0;
  const float* x = nullptr;    // [cols]
  const float* add = nullptr;  // [rows] or null: y = W x + add. May alias y (in-place residual).
  float* y = nullptr;          // [rows]
  // Tuning knobs for benchmarks (0 picks): rows each warp owns (1, 2); warps sharing one
  // row group's columns (1, 2, 4; quantized weights only).
  int rows_per_warp = 0;
  int warps_per_row = 0;
};

// Whether matvec() takes weights of this type.
bool matvec_supports(GgmlType type);

// Scratch bytes matvec() needs for weights of `type` and `cols` columns (the int8 copy of
// x; 0 for float weights). Q8Vector views of it come from q8_vector_in().
size_t matvec_scratch_bytes(GgmlType type, int64_t cols);
Q8Vector q8_vector_in(void* scratch, int64_t n);
// Bytes of one int8 copy of n values as q8_vector_in lays it out: the values padded to 16
// bytes, then a (d, d * sum) pair per block of 32.
size_t q8_vector_bytes(int64_t n);
// Whether rows of such copies of n values (a multiple of 32), the first at `rows` and each
// `row_bytes` after the one before, are 16-byte aligned and each hold a whole copy.
bool q8_rows_fit(const void* rows, int64_t row_bytes, int64_t n);

// x (n floats, n % 32 == 0) -> q.
Status quantize_q8(const float* x, int64_t n, const Q8Vector& q, cudaStream_t stream);

// y = W x + add with x already quantized (one quantized x can serve several matvecs).
// Quantized weight types only.
Status matvec_q8(const MatvecArgs& args, const Q8Vector& xq, cudaStream_t stream);

// The whole product: quantizes x into `scratch` when the weights are quantized.
Status matvec(const MatvecArgs& args, void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace kiln::cuda
