// AVX-512 (F, BW, VL, DQ, VNNI) kernels for matmul: float dot products and panels,
// activation quantization, the int8 prefill kernel and direct decode kernels for q4_0 and
// q8_0. See matmul_kernels.h for the layouts. Compiled with -mavx512*: call only when
// cpu_features().avx512 (and .avx512_vnni for the int8 kernels).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "core/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace kiln::cpu::avx512 {
namespace {

inline __mmask16 tail_mask16(int64_t n) { return __mmask16((1u << n) - 1); }

// Symmetric int8 quantization of 32 floats: q = round(x / dx), dx = max|x| / 127.
// Returns dx; writes q and the sums of q over elements 0..15 and 16..31.
inline float quantize_block32(const float* x, int8_t* q, int32_t* sum_lo, int32_t* sum_hi) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float dx = amax / 127.0f;
  const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));  // rounds to nearest even
  const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  *sum_lo = _mm512_reduce_add_epi32(qa);
  *sum_hi = _mm512_reduce_add_epi32(qb);
  return dx;
}

// Dot product of the weight row's columns past the last whole quad with the f32
// activations: dequantized with the library's row dequantizer (at most 3 blocks).
float tail_dot(GgmlType type, const uint8_t* row, size_t block_bytes, int64_t first_block,
               int64_t n_blocks, const float* x) {
  if (n_blocks == 0) return 0;
  alignas(64) float w[96];
  dequantize_row(type, row + first_block * block_bytes, w, 32 * n_blocks);
  return dot_f32(w, x + 32 * first_block, 32 * n_blocks);
}

}  // namespace

// ---- float dot products (decode of f32 / f16 / bf16 weights) ----------------------------

float dot_f32(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
    s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : tail_mask16(n - i);
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

float dot_f16(const void* w, const float* x, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(w);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
  int64_t i = 0;
  auto load = [&](int64_t at) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + at))); };
  for (; i + 64 <= n; i += 64) {
    s0 = _mm512_fmadd_ps(load(i), _mm512_loadu_ps(x + i), s0);
    s1 = _mm512_fmadd_ps(load(i + 16), _mm512_loadu_ps(x + i + 16), s1);
    s2 = _mm512_fmadd_ps(load(i + 32), _mm512_loadu_ps(x + i + 32), s2);
    s3 = _mm512_fmadd_ps(load(i + 48), _mm512_loadu_ps(x + i + 48), s3);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : tail_mask16(n - i);
    const __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + i));
    s0 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

