#pragma once
// What the prefill attention kernels (v6: prefill_attention.cu, v8: prefill_attention_v8.cu)
// share: the f16 tensor-core product, ldmatrix loads, 16-byte async copies, f16 packing, Q's
// rows into shared memory, a tile's online-softmax step and P V product, the normalized store
// of a warp's rows, the cache slot of a key and the order in which query blocks go out.
//
// Fragments follow mma.m16n8k16 (row.col, f16 in, f32 accumulate): lane = 4 * g + t holds
// rows g and g + 8, columns 2t, 2t + 1 (and + 8) of each 16 x 16 / 16 x 8 piece.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/half_copy.cuh"
#include "backend/cuda/prefill_attention.h"

namespace kiln::cuda::prefill_detail {

constexpr int kPad = 8;  // f16 elements after each shared row: rows start 4 banks apart
constexpr float kLog2e = 1.4426950408889634f;  // scores and maxima are kept in log2 units

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

using detail::shared_address;

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

// The block's kRows query rows from q0 as f16 into q_s (rows of D + kPad; rows past the last
// token zero), by kThreads threads, each issuing its float4 loads in batches of up to 8
// before it converts them.
template <int D, int kRows, int kThreads>
__device__ __forceinline__ void stage_queries(const PrefillAttentionArgs& a, int head, int q0, __half* q_s) {
  constexpr int kRow = D + kPad;
  constexpr int kQLoads = kRows * D / 4 / kThreads;  // float4 per thread
  constexpr int kQBatch = kQLoads < 8 ? kQLoads : 8;
  static_assert(kQLoads % kQBatch == 0, "whole batches of Q loads");
#pragma unroll
  for (int j0 = 0; j0 < kQLoads; j0 += kQBatch) {
    float4 v[kQBatch];
#pragma unroll
    for (int j = 0; j < kQBatch; ++j) {
      const int i = threadIdx.x + (j0 + j) * kThreads, r = i / (D / 4), c = (i % (D / 4)) * 4;
      v[j] = q0 + r < a.n_tokens ? load4(a.q + int64_t(q0 + r) * a.q_stride + int64_t(head) * D + c)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kQBatch; ++j) {
      const int i = threadIdx.x + (j0 + j) * kThreads, r = i / (D / 4), c = (i % (D / 4)) * 4;
      store4(q_s + r * kRow + c, v[j]);
    }
  }
}

// One tile of the online softmax, per warp: s holds the tile's scores of this lane's two rows
// (log2 units, hidden keys -inf) and tile_max their maxima over this lane. Each row's maximum
// over its quad becomes the running maximum m; l and o are rescaled to it, and s becomes
// exp2(s - m) (the tile's P), its sum added to l.
template <int kKeys, int D>
__device__ __forceinline__ void online_softmax_step(float (&s)[kKeys / 8][4], float (&tile_max)[2], float (&m)[2],
                                                    float (&l)[2], float (&o)[D / 8][4]) {
  float rescale[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(detail::kFullMask, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(detail::kFullMask, tile_max[r], 2));
    const float m_new = fmaxf(m[r], tile_max[r]);
    const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
    rescale[r] = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - base);
    m[r] = m_new;
    l[r] *= rescale[r];
#pragma unroll
    for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        s[nb][e] = exp2f(s[nb][e] - base);  // -inf gives 0
        l[r] += s[nb][e];
      }
  }
#pragma unroll
  for (int nb = 0; nb < D / 8; ++nb) {
    o[nb][0] *= rescale[0], o[nb][1] *= rescale[0];
    o[nb][2] *= rescale[1], o[nb][3] *= rescale[1];
  }
}

// O += P V over one tile of kKeys keys: P's A fragments are the score accumulators of two
// neighbouring key pieces; V's B fragments (v: the tile's rows of D + kPad f16) come from
// transposing ldmatrix: matrices of keys kk*16 + 0/8 x dims nb*8 and nb*8 + 8, so one load
// serves two 8-wide output pieces.
template <int kKeys, int D>
__device__ __forceinline__ void accumulate_pv(float (&o)[D / 8][4], const float (&s)[kKeys / 8][4], const __half* v,
                                              int lane) {
  constexpr int kRow = D + kPad;
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t pf[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                            pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                            pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int nb = 0; nb < D / 8; nb += 2) {
      uint32_t vf[4];
      ldmatrix_x4_trans(vf, v + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kRow + nb * 8 + (lane / 16) * 8);
      mma_f16(o[nb], pf, vf[0], vf[1]);
      mma_f16(o[nb + 1], pf, vf[2], vf[3]);
    }
  }
}

// The end of a warp's two rows (query rows first_row and first_row + 8): each row's sum over
// its quad, the sink (m and the sink in log2 units), then the output normalized by it (and
// its half copy, where asked for); rows past the last token are not stored.
template <int D>
__device__ __forceinline__ void store_normalized_rows(const PrefillAttentionArgs& a, int head, int first_row, int t,
                                                      const float (&m)[2], const float (&l)[2],
                                                      const float (&o)[D / 8][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(detail::kFullMask, sum, 1);
    sum += __shfl_xor_sync(detail::kFullMask, sum, 2);
    float factor = 1.0f;
    if (a.sinks) {
      const float sink = a.sinks[head] * kLog2e;
      const float m_final = fmaxf(m[r], sink);
      factor = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - m_final);
      sum = sum * factor + exp2f(sink - m_final);
    }
    const float inv = sum > 0.0f ? factor / sum : 0.0f;
    const int token = first_row + 8 * r;
    if (token >= a.n_tokens) continue;
    const int64_t at = int64_t(head) * D + 2 * t;
    float* out = a.out + int64_t(token) * a.out_stride + at;
    uint32_t* half = a.out_half ? reinterpret_cast<uint32_t*>(static_cast<__half*>(a.out_half) +
                                                              int64_t(token) * a.n_head * D + at)
                                : nullptr;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      const float lo = o[nb][2 * r] * inv, hi = o[nb][2 * r + 1] * inv;
      *reinterpret_cast<float2*>(out + nb * 8) = make_float2(lo, hi);
      if (half) half[nb * 4] = detail::half_pair_bits(lo, hi, a.out_half_bf16);
    }
  }
}

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
