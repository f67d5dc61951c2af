#pragma once
// Device pieces shared by the MoE kernels (moe_matvec.cu, moe_tiled_decode.cu, moe_gemm.cu):
// plain (f32 / f16 / bf16) weights seen through the same decode8 interface as the block
// formats, a visitor over every weight type the MoE kernels take, and the indexed matvecs'
// routing lookups and int8 copies.
#include <cmath>

#include "backend/cuda/block_formats.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/glu_math.cuh"
#include "backend/cuda/moe.h"
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

// ---- the indexed matvecs' pieces (moe_matvec.cu, moe_tiled_decode.cu) ----------------------

// One block of 32 values, lane i holding value i, to int8: lane i stores its value at *q, lane 0
// the block's (scale, scale * sum) at *ds. Every int8 copy of x and h is made here.
__device__ __forceinline__ void quantize_block32(float v, int8_t* q_out, float2* ds_out) {
  const float one[1] = {v};
  quantize_block_spread<kWarpSize, 1>(one, q_out, ds_out);
}

// The expert of slot j of token t, or -1 when the id is out of range.
__device__ __forceinline__ int expert_of(const MoeFfnArgs& a, int64_t t, int64_t j) {
  const int e = a.ids[t * a.ids_stride + j];
  return e >= 0 && e < a.n_expert ? e : -1;
}

__device__ __forceinline__ float bias_at(const ExpertMatrix& m, int expert, int64_t row) {
  return m.bias && expert >= 0 ? m.bias[int64_t(expert) * m.bias_stride + row] : 0.0f;
}

// The end of down's row `row` of token t: `sum` (its slots' weighted products) plus the slots'
// weighted biases, NaN when a slot's id is out of range, stored in out and, with a residual,
// added to it (its old value `old`).
__device__ __forceinline__ void store_down_row(const MoeFfnArgs& a, int64_t t, int64_t row, float sum, float old) {
  for (int64_t j = 0; j < a.n_used; ++j) {
    const int e = expert_of(a, t, j);
    if (e < 0) sum = moe_nan();
    sum += a.weights[t * a.weights_stride + j] * bias_at(a.down, e, row);
  }
  a.out[t * a.out_stride + row] = sum;
  if (a.residual) a.residual[t * a.residual_stride + row] = old + sum;
}

// Where the int8 copies of x and h live (see moe_matvec_scratch_bytes): row i's values at
// qs + i * pitch, its (scale, scale * sum) pairs at ds + i * ds_pitch.
struct Q8Rows {
  const int8_t* qs = nullptr;
  int64_t pitch = 0;  // bytes between rows of qs
  const float2* ds = nullptr;
  int64_t ds_pitch = 0;  // scale pairs between rows' first
};

}  // namespace kiln::cuda::detail
