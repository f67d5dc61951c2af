#pragma once
// Dequantization and quantization of rows of any ggml type.
//
// The *_reference functions are plain scalar code: the definition of each format, tested
// bit-for-bit against ggml, and the truth every SIMD and CUDA kernel is tested against.
// dequantize_row() picks the fastest path the processor supports.
#include <cstdint>

#include "quant/types.h"

namespace kiln {

// Scalar reference: `n` elements (a multiple of the block size) from `src` blocks.
// Throws kiln::Error for a type without a dequantizer.
void dequantize_row_reference(GgmlType type, const void* src, float* dst, int64_t n);

// Same results as the reference (bit for bit), SIMD where the processor allows.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Whether kiln can quantize into `type`.
bool can_quantize(GgmlType type);

// Quantizes `n` elements (a multiple of the block size) into `dst`, which must hold
// row_bytes(type, n). `importance` (n weights, may be null) steers the types that use an
// importance matrix. Throws kiln::Error for a type kiln cannot quantize into.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n,
                  const float* importance = nullptr);

}  // namespace kiln
