#pragma once
// The ggml block formats as the GPU reads them. For each weight type, Format<type> gives
//   kElems, kBytes      elements and bytes of one block (the GGUF layout, unchanged);
//   decode8(b, g, v)    elements 8g .. 8g+7 of the block at b, dequantized with exactly the
//                       arithmetic of kiln's scalar reference (quant/*.cpp), so results are
//                       bit-identical to dequantize_row_reference;
//   dot_q8<kAlign>(s, off, sub, x, ds)
//                       the dot product of 32 elements (slice `sub`) of the block that starts
//                       at byte `off` of a 16-byte aligned shared-memory staging buffer `s`
//                       (off a multiple of kAlign, which is 1 or up to kMaxAlign),
//                       with 32 activations quantized to int8 (x: the 32 int8 as 8 words,
//                       ds = (scale, scale * sum of the int8)). Integer dot products (dp4a),
//                       then one float scaling per sub-block;
//   kMaxAlign           the alignment (1, 4 or 16) that every field the dot product reads
//                       keeps when the block starts at a multiple of it (and so do all blocks
//                       of a chunk: kBytes is a multiple of it).
// Layouts are documented in quant/blocks.h and quant/iquant_blocks.h.
#include "backend/cuda/common.cuh"
#include "quant/types.h"

