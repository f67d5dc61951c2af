// Plain element types: f32, f16, bf16 (read and write) and f64, i8, i16, i32, i64 (read
// only, converted to float as C++ converts them). One element per "block".
#include <cstring>

#include "core/half.h"
#include "quant/codec.h"
#include "quant/fast_paths.h"

namespace kiln {
namespace float_family {

void f32_to_float(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}
void f32_from_float(const float* src, void* dst, int64_t n, const float*) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

// f16: IEEE half; exact widening, round-to-nearest-even narrowing.
void f16_to_float(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
}
void f16_from_float(const float* src, void* dst, int64_t n, const float*) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
}

// bf16: the top half of an f32; narrowing rounds to nearest even and keeps NaNs quiet.
void bf16_to_float(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
}
void bf16_from_float(const float* src, void* dst, int64_t n, const float*) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
}

// Wider or integer types, read only. memcpy per element: rows may be unaligned.
template <typename T>
void plain_to_float(const void* src, float* dst, int64_t n) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, bytes + size_t(i) * sizeof(T), sizeof(T));
    dst[i] = static_cast<float>(v);
  }
}

}  // namespace float_family

std::span<const RowCodec> float_codecs() {
  using namespace float_family;
  static const RowCodec codecs[] = {
      {GgmlType::F32, f32_to_float, nullptr, f32_from_float},
      {GgmlType::F16, f16_to_float, fast_dequantizer(GgmlType::F16), f16_from_float},
      {GgmlType::BF16, bf16_to_float, fast_dequantizer(GgmlType::BF16), bf16_from_float},
      {GgmlType::F64, plain_to_float<double>, nullptr, nullptr},
      {GgmlType::I8, plain_to_float<int8_t>, nullptr, nullptr},
      {GgmlType::I16, plain_to_float<int16_t>, nullptr, nullptr},
      {GgmlType::I32, plain_to_float<int32_t>, nullptr, nullptr},
      {GgmlType::I64, plain_to_float<int64_t>, nullptr, nullptr},
  };
  return codecs;
}

}  // namespace kiln
