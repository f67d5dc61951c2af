#pragma once
// Row kernels of the i-quant family, gathered into codecs by quant/iquants.cpp.
// All take `n` weights, a multiple of the type's block size (checked by quant.cpp).
//
// The scalar dequantizers reproduce ggml's dequantize_row_iq* bit for bit: each weight is
// computed with the same float operations in the same order.
#include <cstdint>

namespace kiln::iquant {

// Lattice types (quant/iquant_lattice.cpp).
void dequantize_iq2_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq2_xs(const void* src, float* dst, int64_t n);
void dequantize_iq2_s(const void* src, float* dst, int64_t n);
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq3_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_m(const void* src, float* dst, int64_t n);

// Non-linear 4-bit types (quant/iquant_iq4.cpp).
void dequantize_iq4_nl(const void* src, float* dst, int64_t n);
void dequantize_iq4_xs(const void* src, float* dst, int64_t n);
void quantize_iq4_nl(const float* src, void* dst, int64_t n, const float* importance);
void quantize_iq4_xs(const float* src, void* dst, int64_t n, const float* importance);

// AVX2 versions of the iq4 dequantizers, identical results (quant/iquant_iq4_avx2.cpp).
// Call only where cpu_features().avx2 holds.
void dequantize_iq4_nl_avx2(const void* src, float* dst, int64_t n);
void dequantize_iq4_xs_avx2(const void* src, float* dst, int64_t n);

}  // namespace kiln::iquant