namespace kiln::cuda::detail {

// ---- shared pieces ---------------------------------------------------------------------

__host__ __device__ constexpr uint32_t pack_bytes(int a, int b, int c, int d) {
  return uint32_t(uint8_t(a)) | (uint32_t(uint8_t(b)) << 8) | (uint32_t(uint8_t(c)) << 16) |
         (uint32_t(uint8_t(d)) << 24);
}

// 16-entry tables of signed levels, 4 per word: iq4_nl / iq4_xs levels, and twice the E2M1
// values of mxfp4 (quant/iquant_grids.h kIq4Levels, quant/blocks.h kFp4Doubled).
struct Table16 {
  uint32_t w[4];
};
// (Functions, not variables: the words then become immediates in device code.)
__host__ __device__ constexpr Table16 iq4_table() {
  return {{pack_bytes(-127, -104, -83, -65), pack_bytes(-49, -35, -22, -10), pack_bytes(1, 13, 25, 38),
           pack_bytes(53, 69, 89, 113)}};
}
__host__ __device__ constexpr Table16 fp4_table() {
  return {{pack_bytes(0, 1, 2, 3), pack_bytes(4, 6, 8, 12), pack_bytes(0, -1, -2, -3), pack_bytes(-4, -6, -8, -12)}};
}

// Looks up 4 indices (0..15, one per byte of idx) in a 16-entry table; returns the 4 levels
// as bytes. Two byte permutes pick from the lower and upper half of the table, a mask built
// from bit 3 of each index chooses between them.
__device__ __forceinline__ uint32_t lookup16(uint32_t idx, const Table16& t) {
  const uint32_t low3 = idx & 0x07070707u;
  const uint32_t sel = __byte_perm(low3 | (low3 >> 4), 0, 0x4420);  // 4 nibble selectors
  const uint32_t from_low = __byte_perm(t.w[0], t.w[1], sel);
  const uint32_t from_high = __byte_perm(t.w[2], t.w[3], sel);
  const uint32_t upper = ((idx & 0x08080808u) >> 3) * 0xffu;  // 0xff where the index is >= 8
  return (from_low & ~upper) | (from_high & upper);
}

__device__ __forceinline__ int level_byte(uint32_t levels, int i) { return int(int8_t(levels >> (8 * i))); }

// 2^(e - 128) (half the E8M0 scale of mxfp4), exact; e = 0, 1 give f32 subnormals.
__device__ __forceinline__ float e8m0_half(uint32_t e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// Bit 4 of each byte set from bits 0..3 of t (the fifth bit of q5 levels).
__device__ __forceinline__ uint32_t spread4_to_bit4(uint32_t t) {
  return ((t & 1u) << 4) | ((t & 2u) << 11) | ((t & 4u) << 18) | ((t & 8u) << 25);
}

// Sum of the 4 signed bytes of each of `n` words (the activations' plain sum).
template <int N>
__device__ __forceinline__ int byte_sum(const int* x) {
  int s = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) s = dot4(0x01010101, x[j], s);
  return s;
}

// q4_K / q5_K: 6-bit scale and min of sub-block j packed in 12 bytes.
__device__ __forceinline__ void kquant_scale_min(const uint8_t* packed, int j, int& scale, int& min) {
  if (j < 4) {
    scale = packed[j] & 63;
    min = packed[j + 4] & 63;
  } else {
    scale = (packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4);
    min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// q3_K: signed 6-bit scale (already minus 32) of sub-block i (0..15) packed in 12 bytes.
__device__ __forceinline__ int q3k_scale(const uint8_t* packed, int i) {
  const int low = i < 8 ? (packed[i] & 0xF) : (packed[i - 8] >> 4);
  const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Dot of 4 words of low nibbles and 4 words of high nibbles of q (elements j and j + 16 of
// a 32-element group, the legacy layout) with the 32 activations.
__device__ __forceinline__ int dot_nibbles(const uint32_t (&q)[4], const int* x) {
  int sum = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    sum = dot4(int(q[j] & 0x0F0F0F0Fu), x[j], sum);
    sum = dot4(int((q[j] >> 4) & 0x0F0F0F0Fu), x[j + 4], sum);
  }
  return sum;
}

__device__ __forceinline__ int dot_table_nibbles(const uint32_t (&q)[4], const int* x, const Table16& t) {
  int sum = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    sum = dot4(int(lookup16(q[j] & 0x0F0F0F0Fu, t)), x[j], sum);
    sum = dot4(int(lookup16((q[j] >> 4) & 0x0F0F0F0Fu, t)), x[j + 4], sum);
  }
  return sum;
}

// The 8 nibbles of group g (0..3) of a 32-element legacy block: element 8g+i lives in byte
// 8*(g%2)+i of qs, in the low nibble for g < 2 and the high nibble for g >= 2.
__device__ __forceinline__ int legacy_nibble(const uint8_t* qs, int g, int i) {
  return (qs[8 * (g & 1) + i] >> (4 * (g >> 1))) & 0xF;
}

template <GgmlType T>
struct Format;

// ---- blocks of 32 -----------------------------------------------------------------------

template <>
struct Format<GgmlType::Q4_0> {
  static constexpr int kElems = 32, kBytes = 18;
  static constexpr int kMaxAlign = 1;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = float(legacy_nibble(b + 2, g, i) - 8) * d;
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int, const int* x, float2 ds) {
    uint32_t h[1], q[4];
    load_words<kAlign>(s, off, h);
    load_words<kAlign>(s, off + 2, q);
    return half_to_float(h[0]) * (ds.x * float(dot_nibbles(q, x)) - 8.0f * ds.y);
  }
};

template <>
struct Format<GgmlType::Q4_1> {
  static constexpr int kElems = 32, kBytes = 20;
  static constexpr int kMaxAlign = 4;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b)), m = half_to_float(load_u16(b + 2));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fadd_rn(__fmul_rn(float(legacy_nibble(b + 4, g, i)), d), m);
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int, const int* x, float2 ds) {
    uint32_t h[1], q[4];
    load_words<kAlign>(s, off, h);
    load_words<kAlign>(s, off + 4, q);
    return half_to_float(h[0]) * ds.x * float(dot_nibbles(q, x)) + half_to_float(h[0] >> 16) * ds.y;
  }
};

// Fifth bits of q5_0 / q5_1 as bit 4 of each byte: words j (elements 4j..4j+3) and j + 4
// (elements 16+4j..).
__device__ __forceinline__ int dot_q5_legacy(uint32_t qh, const uint32_t (&q)[4], const int* x) {
  int sum = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t lo = (q[j] & 0x0F0F0F0Fu) | spread4_to_bit4(qh >> (4 * j));
    const uint32_t hi = ((q[j] >> 4) & 0x0F0F0F0Fu) | spread4_to_bit4(qh >> (16 + 4 * j));
    sum = dot4(int(lo), x[j], sum);
    sum = dot4(int(hi), x[j + 4], sum);
  }
  return sum;
}

