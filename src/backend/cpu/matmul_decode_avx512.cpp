// AVX-512 VNNI decode kernels (n_tokens <= 3): the activations quantized once per call
// to ggml's q8 formats (matmul_q8_avx512.cpp), then each weight row streamed once and multiplied with vpdpbusd
// straight from its block layout. Legacy 32-blocks go four at a time ("quads"); K-quants
// a super-block (two quads) at a time. See matmul_kernels.h for the activation layout.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/avx512_common.h"
#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/matmul_q8.h"
#include "core/half.h"
#include "quant/blocks.h"
#include "quant/iquant_grids.h"
#include "quant/quant.h"

// How far ahead of the current block a row's bytes are prefetched: weights stream from
// memory once per token, and one core keeps too few misses in flight on its own. On the
// quiet Xeon host, 2-4 KiB ahead made cold q4_0 / q4_K / q8_0 matvec 2-2.7x faster than no
// prefetch (1 KiB: 1.6-2x); see docs/perf-notes-cpu.md.
#ifndef KILN_DECODE_PREFETCH
#define KILN_DECODE_PREFETCH 4096
#endif

namespace kiln::cpu::avx512 {
using detail::q4k_scales_mins;
using iquant::kIq4Levels;

namespace {

// The weight row's columns past the last whole quad (at most 3 blocks), as ggml sums
// them: per block, the integer dot of the unpacked weights with the token's q8 levels,
// times both scales, plus the weights' offset times the activations' dx_sum.
float tail_dot(GgmlType type, const uint8_t* row, size_t block_bytes, int64_t first_block, int64_t n_blocks,
               const DecodeToken& tk) {
  if (n_blocks == 0) return 0;
  alignas(64) int8_t q[96];
  float scale[3], offset[3] = {0, 0, 0};
  int32_t qsum[3];
  unpack_int8_row(type, row + first_block * block_bytes, 32 * n_blocks, {q, scale, offset, qsum});
  float sum = 0;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const Q8View v = q8_view(tk.act, tk.blocks, first_block + b);
    int32_t dot = 0;
    for (int j = 0; j < 32; ++j) dot += int32_t(q[32 * b + j]) * v.q[j];
    sum += scale[b] * v.dx * float(dot) + offset[b] * v.dx_sum;
  }
  return sum;
}

}  // namespace

// ---- decode: activations and the q4_0 / q8_0 kernels --------------------------------------

int decode_bias_shift(GgmlType type) {
  switch (type) {  // zero point / 4 lanes, as a shift: 8 -> 1, 16 -> 2, 128 -> 5
    case GgmlType::Q4_0: return 1;
    case GgmlType::Q5_0: return 2;
    case GgmlType::Q8_0:
    case GgmlType::IQ4_NL: return 5;
    default: return 0;  // no zero point (the kernel does not read `bias`)
  }
}

namespace {

// Row i of the range [r0, r1) in the order the decode kernels take them: rows of the two
// halves in turn, so that each thread reads two streams. Two streams per thread keep more of
// the memory system busy than one (two threads on the development VM: 24.8 vs 18.3 GB/s in a
// plain read loop; q4_0 tg64 +9%, median of 9 alternating pairs).
inline int64_t decode_row(int64_t r0, int64_t r1, int64_t i) {
  const int64_t half = (r1 - r0 + 1) / 2;
  return r0 + (i % 2 == 0 ? i / 2 : half + i / 2);
}

// The shared loop of the quad decode kernels: `Weights` turns quad `qd` of a row into two
// u8 vectors (lanes as in DecodeToken) and the 16 lanes' weight scales; the accumulator
// starts at the token's `bias`, the lanes' share of the weights' zero point.
template <int NT, typename Weights>
void decode_quads(const uint8_t* w, size_t row_bytes, size_t block_bytes, GgmlType type, int64_t r0, int64_t r1,
                  const DecodeToken* tokens, float* y, int64_t y_stride, Weights weights) {
  const int64_t n_quads = tokens[0].n_quads;
  const int64_t n_blocks = int64_t(row_bytes / block_bytes);
  for (int64_t i = 0; i < r1 - r0; ++i) {
    const int64_t r = decode_row(r0, r1, i);
    const uint8_t* row = w + size_t(r) * row_bytes;
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t qd = 0; qd < n_quads; ++qd) {
      __m512i lo, hi;
      __m512 dw;
      const uint8_t* quad = row + qd * 4 * block_bytes;
      if constexpr (KILN_DECODE_PREFETCH > 0)
        for (size_t ahead = 0; ahead < 4 * block_bytes; ahead += 64)
          _mm_prefetch(reinterpret_cast<const char*>(quad + KILN_DECODE_PREFETCH + ahead), _MM_HINT_T0);
      weights(quad, lo, hi, dw);
      for (int t = 0; t < NT; ++t) {
        const DecodeToken& tk = tokens[t];
        __m512i dot = _mm512_load_si512(tk.bias + 16 * qd);
        dot = _mm512_dpbusd_epi32(dot, lo, _mm512_load_si512(tk.q + 128 * qd));
        dot = _mm512_dpbusd_epi32(dot, hi, _mm512_load_si512(tk.q + 128 * qd + 64));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_load_ps(tk.dx + 16 * qd)), acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t)
      y[t * y_stride + r] = _mm512_reduce_add_ps(acc[t]) +
                            tail_dot(type, row, block_bytes, 4 * n_quads, n_blocks - 4 * n_quads, tokens[t]);
  }
}

