#pragma once
// SIMD dequantizers, one per (type, instruction set), chosen once at run time. The family
// files ask fast_dequantizer() for their RowCodec::dequantize_fast; it answers null when the
// processor (or KILN_SIMD) rules the instruction set out, and the reference is used.
// Every fast path gives results identical, bit for bit, to its reference.
#include "quant/codec.h"

namespace kiln {

enum class Fast { F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, NVFP4 };

DequantizeFn fast_dequantizer(Fast kind);

// The AVX2 + FMA + F16C kernels (quant/*_avx2.cpp). Call only when cpu_features().avx2.
namespace avx2 {
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q5_0(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_q2_K(const void* src, float* dst, int64_t n);
void dequantize_q3_K(const void* src, float* dst, int64_t n);
void dequantize_q4_K(const void* src, float* dst, int64_t n);
void dequantize_q5_K(const void* src, float* dst, int64_t n);
void dequantize_q6_K(const void* src, float* dst, int64_t n);
void dequantize_mxfp4(const void* src, float* dst, int64_t n);
void dequantize_nvfp4(const void* src, float* dst, int64_t n);
}  // namespace avx2

}  // namespace kiln
