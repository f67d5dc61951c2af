#include "backend/cpu/f16_rows.h"

#include "core/cpu_features.h"
#include "core/half.h"

namespace kiln::cpu {

namespace f16_plain {

void narrow(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void widen(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

float dot(const uint16_t* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += f16_to_f32(a[i]) * b[i];
  return s;
}

}  // namespace f16_plain

std::vector<F16RowKernels> f16_row_kernels_here() {
  std::vector<F16RowKernels> levels = {{"plain", f16_plain::narrow, f16_plain::widen, f16_plain::dot}};
  if (cpu_features().avx2) levels.push_back({"avx2", avx2::narrow_f16, avx2::widen_f16, avx2::dot_f16_f32});
  if (cpu_features().avx512) levels.push_back({"avx512", avx512::narrow_f16, avx512::widen_f16, avx512::dot_f16_f32});
  return levels;
}

F16RowKernels f16_row_kernels() {
  static const F16RowKernels best = f16_row_kernels_here().back();
  return best;
}

}  // namespace kiln::cpu