template <typename Weights>
void decode_dispatch(const uint8_t* w, size_t row_bytes, size_t block_bytes, GgmlType type, int64_t r0, int64_t r1,
                     const DecodeToken* tokens, int n_tokens, float* y, int64_t y_stride, Weights weights) {
  for (int t0 = 0; t0 < n_tokens; t0 += 4) {
    const int nt = std::min(4, n_tokens - t0);
    float* yt = y + t0 * y_stride;
    switch (nt) {
      case 1: decode_quads<1>(w, row_bytes, block_bytes, type, r0, r1, tokens + t0, yt, y_stride, weights); break;
      case 2: decode_quads<2>(w, row_bytes, block_bytes, type, r0, r1, tokens + t0, yt, y_stride, weights); break;
      case 3: decode_quads<3>(w, row_bytes, block_bytes, type, r0, r1, tokens + t0, yt, y_stride, weights); break;
      default: decode_quads<4>(w, row_bytes, block_bytes, type, r0, r1, tokens + t0, yt, y_stride, weights); break;
    }
  }
}

// Word indices for _mm512_permutex2var_epi16 (AVX512-BW; every field used starts at an even
// byte): word p of the result is word `idx[p]` of the concatenation (a: 0..31, b: 32..63).

// A legacy format of 32-blocks whose 16 nibble bytes hold elements j (low nibble) and j + 16
// (high nibble): q4_0, q4_1, q5_0, q5_1, iq4_nl. Offsets are bytes within a block (-1: none).
struct NibbleFormat {
  GgmlType type;
  int block_bytes, d_off, m_off, qh_off, qs_off;
};

// Permutations that gather a quad's fields from two loads: at 0 and at 4 * block - 64.
struct NibbleIndices {
  int b_off;
  __m512i qs, d, m, qh;
  explicit NibbleIndices(const NibbleFormat& f) {
    b_off = 4 * f.block_bytes - 64;
    auto word = [&](int byte) { return uint16_t(byte + 1 < 64 ? byte / 2 : 32 + (byte - b_off) / 2); };
    alignas(64) uint16_t q[32], dd[32] = {}, mm[32] = {}, hh[32] = {};
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 8; ++j) q[8 * i + j] = word(f.block_bytes * i + f.qs_off + 2 * j);
      if (f.qh_off >= 0) {  // word i: bits of elements 0..15 of block i, word 4 + i: 16..31
        hh[i] = word(f.block_bytes * i + f.qh_off);
        hh[4 + i] = word(f.block_bytes * i + f.qh_off + 2);
      }
    }
    for (int l = 0; l < 16; ++l) {
      dd[l] = word(f.block_bytes * (l / 4) + f.d_off);
      if (f.m_off >= 0) mm[l] = word(f.block_bytes * (l / 4) + f.m_off);
    }
    qs = _mm512_load_si512(q);
    d = _mm512_load_si512(dd);
    m = _mm512_load_si512(mm);
    qh = _mm512_load_si512(hh);
  }
};

inline __m512 halves_to_float(__m512i words) { return _mm512_cvtph_ps(_mm512_castsi512_si256(words)); }

