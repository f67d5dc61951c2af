#pragma once
// SIMD dequantizers, one per (type, instruction set), chosen once at run time. The family
// files ask fast_dequantizer() for their RowCodec::dequantize_fast; it answers the widest
// kernel the processor (capped by KILN_SIMD) allows, or null when there is none and the
// reference is used. Every fast path gives results identical, bit for bit, to its reference.
#include "quant/codec.h"

namespace kiln {

enum class SimdLevel { Scalar, Avx2, Avx512 };

// The best kernel for `type` that the processor allows (an AVX-512 one, else AVX2), or null.
DequantizeFn fast_dequantizer(GgmlType type);

// The kernel of `type` for exactly `level`, or null when kiln has none or the processor
// (capped by KILN_SIMD) lacks the instruction set. For tests and benchmarks of each level.
DequantizeFn fast_dequantizer_at(GgmlType type, SimdLevel level);

// The AVX2 + FMA + F16C kernels (quant/*_avx2.cpp). Call only when cpu_features().avx2.
// (iq4_nl and iq4_xs: quant/iquant_kernels.h.)
namespace avx2 {
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q5_0(const void* src, float* dst, int64_t n);
void dequantize_q5_1(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_q8_1(const void* src, float* dst, int64_t n);
void dequantize_q2_K(const void* src, float* dst, int64_t n);
void dequantize_q3_K(const void* src, float* dst, int64_t n);
void dequantize_q4_K(const void* src, float* dst, int64_t n);
void dequantize_q5_K(const void* src, float* dst, int64_t n);
void dequantize_q6_K(const void* src, float* dst, int64_t n);
void dequantize_mxfp4(const void* src, float* dst, int64_t n);
void dequantize_nvfp4(const void* src, float* dst, int64_t n);
// quant/lowbit_avx2.cpp
void dequantize_tq1_0(const void* src, float* dst, int64_t n);
void dequantize_tq2_0(const void* src, float* dst, int64_t n);
void dequantize_q1_0(const void* src, float* dst, int64_t n);
void dequantize_q2_0(const void* src, float* dst, int64_t n);
// quant/iquant_lattice_avx2.cpp
void dequantize_iq2_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq2_xs(const void* src, float* dst, int64_t n);
void dequantize_iq2_s(const void* src, float* dst, int64_t n);
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq3_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_m(const void* src, float* dst, int64_t n);
}  // namespace avx2

// The AVX-512 (F, BW, VL, DQ) kernels (quant/*_avx512.cpp). Call only when
// cpu_features().avx512.
namespace avx512 {
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_q2_K(const void* src, float* dst, int64_t n);
void dequantize_q3_K(const void* src, float* dst, int64_t n);
void dequantize_q4_K(const void* src, float* dst, int64_t n);
void dequantize_q5_K(const void* src, float* dst, int64_t n);
void dequantize_q6_K(const void* src, float* dst, int64_t n);
void dequantize_mxfp4(const void* src, float* dst, int64_t n);
void dequantize_iq4_nl(const void* src, float* dst, int64_t n);
void dequantize_iq4_xs(const void* src, float* dst, int64_t n);
}  // namespace avx512

}  // namespace kiln