float dot_bf16(const void* w, const float* x, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(w);
  auto widen = [](__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); };
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))), _mm512_loadu_ps(x + i), s0);
    s1 = _mm512_fmadd_ps(widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i + 16))),
                         _mm512_loadu_ps(x + i + 16), s1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : tail_mask16(n - i);
    s0 = _mm512_fmadd_ps(widen(_mm256_maskz_loadu_epi16(m, h + i)), _mm512_maskz_loadu_ps(m, x + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// ---- float prefill panel ------------------------------------------------------------------

namespace {
template <int R>
void panel_f32_rows(const float* w, int64_t ws, int64_t k_len, const float* panel, float* acc, bool accumulate) {
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = accumulate ? _mm512_loadu_ps(acc + 16 * r) : _mm512_setzero_ps();
  for (int64_t k = 0; k < k_len; ++k) {
    const __m512 xv = _mm512_load_ps(panel + 16 * k);
    for (int r = 0; r < R; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[r * ws + k]), xv, a[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + 16 * r, a[r]);
}
}  // namespace

void panel_f32(const float* w, int64_t w_stride, int rows, int64_t k_len, const float* panel, float* acc,
               bool accumulate) {
  switch (rows) {
    case 1: return panel_f32_rows<1>(w, w_stride, k_len, panel, acc, accumulate);
    case 2: return panel_f32_rows<2>(w, w_stride, k_len, panel, acc, accumulate);
    case 3: return panel_f32_rows<3>(w, w_stride, k_len, panel, acc, accumulate);
    case 4: return panel_f32_rows<4>(w, w_stride, k_len, panel, acc, accumulate);
    case 5: return panel_f32_rows<5>(w, w_stride, k_len, panel, acc, accumulate);
    case 6: return panel_f32_rows<6>(w, w_stride, k_len, panel, acc, accumulate);
    case 7: return panel_f32_rows<7>(w, w_stride, k_len, panel, acc, accumulate);
    default: return panel_f32_rows<8>(w, w_stride, k_len, panel, acc, accumulate);
  }
}

void transpose_tokens_f32(const float* x, int64_t x_stride, int n_tokens, int64_t cols, float* panel) {
  for (int64_t k = 0; k < cols; ++k) {
    float* p = panel + 16 * k;
    int t = 0;
    for (; t < n_tokens; ++t) p[t] = x[t * x_stride + k];
    for (; t < 16; ++t) p[t] = 0;
  }
}

// ---- decode: activations and the q4_0 / q8_0 kernels --------------------------------------

void prepare_decode_token(const float* x, int64_t cols, DecodeToken& out) {
  out.x = x;
  out.n_quads = cols / 128;
  for (int64_t qd = 0; qd < out.n_quads; ++qd) {
    for (int i = 0; i < 4; ++i) {
      alignas(64) int8_t q[32];
      int32_t lo, hi;
      const float dx = quantize_block32(x + 128 * qd + 32 * i, q, &lo, &hi);
      std::memcpy(out.q + 128 * qd + 16 * i, q, 16);
      std::memcpy(out.q + 128 * qd + 64 + 16 * i, q + 16, 16);
      for (int l = 0; l < 4; ++l) {
        const int64_t lane = 16 * qd + 4 * i + l;
        out.neg_sum[lane] = -(lo + hi);
        out.neg_sum_lo[lane] = -lo;
        out.neg_sum_hi[lane] = -hi;
        out.dx[lane] = dx;
        out.neg_dx_sum[lane] = -dx * float(lo + hi) * 0.25f;
      }
    }
  }
}

namespace {

// The shared loop of the quad decode kernels: `Weights` turns quad `qd` of a row into two
// u8 vectors (lanes as in DecodeToken) and the 16 lanes' weight scales; `kBiasShift`
// scales -sum(x) into the lanes' share of the weights' zero point (-offset * sum / 4).
template <int NT, typename Weights>
void decode_quads(const uint8_t* w, size_t row_bytes, size_t block_bytes, GgmlType type, int64_t r0, int64_t r1,
                  const DecodeToken* tokens, float* y, int64_t y_stride, int bias_shift, Weights weights) {
  const int64_t n_quads = tokens[0].n_quads;
  const int64_t n_blocks = int64_t(row_bytes / block_bytes);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + size_t(r) * row_bytes;
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t qd = 0; qd < n_quads; ++qd) {
      __m512i lo, hi;
      __m512 dw;
      weights(row + qd * 4 * block_bytes, lo, hi, dw);
      for (int t = 0; t < NT; ++t) {
        const DecodeToken& tk = tokens[t];
        __m512i dot = _mm512_sllv_epi32(_mm512_load_si512(tk.neg_sum + 16 * qd), _mm512_set1_epi32(bias_shift));
        dot = _mm512_dpbusd_epi32(dot, lo, _mm512_load_si512(tk.q + 128 * qd));
        dot = _mm512_dpbusd_epi32(dot, hi, _mm512_load_si512(tk.q + 128 * qd + 64));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_load_ps(tk.dx + 16 * qd)), acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t)
      y[t * y_stride + r] = _mm512_reduce_add_ps(acc[t]) +
                            tail_dot(type, row, block_bytes, 4 * n_quads, n_blocks - 4 * n_quads, tokens[t].x);
  }
}

template <typename Weights>
void decode_dispatch(const uint8_t* w, size_t row_bytes, size_t block_bytes, GgmlType type, int64_t r0, int64_t r1,
                     const DecodeToken* tokens, int n_tokens, float* y, int64_t y_stride, int bias_shift,
                     Weights weights) {
  for (int t0 = 0; t0 < n_tokens; t0 += 4) {
    const int nt = std::min(4, n_tokens - t0);
    float* yt = y + t0 * y_stride;
    switch (nt) {
      case 1: decode_quads<1>(w, row_bytes, block_bytes, type, r0, r1, tokens + t0, yt, y_stride, bias_shift, weights); break;
      case 2: decode_quads<2>(w, row_bytes, block_bytes, type, r0, r1, tokens + t0, yt, y_stride, bias_shift, weights); break;
      case 3: decode_quads<3>(w, row_bytes, block_bytes, type, r0, r1, tokens + t0, yt, y_stride, bias_shift, weights); break;
      default: decode_quads<4>(w, row_bytes, block_bytes, type, r0, r1, tokens + t0, yt, y_stride, bias_shift, weights); break;
    }
  }
}

// Word indices for _mm512_permutex2var_epi16 (AVX512-BW; every field used starts at an even
// byte): word p of the result is word `idx[p]` of the concatenation (a: 0..31, b: 32..63).
struct Q4_0Indices {
  __m512i nibbles, scales;
  Q4_0Indices() {
    alignas(64) uint16_t nb[32];
    alignas(64) uint16_t sc[32] = {};
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 8; ++j) {
        const int off = 18 * i + 2 + 2 * j;  // qs[2j] of block i; loads at 0 and 8
        nb[8 * i + j] = uint16_t(off < 64 ? off / 2 : 32 + (off - 8) / 2);
      }
    for (int l = 0; l < 16; ++l) sc[l] = uint16_t(9 * (l / 4));  // d of block l / 4, word 9i
    nibbles = _mm512_load_si512(nb);
    scales = _mm512_load_si512(sc);
  }
};

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

void decode_q4_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  static const Q4_0Indices idx;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  auto weights = [&](const uint8_t* quad, __m512i& lo, __m512i& hi, __m512& dw) {
    const __m512i a = _mm512_loadu_si512(quad), b = _mm512_loadu_si512(quad + 8);
    const __m512i v = _mm512_permutex2var_epi16(a, idx.nibbles, b);
    lo = _mm512_and_si512(v, nib);
    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(idx.scales, a)));
  };
  // Weights are q (0..15) for (q - 8) * d: the zero point 8 is 2 per lane of the 4 lanes.
  decode_dispatch(w, row_bytes, sizeof(BlockQ4_0), GgmlType::Q4_0, r0, r1, tokens, n_tokens, y, y_stride, 1, weights);
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
  decode_dispatch(w, row_bytes, sizeof(BlockQ8_0), GgmlType::Q8_0, r0, r1, tokens, n_tokens, y, y_stride, 5, weights);
}