template <int NT, bool kMin, bool kHigh, bool kLookup>
void decode_nibble_rows(const NibbleFormat& f, const NibbleIndices& idx, const uint8_t* w, size_t row_bytes,
                        int64_t r0, int64_t r1, const DecodeToken* tokens, float* y, int64_t y_stride) {
  const int64_t n_quads = tokens[0].n_quads;
  const int64_t n_blocks = int64_t(row_bytes) / f.block_bytes;
  const __m512i nib = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  // iq4_nl: the 16 levels + 128 as unsigned bytes, in every 128-bit lane for vpshufb.
  alignas(64) uint8_t levels[64];
  for (int i = 0; i < 64; ++i) levels[i] = uint8_t(kIq4Levels[i % 16] + 128);
  const __m512i table = _mm512_load_si512(levels);
  for (int64_t i = 0; i < r1 - r0; ++i) {
    const int64_t r = decode_row(r0, r1, i);
    const uint8_t* row = w + size_t(r) * row_bytes;
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t qd = 0; qd < n_quads; ++qd) {
      const uint8_t* quad = row + qd * 4 * f.block_bytes;
      if constexpr (KILN_DECODE_PREFETCH > 0) {
        _mm_prefetch(reinterpret_cast<const char*>(quad + KILN_DECODE_PREFETCH), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(quad + KILN_DECODE_PREFETCH + 64), _MM_HINT_T0);
      }
      const __m512i a = _mm512_loadu_si512(quad), b = _mm512_loadu_si512(quad + idx.b_off);
      const __m512i v = _mm512_permutex2var_epi16(a, idx.qs, b);
      __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      if constexpr (kLookup) {
        lo = _mm512_shuffle_epi8(table, lo);
        hi = _mm512_shuffle_epi8(table, hi);
      }
      if constexpr (kHigh) {  // bit 4: the 4 blocks' 16-bit halves of qh form two 64-bit masks
        const __m128i bits = _mm512_castsi512_si128(_mm512_permutex2var_epi16(a, idx.qh, b));
        lo = _mm512_mask_add_epi8(lo, __mmask64(_mm_cvtsi128_si64(bits)), lo, sixteen);
        hi = _mm512_mask_add_epi8(hi, __mmask64(_mm_extract_epi64(bits, 1)), hi, sixteen);
      }
      const __m512 dw = halves_to_float(_mm512_permutex2var_epi16(a, idx.d, b));
      __m512 mw;
      if constexpr (kMin) mw = halves_to_float(_mm512_permutex2var_epi16(a, idx.m, b));
      for (int t = 0; t < NT; ++t) {
        const DecodeToken& tk = tokens[t];
        __m512i dot = kMin ? _mm512_setzero_si512() : _mm512_load_si512(tk.bias + 16 * qd);
        dot = _mm512_dpbusd_epi32(dot, lo, _mm512_load_si512(tk.q + 128 * qd));
        dot = _mm512_dpbusd_epi32(dot, hi, _mm512_load_si512(tk.q + 128 * qd + 64));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_load_ps(tk.dx + 16 * qd)), acc[t]);
        if constexpr (kMin) acc[t] = _mm512_fnmadd_ps(mw, _mm512_load_ps(tk.neg_dx_sum + 16 * qd), acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t)
      y[t * y_stride + r] = _mm512_reduce_add_ps(acc[t]) +
                            tail_dot(f.type, row, f.block_bytes, 4 * n_quads, n_blocks - 4 * n_quads, tokens[t]);
  }
}

template <bool kMin, bool kHigh, bool kLookup>
void decode_nibbles(const NibbleFormat& f, const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1,
                    const DecodeToken* tokens, int n_tokens, float* y, int64_t y_stride) {
  const NibbleIndices idx(f);
  for (int t0 = 0; t0 < n_tokens; t0 += 3) {
    const int nt = std::min(3, n_tokens - t0);
    auto fn = nt == 1 ? decode_nibble_rows<1, kMin, kHigh, kLookup>
              : nt == 2 ? decode_nibble_rows<2, kMin, kHigh, kLookup>
                        : decode_nibble_rows<3, kMin, kHigh, kLookup>;
    fn(f, idx, w, row_bytes, r0, r1, tokens + t0, y + t0 * y_stride, y_stride);
  }
}