__device__ __forceinline__ int q5_legacy_level(const uint8_t* qh_bytes, const uint8_t* qs, int g, int i) {
  const int e = 8 * g + i;
  const uint32_t qh = load_u32(qh_bytes);
  return legacy_nibble(qs, g, i) | int(((qh >> e) & 1u) << 4);
}

template <>
struct Format<GgmlType::Q5_0> {
  static constexpr int kElems = 32, kBytes = 22;
  static constexpr int kMaxAlign = 1;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = float(q5_legacy_level(b + 2, b + 6, g, i) - 16) * d;
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int, const int* x, float2 ds) {
    uint32_t h[1], qh[1], q[4];
    load_words<kAlign>(s, off, h);
    load_words<kAlign>(s, off + 2, qh);
    load_words<kAlign>(s, off + 6, q);
    return half_to_float(h[0]) * (ds.x * float(dot_q5_legacy(qh[0], q, x)) - 16.0f * ds.y);
  }
};

template <>
struct Format<GgmlType::Q5_1> {
  static constexpr int kElems = 32, kBytes = 24;
  static constexpr int kMaxAlign = 4;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b)), m = half_to_float(load_u16(b + 2));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fadd_rn(__fmul_rn(float(q5_legacy_level(b + 4, b + 8, g, i)), d), m);
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int, const int* x, float2 ds) {
    uint32_t h[1], qh[1], q[4];
    load_words<kAlign>(s, off, h);
    load_words<kAlign>(s, off + 4, qh);
    load_words<kAlign>(s, off + 8, q);
    return half_to_float(h[0]) * ds.x * float(dot_q5_legacy(qh[0], q, x)) + half_to_float(h[0] >> 16) * ds.y;
  }
};

template <>
struct Format<GgmlType::Q8_0> {
  static constexpr int kElems = 32, kBytes = 34;
  static constexpr int kMaxAlign = 1;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = float(int8_t(b[2 + 8 * g + i])) * d;
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int, const int* x, float2 ds) {
    uint32_t h[1], q[8];
    load_words<kAlign>(s, off, h);
    load_words<kAlign>(s, off + 2, q);
    int sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) sum = dot4(int(q[j]), x[j], sum);
    return half_to_float(h[0]) * ds.x * float(sum);
  }
};

template <>
struct Format<GgmlType::IQ4_NL> {
  static constexpr int kElems = 32, kBytes = 18;
  static constexpr int kMaxAlign = 1;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b));
    const uint8_t* qs = b + 2 + 8 * (g & 1);
    const int shift = 4 * (g >> 1);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t idx = pack_bytes((qs[4 * half] >> shift) & 0xF, (qs[4 * half + 1] >> shift) & 0xF,
                                      (qs[4 * half + 2] >> shift) & 0xF, (qs[4 * half + 3] >> shift) & 0xF);
      const uint32_t levels = lookup16(idx, iq4_table());
#pragma unroll
      for (int i = 0; i < 4; ++i) v[4 * half + i] = d * float(level_byte(levels, i));
    }
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int, const int* x, float2 ds) {
    uint32_t h[1], q[4];
    load_words<kAlign>(s, off, h);
    load_words<kAlign>(s, off + 2, q);
    return half_to_float(h[0]) * ds.x * float(dot_table_nibbles(q, x, iq4_table()));
  }
};

