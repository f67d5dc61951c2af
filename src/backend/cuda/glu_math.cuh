#pragma once
// The gated activations of glu() (ops.h), one element: shared by the glu kernel, the MoE
// kernels and the f16 / bf16 matvec that takes a GLU's output as its input, so that they all
// give the same bits. The same formulas as the CPU backend's glu (cpu/ops_basic.cpp).
#include <cmath>

#include "backend/cuda/ops.h"

namespace kiln::cuda::detail {

__device__ __forceinline__ float glu_of(GluKind kind, float g, float u, float alpha, float limit) {
  if (kind == GluKind::Silu) return g / (1.0f + expf(-g)) * u;
  if (kind == GluKind::GeluTanh) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * u;
  }
  const float gc = fminf(g, limit);  // SwigluOai
  const float uc = fminf(fmaxf(u, -limit), limit);
  return gc / (1.0f + expf(-alpha * gc)) * (uc + 1.0f);
}

}  // namespace kiln::cuda::detail
