#pragma once
// Dequantization on the device: whole rows of any supported weight type to f32, bf16 or f16
// (the prefill GEMM's bf16 copy of quantized weights), and the embedding gather.
// Results are bit-identical to dequantize_row_reference (then rounded to nearest even when
// the output is bf16 / f16).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/status.h"
#include "quant/types.h"

namespace kiln::cuda {

enum class OutType : uint8_t { F32, BF16, F16 };

struct DequantArgs {
  GgmlType type = GgmlType::F32;
  const void* src = nullptr;    // rows of `cols` elements of `type`
  int64_t src_row_bytes = 0;
  int64_t rows = 0, cols = 0;
  const int32_t* ids = nullptr; // optional [rows]: output row r is source row ids[r] (a gather)
  int64_t src_rows = 0;         // with ids: rows in src; an id outside [0, src_rows) gives a row of NaN
  void* dst = nullptr;          // rows x cols of `out`, row r at dst + r * dst_stride elements
  int64_t dst_stride = 0;       // elements
  OutType out = OutType::F32;
};

bool dequantize_supports(GgmlType type);

Status dequantize_rows(const DequantArgs& args, cudaStream_t stream);

// Embedding lookup: out[t] = table[ids[t]] as f32 (a DequantArgs with ids).
Status get_rows(GgmlType type, const void* table, int64_t table_row_bytes, int64_t table_rows, int64_t cols,
                const int32_t* ids, int64_t n_ids, float* out, int64_t out_stride, cudaStream_t stream);

}  // namespace kiln::cuda