struct Q8_0Indices {
  __m512i lo, hi, scales;
  Q8_0Indices() {
    alignas(64) uint16_t l[32], h[32];
    alignas(64) uint16_t sc[32] = {};
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 8; ++j) {
        const int off_lo = 34 * i + 2 + 2 * j;  // loads at 0 and 56
        l[8 * i + j] = uint16_t(off_lo < 64 ? off_lo / 2 : 32 + (off_lo - 56) / 2);
        const int off_hi = 34 * i + 18 + 2 * j;  // loads at 18 and 72
        h[8 * i + j] = uint16_t(off_hi - 18 < 64 ? (off_hi - 18) / 2 : 32 + (off_hi - 72) / 2);
      }
    const uint16_t word[4] = {0, 17, 32 + 6, 32 + 23};  // bytes 0, 34 (load at 0); 68, 102 (load at 56)
    for (int ln = 0; ln < 16; ++ln) sc[ln] = word[ln / 4];
    lo = _mm512_load_si512(l);
    hi = _mm512_load_si512(h);
    scales = _mm512_load_si512(sc);
  }
};

}  // namespace

// Zero points: q4_0 8, q5_0 16, iq4_nl 128 (levels stored + 128); q4_1 / q5_1 have a min.
void decode_q4_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  static const NibbleFormat f{GgmlType::Q4_0, 18, 0, -1, -1, 2};
  decode_nibbles<false, false, false>(f, w, row_bytes, r0, r1, tokens, n_tokens, y, y_stride);
}

void decode_q4_1(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  static const NibbleFormat f{GgmlType::Q4_1, 20, 0, 2, -1, 4};
  decode_nibbles<true, false, false>(f, w, row_bytes, r0, r1, tokens, n_tokens, y, y_stride);
}

void decode_q5_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  static const NibbleFormat f{GgmlType::Q5_0, 22, 0, -1, 2, 6};
  decode_nibbles<false, true, false>(f, w, row_bytes, r0, r1, tokens, n_tokens, y, y_stride);
}

void decode_q5_1(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  static const NibbleFormat f{GgmlType::Q5_1, 24, 0, 2, 4, 8};
  decode_nibbles<true, true, false>(f, w, row_bytes, r0, r1, tokens, n_tokens, y, y_stride);
}

void decode_iq4_nl(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                   float* y, int64_t y_stride) {
  static const NibbleFormat f{GgmlType::IQ4_NL, 18, 0, -1, -1, 2};
  decode_nibbles<false, false, true>(f, w, row_bytes, r0, r1, tokens, n_tokens, y, y_stride);
}

void decode_q8_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  static const Q8_0Indices idx;
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  auto weights = [&](const uint8_t* quad, __m512i& lo, __m512i& hi, __m512& dw) {
    const __m512i a = _mm512_loadu_si512(quad), b = _mm512_loadu_si512(quad + 56);
    const __m512i c = _mm512_loadu_si512(quad + 18), d = _mm512_loadu_si512(quad + 72);
    // q + 128 as unsigned bytes; the zero point 128 is 32 per lane.
    lo = _mm512_xor_si512(_mm512_permutex2var_epi16(a, idx.lo, b), flip);
    hi = _mm512_xor_si512(_mm512_permutex2var_epi16(c, idx.hi, d), flip);
    dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(a, idx.scales, b)));
  };
  decode_dispatch(w, row_bytes, sizeof(BlockQ8_0), GgmlType::Q8_0, r0, r1, tokens, n_tokens, y, y_stride, weights);
}

// ---- decode: q4_K, q5_K and q6_K (super-blocks of 256 = 2 quads) -------------------------------

namespace {

// 64-bit lane indices for _mm512_permutex2var_epi64 that regroup two vectors a, b of 4 x 16
// bytes: [a0 a2 b0 b2] / [a1 a3 b1 b3], and interleaved: [a0 b0 a2 b2] / [a1 b1 a3 b3].
inline __m512i even_lanes_a_b() { return _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13); }
inline __m512i odd_lanes_a_b() { return _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15); }
inline __m512i even_lanes_ab() { return _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13); }
inline __m512i odd_lanes_ab() { return _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15); }

inline __m512i lane_index(int first) {  // lane L -> first + L / 4
  return _mm512_setr_epi32(first, first, first, first, first + 1, first + 1, first + 1, first + 1, first + 2,
                           first + 2, first + 2, first + 2, first + 3, first + 3, first + 3, first + 3);
}