template <>
struct Format<GgmlType::MXFP4> {
  static constexpr int kElems = 32, kBytes = 17;
  static constexpr int kMaxAlign = 1;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = e8m0_half(b[0]);
    const uint8_t* qs = b + 1 + 8 * (g & 1);
    const int shift = 4 * (g >> 1);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t idx = pack_bytes((qs[4 * half] >> shift) & 0xF, (qs[4 * half + 1] >> shift) & 0xF,
                                      (qs[4 * half + 2] >> shift) & 0xF, (qs[4 * half + 3] >> shift) & 0xF);
      const uint32_t levels = lookup16(idx, fp4_table());
#pragma unroll
      for (int i = 0; i < 4; ++i) v[4 * half + i] = float(level_byte(levels, i)) * d;
    }
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int, const int* x, float2 ds) {
    uint32_t h[1], q[4];
    load_words<kAlign>(s, off, h);
    load_words<kAlign>(s, off + 1, q);
    return e8m0_half(h[0] & 0xffu) * ds.x * float(dot_table_nibbles(q, x, fp4_table()));
  }
};

// ---- K-quant super-blocks of 256: 8 slices of 32 ---------------------------------------
// Within each half of 128 elements, the 2-bit formats (q2_K, q3_K) and q6_K keep element
// 32k + i in byte i of a 32-byte lane, at bit position 2k; slice s = 4 * half + k.

template <>
struct Format<GgmlType::Q2_K> {
  static constexpr int kElems = 256, kBytes = 84;
  static constexpr int kMaxAlign = 4;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b + 80)), dmin = half_to_float(load_u16(b + 82));
    const int e0 = 8 * g, sub = e0 / 16, half = e0 / 128, shift = 2 * ((e0 % 128) / 32);
    const float dl = d * float(b[sub] & 0xF), ml = dmin * float(b[sub] >> 4);
    const uint8_t* qs = b + 16 + 32 * half + (e0 % 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fsub_rn(__fmul_rn(dl, float((qs[i] >> shift) & 3)), ml);
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int sub, const int* x, float2 ds) {
    const int half = sub >> 2, shift = 2 * (sub & 3);
    uint32_t h[1], q[8];
    load_words<kAlign>(s, off + 80, h);
    load_words<kAlign>(s, off + 16 + 32 * half, q);
    int sq[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; ++j) sq[j / 4] = dot4(int((q[j] >> shift) & 0x03030303u), x[j], sq[j / 4]);
    const int sc0 = s[off + 2 * sub], sc1 = s[off + 2 * sub + 1];
    const int scaled = (sc0 & 0xF) * sq[0] + (sc1 & 0xF) * sq[1];
    const int mins = (sc0 >> 4) * byte_sum<4>(x) + (sc1 >> 4) * byte_sum<4>(x + 4);
    return ds.x * (half_to_float(h[0]) * float(scaled) - half_to_float(h[0] >> 16) * float(mins));
  }
};

template <>
struct Format<GgmlType::Q3_K> {
  static constexpr int kElems = 256, kBytes = 110;
  static constexpr int kMaxAlign = 1;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b + 108));
    const int e0 = 8 * g, half = e0 / 128, shift = 2 * ((e0 % 128) / 32), bit = e0 / 32;
    const float dl = d * float(q3k_scale(b + 96, e0 / 16));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int k = e0 % 32 + i;
      const int low = (b[32 + 32 * half + k] >> shift) & 3;
      const int high = (b[k] >> bit) & 1;
      v[i] = dl * float(low - (high ? 0 : 4));
    }
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int sub, const int* x, float2 ds) {
    const int half = sub >> 2, shift = 2 * (sub & 3);
    uint32_t h[1], hm[8], q[8];
    load_words<kAlign>(s, off + 108, h);
    load_words<kAlign>(s, off, hm);
    load_words<kAlign>(s, off + 32 + 32 * half, q);
    int sq[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t level = ((q[j] >> shift) & 0x03030303u) | (((hm[j] >> sub) & 0x01010101u) << 2);
      sq[j / 4] = dot4(sub_bytes(level, 0x04040404u), x[j], sq[j / 4]);
    }
    const int scaled = q3k_scale(s + off + 96, 2 * sub) * sq[0] + q3k_scale(s + off + 96, 2 * sub + 1) * sq[1];
    return half_to_float(h[0]) * ds.x * float(scaled);
  }
};

