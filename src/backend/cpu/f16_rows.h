#pragma once
// Rows of f16 (IEEE half) for the KV cache: narrowing f32 -> f16 (round to nearest even,
// the same bits as core/half.h), widening f16 -> f32 (exact), and the dot product of an
// f16 row with an f32 row (the products summed in f32). The AVX2 and AVX-512 kernels use
// F16C's conversions; results of the narrowing and widening are identical at every level,
// the dot product differs only in the order of its f32 sums.
#include <cstdint>
#include <string_view>
#include <vector>

namespace kiln::cpu {

struct F16RowKernels {
  std::string_view level;  // "plain", "avx2", "avx512"
  void (*narrow)(const float* src, uint16_t* dst, int64_t n);
  void (*widen)(const uint16_t* src, float* dst, int64_t n);
  float (*dot)(const uint16_t* a, const float* b, int64_t n);
};

// The widest kernels the processor allows (core/cpu_features.h, capped by KILN_SIMD).
F16RowKernels f16_row_kernels();
// Every level the processor allows, plain first (for tests).
std::vector<F16RowKernels> f16_row_kernels_here();

namespace f16_plain {
void narrow(const float* src, uint16_t* dst, int64_t n);
void widen(const uint16_t* src, float* dst, int64_t n);
float dot(const uint16_t* a, const float* b, int64_t n);
}  // namespace f16_plain

// AVX2 + FMA + F16C (f16_rows_avx2.cpp).
namespace avx2 {
void narrow_f16(const float* src, uint16_t* dst, int64_t n);
void widen_f16(const uint16_t* src, float* dst, int64_t n);
float dot_f16_f32(const uint16_t* a, const float* b, int64_t n);
}  // namespace avx2

// AVX-512 F (f16_rows_avx512.cpp).
namespace avx512 {
void narrow_f16(const float* src, uint16_t* dst, int64_t n);
void widen_f16(const uint16_t* src, float* dst, int64_t n);
float dot_f16_f32(const uint16_t* a, const float* b, int64_t n);
}  // namespace avx512

}  // namespace kiln::cpu
