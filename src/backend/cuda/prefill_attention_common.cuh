#pragma once
// What the prefill attention kernels (v6: prefill_attention.cu, v8: prefill_attention_v8.cu)
// share: the f16 tensor-core product, ldmatrix loads, 16-byte async copies, f16 packing,
// the cache slot of a key and the order in which query blocks go out.
//
// Fragments follow mma.m16n8k16 (row.col, f16 in, f32 accumulate): lane = 4 * g + t holds
// rows g and g + 8, columns 2t, 2t + 1 (and + 8) of each 16 x 16 / 16 x 8 piece.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/prefill_attention.h"

namespace kiln::cuda::prefill_detail {

constexpr int kPad = 8;  // f16 elements after each shared row: rows start 4 banks apart

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Four 8 x 8 f16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __half* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// 16 bytes global -> shared, or 16 zero bytes when `valid` is false (src is then not read).
__device__ __forceinline__ void cp_async_16_or_zero(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Four consecutive elements as f16 into shared memory.
__device__ __forceinline__ void store4(__half* dst, float4 v) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(pack_half2(v.x, v.y), pack_half2(v.z, v.w));
}
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// The cache slot of `key`: its block from the sequence's table, then the offset in it
// (block_shift >= 0: the block size is 1 << block_shift).
__device__ __forceinline__ int64_t slot_of(const PrefillAttentionArgs& a, const int32_t* table, int block_shift,
                                           int key) {
  if (block_shift >= 0)
    return (int64_t(table[key >> block_shift]) << block_shift) + (key & ((1 << block_shift) - 1));
  return int64_t(table[key / a.block_size]) * a.block_size + key % a.block_size;
}

// Query block of the launch's linear block id. The blocks walk 1..n tiles (causal), and two
// share a multiprocessor: blocks go out in linear order, the first half the heavy query
// blocks (heaviest first), the second half the light ones (lightest first), so that the
// second block an SM receives is about as light as its first was heavy.
__device__ __forceinline__ int block_order(int* head) {
  const int n_blocks = gridDim.x, n_heads = gridDim.y;
  const int linear = blockIdx.x + blockIdx.y * n_blocks;
  const int rank = linear / n_heads;
  *head = linear % n_heads;
  const int heavy = n_blocks - n_blocks / 2;
  return rank < heavy ? n_blocks - 1 - rank : rank - heavy;
}

// The kernel versions behind prefill_attention (arguments already checked).
Status launch_v6(const PrefillAttentionArgs& a, cudaStream_t stream);
Status launch_v8(const PrefillAttentionArgs& a, cudaStream_t stream);

}  // namespace kiln::cuda::prefill_detail