template <>
struct Format<GgmlType::Q4_K> {
  static constexpr int kElems = 256, kBytes = 144;
  static constexpr int kMaxAlign = 16;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b)), dmin = half_to_float(load_u16(b + 2));
    const int sub = g / 4;
    int sc, m;
    kquant_scale_min(b + 4, sub, sc, m);
    const float dl = d * float(sc), ml = dmin * float(m);
    const uint8_t* q = b + 16 + 32 * (sub / 2) + 8 * (g % 4);
    const int shift = 4 * (sub % 2);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fsub_rn(__fmul_rn(dl, float((q[i] >> shift) & 0xF)), ml);
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int sub, const int* x, float2 ds) {
    uint32_t h[1], q[8];
    load_words<kAlign>(s, off, h);
    load_words<kAlign>(s, off + 16 + 32 * (sub >> 1), q);
    const int shift = 4 * (sub & 1);
    int sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) sum = dot4(int((q[j] >> shift) & 0x0F0F0F0Fu), x[j], sum);
    int sc, m;
    kquant_scale_min(s + off + 4, sub, sc, m);
    return half_to_float(h[0]) * float(sc) * ds.x * float(sum) - half_to_float(h[0] >> 16) * float(m) * ds.y;
  }
};

template <>
struct Format<GgmlType::Q5_K> {
  static constexpr int kElems = 256, kBytes = 176;
  static constexpr int kMaxAlign = 16;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b)), dmin = half_to_float(load_u16(b + 2));
    const int sub = g / 4, l0 = 8 * (g % 4);
    int sc, m;
    kquant_scale_min(b + 4, sub, sc, m);
    const float dl = d * float(sc), ml = dmin * float(m);
    const uint8_t* q = b + 48 + 32 * (sub / 2) + l0;
    const int shift = 4 * (sub % 2);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int level = ((q[i] >> shift) & 0xF) + (((b[16 + l0 + i] >> sub) & 1) << 4);
      v[i] = __fsub_rn(__fmul_rn(dl, float(level)), ml);
    }
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int sub, const int* x, float2 ds) {
    uint32_t h[1], qh[8], q[8];
    load_words<kAlign>(s, off, h);
    load_words<kAlign>(s, off + 16, qh);
    load_words<kAlign>(s, off + 48 + 32 * (sub >> 1), q);
    const int shift = 4 * (sub & 1);
    int sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t level = ((q[j] >> shift) & 0x0F0F0F0Fu) | (((qh[j] >> sub) & 0x01010101u) << 4);
      sum = dot4(int(level), x[j], sum);
    }
    int sc, m;
    kquant_scale_min(s + off + 4, sub, sc, m);
    return half_to_float(h[0]) * float(sc) * ds.x * float(sum) - half_to_float(h[0] >> 16) * float(m) * ds.y;
  }
};

template <>
struct Format<GgmlType::Q6_K> {
  static constexpr int kElems = 256, kBytes = 210;
  static constexpr int kMaxAlign = 1;
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b + 208));
    const int e0 = 8 * g, half = e0 / 128, k = (e0 % 128) / 32, i0 = e0 % 32;
    const float dl = d * float(int8_t(b[192 + 8 * half + 2 * k + i0 / 16]));
    const uint8_t* ql = b + 64 * half + 32 * (k & 1) + i0;
    const uint8_t* qh = b + 128 + 32 * half + i0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int level = ((ql[i] >> (4 * (k >> 1))) & 0xF) | (((qh[i] >> (2 * k)) & 3) << 4);
      v[i] = dl * float(level - 32);
    }
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int sub, const int* x, float2 ds) {
    const int half = sub >> 2, k = sub & 3;
    uint32_t h[1], ql[8], qh[8];
    load_words<kAlign>(s, off + 208, h);
    load_words<kAlign>(s, off + 64 * half + 32 * (k & 1), ql);
    load_words<kAlign>(s, off + 128 + 32 * half, qh);
    const int shift_l = 4 * (k >> 1), shift_h = 2 * k;
    int sq[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t level = ((ql[j] >> shift_l) & 0x0F0F0F0Fu) | (((qh[j] >> shift_h) & 0x03030303u) << 4);
      sq[j / 4] = dot4(sub_bytes(level, 0x20202020u), x[j], sq[j / 4]);
    }
    const int8_t* scales = reinterpret_cast<const int8_t*>(s + off + 192 + 8 * half + 2 * k);
    return half_to_float(h[0]) * ds.x * float(scales[0] * sq[0] + scales[1] * sq[1]);
  }
};

