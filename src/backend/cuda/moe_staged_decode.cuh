#pragma once
// Weight decoding for the grouped MoE GEMMs (moe_gemm.cu): 8 consecutive elements of a weight
// row whose raw bytes were staged in shared memory, as floats with exactly the values of the
// block formats' decode8 (block_formats.cuh), so results do not change.
//
// Why not decode8 itself: it reads every quant with a byte load and converts it with an
// int -> float instruction (a quarter-rate pipe on sm_90); in the GEMM each weight is decoded
// once per 64-token tile, and those two were most of a K step's issue slots. Here q8_0, q4_K
// and q6_K read their quants as words (funnel shifts over any byte alignment) and turn small
// integers into floats exactly with the 2^23 trick: the float with bits 0x4B000000 | b is
// 2^23 + b, so subtracting 2^23 (+ an offset) leaves b (- offset) with no rounding.
#include <type_traits>

#include "backend/cuda/block_formats.cuh"
#include "backend/cuda/moe_kernels.cuh"

namespace kiln::cuda::detail {

// Byte i of `bytes` (0..255) as the float (byte - offset), exactly; the offset is folded
// into the subtracted constant (2^23 + offset), which float represents exactly.
template <int kOffset>
__device__ __forceinline__ float byte_as_float(uint32_t bytes, int i) {
  // Result bytes: [byte i of `bytes`, 0, 0, 0x4B] -> 2^23 + byte.
  const uint32_t bits = __byte_perm(bytes, 0x4B000000u, 0x7540u | uint32_t(i));
  return __uint_as_float(bits) - float(8388608 + kOffset);
}

// q8_0: d (f16) then 32 int8. Elements e0..e0+7 of the row staged at base + head.
__device__ __forceinline__ void decode8_staged_q8_0(const uint8_t* base, int head, int e0, float* v) {
  using F = Format<GgmlType::Q8_0>;
  const int block = head + (e0 / 32) * F::kBytes;
  uint32_t h[1], q[2];
  load_words<1>(base, block, h);
  load_words<1>(base, block + 2 + (e0 % 32), q);
  const float d = half_to_float(h[0]);
  // int8 -> unsigned by flipping the sign bit: (b ^ 0x80) - 128 == int8(b).
  const uint32_t u0 = q[0] ^ 0x80808080u, u1 = q[1] ^ 0x80808080u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = byte_as_float<128>(u0, i) * d;
    v[4 + i] = byte_as_float<128>(u1, i) * d;
  }
}

// q4_K: d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles.
__device__ __forceinline__ void decode8_staged_q4_k(const uint8_t* base, int head, int e0, float* v) {
  using F = Format<GgmlType::Q4_K>;
  const int block = head + (e0 / 256) * F::kBytes;
  const int g = (e0 % 256) / 8, sub = g / 4;
  uint32_t h[1], q[2];
  load_words<1>(base, block, h);
  load_words<1>(base, block + 16 + 32 * (sub / 2) + 8 * (g % 4), q);
  const float d = half_to_float(h[0]), dmin = half_to_float(h[0] >> 16);
  int sc, m;
  kquant_scale_min(base + block + 4, sub, sc, m);
  const float dl = d * float(sc), ml = dmin * float(m);
  const int shift = 4 * (sub % 2);
  const uint32_t n0 = (q[0] >> shift) & 0x0F0F0F0Fu, n1 = (q[1] >> shift) & 0x0F0F0F0Fu;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = __fsub_rn(__fmul_rn(dl, byte_as_float<0>(n0, i)), ml);
    v[4 + i] = __fsub_rn(__fmul_rn(dl, byte_as_float<0>(n1, i)), ml);
  }
}

// q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales, d (f16).
__device__ __forceinline__ void decode8_staged_q6_k(const uint8_t* base, int head, int e0, float* v) {
  using F = Format<GgmlType::Q6_K>;
  const int block = head + (e0 / 256) * F::kBytes;
  const int e = e0 % 256, half = e / 128, k = (e % 128) / 32, i0 = e % 32;
  uint32_t h[1], ql[2], qh[2];
  load_words<1>(base, block + 208, h);
  load_words<1>(base, block + 64 * half + 32 * (k & 1) + i0, ql);
  load_words<1>(base, block + 128 + 32 * half + i0, qh);
  const float d = half_to_float(h[0]);
  const float dl = d * float(int8_t(base[block + 192 + 8 * half + 2 * k + i0 / 16]));
  const int shift_l = 4 * (k >> 1), shift_h = 2 * k;
  uint32_t level[2];
#pragma unroll
  for (int w = 0; w < 2; ++w)
    level[w] = ((ql[w] >> shift_l) & 0x0F0F0F0Fu) | (((qh[w] >> shift_h) & 0x03030303u) << 4);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = dl * byte_as_float<32>(level[0], i);
    v[4 + i] = dl * byte_as_float<32>(level[1], i);
  }
}

// Elements e0 .. e0+7 (e0 a multiple of 8) of a chunk row whose bytes start at base + head
// (base 16-byte aligned; the staging row is padded so that word reads past the end stay
// inside it).
template <typename W>
__device__ __forceinline__ void decode8_staged(const uint8_t* base, int head, int e0, float* v) {
  const uint8_t* row = base + head;
  if constexpr (IsPlain<W>::value) {
    if constexpr (W::kBytes == 4) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = reinterpret_cast<const float*>(row)[e0 + i];
    } else {
      const unsigned short* e = reinterpret_cast<const unsigned short*>(row) + e0;
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = W::kBf16 ? bf16_to_float(e[i]) : half_to_float(e[i]);
    }
  } else if constexpr (std::is_same_v<W, Format<GgmlType::Q8_0>>) {
    decode8_staged_q8_0(base, head, e0, v);
  } else if constexpr (std::is_same_v<W, Format<GgmlType::Q4_K>>) {
    decode8_staged_q4_k(base, head, e0, v);
  } else if constexpr (std::is_same_v<W, Format<GgmlType::Q6_K>>) {
    decode8_staged_q6_k(base, head, e0, v);
  } else {
    W::decode8(row + (e0 / W::kElems) * W::kBytes, (e0 % W::kElems) / 8, v);
  }
}

}  // namespace kiln::cuda::detail