// ---- decode: q4_K and q6_K (super-blocks of 256 = 2 quads) -------------------------------

namespace {

// 64-bit lane indices for _mm512_permutex2var_epi64 that regroup two vectors a, b of 4 x 16
// bytes: [a0 a2 b0 b2] / [a1 a3 b1 b3], and interleaved: [a0 b0 a2 b2] / [a1 b1 a3 b3].
inline __m512i even_lanes_a_b() { return _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13); }
inline __m512i odd_lanes_a_b() { return _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15); }
inline __m512i even_lanes_ab() { return _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13); }
inline __m512i odd_lanes_ab() { return _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15); }

// The 8 six-bit scales and 8 mins of a q4_K super-block (12 packed bytes at `packed`, which
// may be read 16 bytes wide), as 16 bytes: scales in 0..7, mins in 8..15.
inline __m128i q4k_scales_mins(const uint8_t* packed) {
  const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  // Low parts: scale j<4: s[j] & 63, j>=4: s[j+4] & 15; min j<4: s[j+4] & 63, j>=4: s[j+4] >> 4.
  const __m128i low_src = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i shifted = _mm_blend_epi16(low_src, _mm_srli_epi16(low_src, 4), 0xC0);  // min j>=4: >> 4
  const __m128i low = _mm_and_si128(shifted, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
  // High parts (j>=4): scale: s[j-4] >> 6, min: s[j] >> 6, moved to bits 4-5.
  const __m128i high_src = _mm_shuffle_epi8(s, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i high = _mm_and_si128(_mm_srli_epi16(high_src, 2), _mm_set1_epi8(0x30));
  return _mm_or_si128(low, high);
}

inline __m512i lane_index(int first) {  // lane L -> first + L / 4
  return _mm512_setr_epi32(first, first, first, first, first + 1, first + 1, first + 1, first + 1, first + 2,
                           first + 2, first + 2, first + 2, first + 3, first + 3, first + 3, first + 3);
}

template <int NT>
void decode_q4_K_rows(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, float* y,
                      int64_t y_stride) {
  const int64_t n_super = tokens[0].n_quads / 2;
  const __m512i nib = _mm512_set1_epi8(0x0F), even = even_lanes_ab(), odd = odd_lanes_ab();
  const __m512i idx_sc[2] = {lane_index(0), lane_index(4)}, idx_mn[2] = {lane_index(8), lane_index(12)};
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + size_t(r) * row_bytes;
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < n_super; ++sb) {
      const uint8_t* blk = row + sb * sizeof(BlockQ4_K);
      uint16_t dh[2];
      std::memcpy(dh, blk, 4);
      // Lanes 0..7: d * scale_j, lanes 8..15: dmin * min_j.
      const __m512 dd = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(f16_to_f32(dh[0])), _mm512_set1_ps(f16_to_f32(dh[1])));
      const __m512 sm = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4k_scales_mins(blk + 4))), dd);
      for (int h = 0; h < 2; ++h) {  // quad h: sub-blocks 4h..4h+3, qs bytes 64h..64h+63
        const int64_t qd = 2 * sb + h;
        const __m512i v = _mm512_loadu_si512(blk + 16 + 64 * h);
        const __m512i lo_n = _mm512_and_si512(v, nib), hi_n = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
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
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + size_t(r) * row_bytes;
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < n_super; ++sb) {
      const uint8_t* blk = row + sb * sizeof(BlockQ6_K);
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
          const __m512i dot_lo = _mm512_dpbusd_epi32(_mm512_slli_epi32(_mm512_load_si512(tk.neg_sum_lo + 16 * qd), 3), lo,
                                                     _mm512_load_si512(tk.q + 128 * qd));
          const __m512i dot_hi = _mm512_dpbusd_epi32(_mm512_slli_epi32(_mm512_load_si512(tk.neg_sum_hi + 16 * qd), 3), hi,
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
  decode_by_tokens<decode_q4_K_rows<1>, decode_q4_K_rows<2>, decode_q4_K_rows<3>>(w, row_bytes, r0, r1, tokens,
                                                                                   n_tokens, y, y_stride);
}

void decode_q6_K(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const DecodeToken* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  decode_by_tokens<decode_q6_K_rows<1>, decode_q6_K_rows<2>, decode_q6_K_rows<3>>(w, row_bytes, r0, r1, tokens,
                                                                                   n_tokens, y, y_stride);
}

// ---- int8 prefill ---------------------------------------------------------------------------

void prepare_int8_panel(const float* x, int64_t x_stride, int n_tokens, int64_t cols, Int8PanelBlock* panel) {
  const int64_t nb = cols / 32;
  for (int64_t b = 0; b < nb; ++b) {
    Int8PanelBlock& p = panel[b];
    for (int t = 0; t < 16; ++t) {
      alignas(64) int8_t q[32] = {};
      int32_t lo = 0, hi = 0;
      float dx = 0;
      if (t < n_tokens) dx = quantize_block32(x + t * x_stride + 32 * b, q, &lo, &hi);
      for (int c = 0; c < 8; ++c)
        for (int e = 0; e < 4; ++e) p.u[c][4 * t + e] = uint8_t(q[4 * c + e] + 128);
      p.dx[t] = dx;
      p.dx_sum_lo[t] = dx * float(lo);
      p.dx_sum_hi[t] = dx * float(hi);
      p.dx_sum_all[t] = dx * float(lo + hi);
    }
  }
}

namespace {

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <int R, bool kOffset>
void panel_int8_g32(const Int8Tile& tile, int64_t b0, int64_t b1, const Int8PanelBlock* panel, float* acc, bool accumulate) {
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = accumulate ? _mm512_loadu_ps(acc + 16 * r) : _mm512_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    const Int8PanelBlock& p = panel[b];
    __m512i xc[8];
    for (int c = 0; c < 8; ++c) xc[c] = _mm512_load_si512(p.u[c]);
    const __m512 dx = _mm512_load_ps(p.dx);
    for (int r = 0; r < R; ++r) {
      const int64_t g = r * tile.group_stride + b;
      const int8_t* q = tile.q + r * tile.q_stride + 32 * b;
      __m512i s = _mm512_set1_epi32(tile.bias[g]);
      for (int c = 0; c < 8; ++c) s = _mm512_dpbusd_epi32(s, xc[c], bcast4(q + 4 * c));
      a[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(tile.scale[g]), dx), a[r]);
      if constexpr (kOffset)
        a[r] = _mm512_fmadd_ps(_mm512_set1_ps(tile.offset[g]), _mm512_load_ps(p.dx_sum_all), a[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + 16 * r, a[r]);
}

template <int R, bool kOffset>
void panel_int8_g16(const Int8Tile& tile, int64_t b0, int64_t b1, const Int8PanelBlock* panel, float* acc, bool accumulate) {
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = accumulate ? _mm512_loadu_ps(acc + 16 * r) : _mm512_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    const Int8PanelBlock& p = panel[b];
    __m512i xc[8];
    for (int c = 0; c < 8; ++c) xc[c] = _mm512_load_si512(p.u[c]);
    const __m512 dx = _mm512_load_ps(p.dx);
    for (int r = 0; r < R; ++r) {
      const int8_t* q = tile.q + r * tile.q_stride + 32 * b;
      for (int h = 0; h < 2; ++h) {
        const int64_t g = r * tile.group_stride + 2 * b + h;
        __m512i s = _mm512_set1_epi32(tile.bias[g]);
        for (int c = 0; c < 4; ++c) s = _mm512_dpbusd_epi32(s, xc[4 * h + c], bcast4(q + 16 * h + 4 * c));
        a[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(tile.scale[g]), dx), a[r]);
        if constexpr (kOffset)
          a[r] = _mm512_fmadd_ps(_mm512_set1_ps(tile.offset[g]), _mm512_load_ps(h ? p.dx_sum_hi : p.dx_sum_lo), a[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + 16 * r, a[r]);
}

template <int R>
void panel_int8_rows(const Int8Tile& tile, int64_t b0, int64_t b1, const Int8PanelBlock* panel, float* acc, bool accumulate) {
  const bool off = tile.offset != nullptr;
  if (tile.group == 32) {
    if (off) panel_int8_g32<R, true>(tile, b0, b1, panel, acc, accumulate);
    else panel_int8_g32<R, false>(tile, b0, b1, panel, acc, accumulate);
  } else {
    if (off) panel_int8_g16<R, true>(tile, b0, b1, panel, acc, accumulate);
    else panel_int8_g16<R, false>(tile, b0, b1, panel, acc, accumulate);
  }
}

}  // namespace

void panel_int8(const Int8Tile& tile, int rows, int64_t b0, int64_t b1, const Int8PanelBlock* panel, float* acc,
                bool accumulate) {
  switch (rows) {
    case 1: return panel_int8_rows<1>(tile, b0, b1, panel, acc, accumulate);
    case 2: return panel_int8_rows<2>(tile, b0, b1, panel, acc, accumulate);
    case 3: return panel_int8_rows<3>(tile, b0, b1, panel, acc, accumulate);
    case 4: return panel_int8_rows<4>(tile, b0, b1, panel, acc, accumulate);
    case 5: return panel_int8_rows<5>(tile, b0, b1, panel, acc, accumulate);
    case 6: return panel_int8_rows<6>(tile, b0, b1, panel, acc, accumulate);
    case 7: return panel_int8_rows<7>(tile, b0, b1, panel, acc, accumulate);
    default: return panel_int8_rows<8>(tile, b0, b1, panel, acc, accumulate);
  }
}

void group_bias(const int8_t* q, int group, int64_t n_groups, int32_t* bias) {
  const int64_t n = int64_t(group) * n_groups;
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  for (int64_t g = 0; g < n_groups; ++g) bias[g] = 0;
  int64_t i = 0;
  alignas(64) uint64_t part[8];
  // psadbw sums 8 unsigned bytes; with q + 128 the sum of a group is sum(q) + 128 * group.
  for (; i + 64 <= n; i += 64) {
    _mm512_store_si512(part, _mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(q + i), flip), _mm512_setzero_si512()));
    for (int j = 0; j < 8; ++j) bias[(i + 8 * j) / group] += int32_t(part[j]);
  }
  for (; i < n; ++i) bias[i / group] += q[i] + 128;
  for (int64_t g = 0; g < n_groups; ++g) bias[g] = -128 * (bias[g] - 128 * group);
}

// ---- SIMD unpackers for the hot types -------------------------------------------------------

bool unpack_int8_row_fast(GgmlType type, const void* row, int64_t cols, const Int8Row& out) {
  const auto* src = static_cast<const uint8_t*>(row);
  const __m256i nib = _mm256_set1_epi8(0x0F);
  switch (type) {
    case GgmlType::Q4_0: {
      const __m256i eight = _mm256_set1_epi8(8);
      for (int64_t b = 0; b < cols / 32; ++b) {
        const uint8_t* blk = src + b * sizeof(BlockQ4_0);
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
        const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q + 32 * b), _mm256_sub_epi8(_mm256_and_si256(both, nib), eight));
        uint16_t d;
        std::memcpy(&d, blk, 2);
        out.scale[b] = f16_to_f32(d);
      }
      return true;
    }
    case GgmlType::Q8_0: {
      for (int64_t b = 0; b < cols / 32; ++b) {
        const uint8_t* blk = src + b * sizeof(BlockQ8_0);
        std::memcpy(out.q + 32 * b, blk + 2, 32);
        uint16_t d;
        std::memcpy(&d, blk, 2);
        out.scale[b] = f16_to_f32(d);
      }
      return true;
    }
    case GgmlType::Q4_K: {
      for (int64_t b = 0; b < cols / 256; ++b) {
        BlockQ4_K blk;
        std::memcpy(&blk, src + b * sizeof(BlockQ4_K), sizeof(blk));
        int8_t* q = out.q + 256 * b;
        for (int g = 0; g < 4; ++g) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * g));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 64 * g), _mm256_and_si256(v, nib));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 64 * g + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
        }
        const float d = f16_to_f32(blk.d), dmin = f16_to_f32(blk.dmin);
        for (int s = 0; s < 8; ++s) {
          uint8_t sc, mn;
          kquant_scale_min(s, blk.scales, &sc, &mn);
          out.scale[8 * b + s] = d * float(sc);
          out.offset[8 * b + s] = -dmin * float(mn);
        }
      }
      return true;
    }
    case GgmlType::Q6_K: {
      const __m512i nib512 = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30), bias = _mm512_set1_epi8(32);
      const __m512i shift_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
      const __m512i shift_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
      for (int64_t b = 0; b < cols / 256; ++b) {
        const uint8_t* blk = src + b * sizeof(BlockQ6_K);
        int8_t* q = out.q + 256 * b;
        for (int half = 0; half < 2; ++half) {
          const __m512i ql = _mm512_loadu_si512(blk + 64 * half);
          const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * half)));
          // Elements 0..63 of the half: low nibbles, top bits 0-1 (first 32) and 2-3 (next 32).
          const __m512i hl = _mm512_and_si512(_mm512_sllv_epi16(qh, shift_lo), top);
          // Elements 64..127: high nibbles, top bits 4-5 and 6-7.
          const __m512i hh = _mm512_and_si512(_mm512_srlv_epi16(qh, shift_hi), top);
          const __m512i lo = _mm512_or_si512(_mm512_and_si512(ql, nib512), hl);
          const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nib512), hh);
          _mm512_storeu_si512(q + 128 * half, _mm512_sub_epi8(lo, bias));
          _mm512_storeu_si512(q + 128 * half + 64, _mm512_sub_epi8(hi, bias));
        }
        uint16_t dh;
        std::memcpy(&dh, blk + 208, 2);
        const float d = f16_to_f32(dh);
        const auto* scales = reinterpret_cast<const int8_t*>(blk + 192);
        for (int s = 0; s < 16; ++s) out.scale[16 * b + s] = d * float(scales[s]);
      }
      return true;
    }
    default:
      return false;
  }
}

}  // namespace kiln::cpu::avx512