template <>
struct Format<GgmlType::IQ4_XS> {
  static constexpr int kElems = 256, kBytes = 136;
  static constexpr int kMaxAlign = 4;
  __device__ static int scale_code(const uint8_t* b, uint32_t scales_h, int group) {
    return ((b[4 + group / 2] >> (4 * (group % 2))) & 0xF) | (((scales_h >> (2 * group)) & 3) << 4);
  }
  __device__ static void decode8(const uint8_t* b, int g, float* v) {
    const float d = half_to_float(load_u16(b));
    const int group = g / 4, l0 = 8 * (g % 4);
    const float scale = d * float(scale_code(b, load_u16(b + 2), group) - 32);
    const uint8_t* qs = b + 8 + 16 * group + (l0 % 16);
    const int shift = 4 * (l0 / 16);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t idx = pack_bytes((qs[4 * half] >> shift) & 0xF, (qs[4 * half + 1] >> shift) & 0xF,
                                      (qs[4 * half + 2] >> shift) & 0xF, (qs[4 * half + 3] >> shift) & 0xF);
      const uint32_t levels = lookup16(idx, iq4_table());
#pragma unroll
      for (int i = 0; i < 4; ++i) v[4 * half + i] = scale * float(level_byte(levels, i));
    }
  }
  template <int kAlign>
  __device__ static float dot_q8(const uint8_t* s, int off, int sub, const int* x, float2 ds) {
    uint32_t h[1], q[4];
    load_words<kAlign>(s, off, h);
    load_words<kAlign>(s, off + 8 + 16 * sub, q);
    const int code = scale_code(s + off, h[0] >> 16, sub);
    return half_to_float(h[0]) * float(code - 32) * ds.x * float(dot_table_nibbles(q, x, iq4_table()));
  }
};

// Calls f(Format<T>{}) for the quantized types the kernels support; returns false for
// any other type. The list here is the one the launchers name when they refuse a type.
template <typename F>
bool visit_quant_format(GgmlType type, F&& f) {
  switch (type) {
    case GgmlType::Q4_0: f(Format<GgmlType::Q4_0>{}); return true;
    case GgmlType::Q4_1: f(Format<GgmlType::Q4_1>{}); return true;
    case GgmlType::Q5_0: f(Format<GgmlType::Q5_0>{}); return true;
    case GgmlType::Q5_1: f(Format<GgmlType::Q5_1>{}); return true;
    case GgmlType::Q8_0: f(Format<GgmlType::Q8_0>{}); return true;
    case GgmlType::Q2_K: f(Format<GgmlType::Q2_K>{}); return true;
    case GgmlType::Q3_K: f(Format<GgmlType::Q3_K>{}); return true;
    case GgmlType::Q4_K: f(Format<GgmlType::Q4_K>{}); return true;
    case GgmlType::Q5_K: f(Format<GgmlType::Q5_K>{}); return true;
    case GgmlType::Q6_K: f(Format<GgmlType::Q6_K>{}); return true;
    case GgmlType::IQ4_NL: f(Format<GgmlType::IQ4_NL>{}); return true;
    case GgmlType::IQ4_XS: f(Format<GgmlType::IQ4_XS>{}); return true;
    case GgmlType::MXFP4: f(Format<GgmlType::MXFP4>{}); return true;
    default: return false;
  }
}

inline constexpr const char* kQuantFormatNames = "q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs mxfp4";

}  // namespace kiln::cuda::detail
