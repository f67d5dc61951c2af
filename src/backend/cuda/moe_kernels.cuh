#pragma once
// Device pieces shared by the MoE kernels (moe_matvec.cu, moe_gemm.cu): plain
// (f32 / f16 / bf16) weights seen through the same decode8 interface as the block formats,
// and a visitor over every weight type the MoE kernels take.
#include <cmath>

#include "backend/cuda/block_formats.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/glu_math.cuh"
#include "backend/cuda/ops.h"

namespace kiln::cuda::detail {

__device__ __forceinline__ float moe_nan() { return __int_as_float(0x7fc00000); }

// Plain weights as "blocks" of one element: decode8 reads 8 consecutive elements starting
// at b (any alignment of the element size), load1 one element.
template <GgmlType T>
struct PlainFormat {
  static constexpr bool kPlain = true;
  static constexpr int kElems = 1;
  static constexpr int kBytes = T == GgmlType::F32 ? 4 : 2;
  static constexpr bool kBf16 = T == GgmlType::BF16;
  __device__ static float load1(const uint8_t* row, int64_t i) {
    if constexpr (T == GgmlType::F32) return __ldg(reinterpret_cast<const float*>(row) + i);
    if constexpr (T == GgmlType::F16) return half_to_float(__ldg(reinterpret_cast<const unsigned short*>(row) + i));
    return bf16_to_float(__ldg(reinterpret_cast<const unsigned short*>(row) + i));
  }
};

template <typename W>
struct IsPlain {
  static constexpr bool value = false;
};
template <GgmlType T>
struct IsPlain<PlainFormat<T>> {
  static constexpr bool value = true;
};

// Elements k0 .. k0+7 of a weight row as floats (k0 a multiple of 8; for block formats the
// 8 never straddle a block).
template <typename W>
__device__ __forceinline__ void load8_weights(const uint8_t* row, int64_t k0, float* v) {
  if constexpr (IsPlain<W>::value) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = W::load1(row, k0 + i);
  } else {
    constexpr int kGroups = W::kElems / 8;
    const int64_t g = k0 / 8;
    W::decode8(row + (g / kGroups) * W::kBytes, int(g % kGroups), v);
  }
}

// Calls f(W{}) for every weight type the MoE kernels take; false for any other type.
template <typename F>
bool visit_moe_format(GgmlType type, F&& f) {
  switch (type) {
    case GgmlType::F32: f(PlainFormat<GgmlType::F32>{}); return true;
    case GgmlType::F16: f(PlainFormat<GgmlType::F16>{}); return true;
    case GgmlType::BF16: f(PlainFormat<GgmlType::BF16>{}); return true;
    default: return visit_quant_format(type, f);
  }
}

__host__ __device__ inline bool is_plain_type(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

}  // namespace kiln::cuda::detail