// q4_K, and q5_K (kFive) whose fifth bits come from qh: bit 2g of qh[l] for element 64g + l,
// bit 2g + 1 for element 64g + 32 + l.
template <int NT, bool kFive>
void decode_q4_K_rows(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, float* y,
                      int64_t y_stride) {
  constexpr size_t kBlock = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  constexpr int kQs = kFive ? 48 : 16;
  const __m512i sixteen = _mm512_set1_epi8(16);
  __m512i bit_lo[2], bit_hi[2];  // per quad: the qh bit of the low / high nibbles
  for (int h = 0; h < 2; ++h) {
    bit_lo[h] = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (4 * h))), _mm256_set1_epi8(char(1 << (4 * h + 2))), 1);
    bit_hi[h] = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (4 * h + 1))), _mm256_set1_epi8(char(1 << (4 * h + 3))), 1);
  }
  const int64_t n_super = tokens[0].n_quads / 2;
  const __m512i nib = _mm512_set1_epi8(0x0F), even = even_lanes_ab(), odd = odd_lanes_ab();
  const __m512i idx_sc[2] = {lane_index(0), lane_index(4)}, idx_mn[2] = {lane_index(8), lane_index(12)};
  for (int64_t i = 0; i < r1 - r0; ++i) {
    const int64_t r = decode_row(r0, r1, i);
    const uint8_t* row = w + size_t(r) * row_bytes;
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < n_super; ++sb) {
      const uint8_t* blk = row + sb * kBlock;
      if constexpr (KILN_DECODE_PREFETCH > 0)
        for (size_t ahead = 0; ahead < kBlock; ahead += 64)
          _mm_prefetch(reinterpret_cast<const char*>(blk + KILN_DECODE_PREFETCH + ahead), _MM_HINT_T0);
      __m512i qh;
      if constexpr (kFive) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)));
      uint16_t dh[2];
      std::memcpy(dh, blk, 4);
      // Lanes 0..7: d * scale_j, lanes 8..15: dmin * min_j.
      const __m512 dd = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(f16_to_f32(dh[0])), _mm512_set1_ps(f16_to_f32(dh[1])));
      const __m512 sm = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4k_scales_mins(blk + 4))), dd);
      for (int h = 0; h < 2; ++h) {  // quad h: sub-blocks 4h..4h+3, qs bytes 64h..64h+63
        const int64_t qd = 2 * sb + h;
        const __m512i v = _mm512_loadu_si512(blk + kQs + 64 * h);
        __m512i lo_n = _mm512_and_si512(v, nib), hi_n = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        if constexpr (kFive) {
          lo_n = _mm512_mask_add_epi8(lo_n, _mm512_test_epi8_mask(qh, bit_lo[h]), lo_n, sixteen);
          hi_n = _mm512_mask_add_epi8(hi_n, _mm512_test_epi8_mask(qh, bit_hi[h]), hi_n, sixteen);
        }
        // Sub-block 2g takes the low nibbles of bytes 32g.., 2g+1 the high nibbles: in the
        // token order [b0..b3 first halves | b0..b3 second halves] that is:
        const __m512i lo = _mm512_permutex2var_epi64(lo_n, even, hi_n);
        const __m512i hi = _mm512_permutex2var_epi64(lo_n, odd, hi_n);
        const __m512 sc = _mm512_permutexvar_ps(idx_sc[h], sm), mn = _mm512_permutexvar_ps(idx_mn[h], sm);
        for (int t = 0; t < NT; ++t) {
          const DecodeToken& tk = tokens[t];
          __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(tk.q + 128 * qd));
          dot = _mm512_dpbusd_epi32(dot, hi, _mm512_load_si512(tk.q + 128 * qd + 64));
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sc, _mm512_load_ps(tk.dx + 16 * qd)), acc[t]);
          acc[t] = _mm512_fmadd_ps(mn, _mm512_load_ps(tk.neg_dx_sum + 16 * qd), acc[t]);
        }
      }
    }
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = _mm512_reduce_add_ps(acc[t]);
  }
}

