#pragma once
// Rounded copies of f32 activations for a prefill product's half input (gemm.h's x_half):
// f16 or bf16 by round-to-nearest-even, as gemm() rounds X itself (dequantize_rows' f32 rows
// to OutType::F16 / BF16), so the product reading the copy gets the bits it would have made.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kiln::cuda::detail {

// Two values as one 4-byte f16 / bf16 pair (the lower address holds a).
__device__ __forceinline__ uint32_t half_pair_bits(float a, float b, bool bf16) {
  if (bf16) {
    const __nv_bfloat162 h = __halves2bfloat162(__float2bfloat16_rn(a), __float2bfloat16_rn(b));
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  const __half2 h = __halves2half2(__float2half_rn(a), __float2half_rn(b));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Four values with one 8-byte store (dst 8-byte aligned).
__device__ __forceinline__ void store_half4(void* dst, float4 v, bool bf16) {
  *static_cast<uint2*>(dst) = make_uint2(half_pair_bits(v.x, v.y, bf16), half_pair_bits(v.z, v.w, bf16));
}

}  // namespace kiln::cuda::detail