template <int NT>
void decode_q6_K_rows(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, float* y,
                      int64_t y_stride) {
  const int64_t n_super = tokens[0].n_quads / 2;
  const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  const __m512i even = even_lanes_a_b(), odd = odd_lanes_a_b();
  const __m512i shift_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i shift_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  // Lane L of the first / second 64 token bytes of half h belongs to the 16-element chunk
  // 8h + 2 (L / 4) / 8h + 2 (L / 4) + 1.
  __m512i idx_sc[2][2];
  for (int h = 0; h < 2; ++h)
    for (int part = 0; part < 2; ++part) {
      alignas(64) int32_t idx[16];
      for (int l = 0; l < 16; ++l) idx[l] = 8 * h + 2 * (l / 4) + part;
      idx_sc[h][part] = _mm512_load_si512(idx);
    }
  for (int64_t i = 0; i < r1 - r0; ++i) {
    const int64_t r = decode_row(r0, r1, i);
    const uint8_t* row = w + size_t(r) * row_bytes;
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < n_super; ++sb) {
      const uint8_t* blk = row + sb * sizeof(BlockQ6_K);
      if constexpr (KILN_DECODE_PREFETCH > 0)
        for (size_t ahead = 0; ahead < sizeof(BlockQ6_K); ahead += 64)
          _mm_prefetch(reinterpret_cast<const char*>(blk + KILN_DECODE_PREFETCH + ahead), _MM_HINT_T0);
      uint16_t dh;
      std::memcpy(&dh, blk + 208, 2);
      const __m512 scales = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)))),
          _mm512_set1_ps(f16_to_f32(dh)));
      for (int h = 0; h < 2; ++h) {
        const int64_t qd = 2 * sb + h;
        const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h)));
        // Natural order: a = elements 0..63 of the half, b = 64..127 (q in 0..63).
        const __m512i a = _mm512_or_si512(_mm512_and_si512(ql, nib), _mm512_and_si512(_mm512_sllv_epi16(qh, shift_lo), top));
        const __m512i b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nib),
                                          _mm512_and_si512(_mm512_srlv_epi16(qh, shift_hi), top));
        const __m512i lo = _mm512_permutex2var_epi64(a, even, b);  // chunks 0, 2, 4, 6
        const __m512i hi = _mm512_permutex2var_epi64(a, odd, b);   // chunks 1, 3, 5, 7
        const __m512 sc_lo = _mm512_permutexvar_ps(idx_sc[h][0], scales);
        const __m512 sc_hi = _mm512_permutexvar_ps(idx_sc[h][1], scales);
        for (int t = 0; t < NT; ++t) {
          const DecodeToken& tk = tokens[t];
          // (q - 32): the zero point 32 over 16 elements is 8 * sum per lane of the 4.
          const __m512i dot_lo = _mm512_dpbusd_epi32(_mm512_load_si512(tk.bias_lo + 16 * qd), lo,
                                                     _mm512_load_si512(tk.q + 128 * qd));
          const __m512i dot_hi = _mm512_dpbusd_epi32(_mm512_load_si512(tk.bias_hi + 16 * qd), hi,
                                                     _mm512_load_si512(tk.q + 128 * qd + 64));
          const __m512 s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_hi), sc_hi, _mm512_mul_ps(_mm512_cvtepi32_ps(dot_lo), sc_lo));
          acc[t] = _mm512_fmadd_ps(s, _mm512_load_ps(tk.dx + 16 * qd), acc[t]);
        }
      }
    }
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = _mm512_reduce_add_ps(acc[t]);
  }
}

template <void (*Rows1)(const uint8_t*, size_t, int64_t, int64_t, const DecodeToken*, float*, int64_t),
          void (*Rows2)(const uint8_t*, size_t, int64_t, int64_t, const DecodeToken*, float*, int64_t),
          void (*Rows3)(const uint8_t*, size_t, int64_t, int64_t, const DecodeToken*, float*, int64_t)>
void decode_by_tokens(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens,
                      int n_tokens, float* y, int64_t y_stride) {
  for (int t0 = 0; t0 < n_tokens; t0 += 3) {
    const int nt = std::min(3, n_tokens - t0);
    auto fn = nt == 1 ? Rows1 : nt == 2 ? Rows2 : Rows3;
    fn(w, row_bytes, r0, r1, tokens + t0, y + t0 * y_stride, y_stride);
  }
}

}  // namespace

void decode_q4_K(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  decode_by_tokens<decode_q4_K_rows<1, false>, decode_q4_K_rows<2, false>, decode_q4_K_rows<3, false>>(
      w, row_bytes, r0, r1, tokens, n_tokens, y, y_stride);
}

void decode_q5_K(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  decode_by_tokens<decode_q4_K_rows<1, true>, decode_q4_K_rows<2, true>, decode_q4_K_rows<3, true>>(
      w, row_bytes, r0, r1, tokens, n_tokens, y, y_stride);
}

void decode_q6_K(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  decode_by_tokens<decode_q6_K_rows<1>, decode_q6_K_rows<2>, decode_q6_K_rows<3>>(w, row_bytes, r0, r1, tokens,
                                                                                   n_tokens, y, y_stride);
}

}  // namespace kiln::cpu::avx512
