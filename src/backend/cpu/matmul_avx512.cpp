// AVX-512 (F, BW, VL, DQ, VNNI) kernels for matmul: float dot products and panels, the
// int8 prefill panel and kernel, and the SIMD unpackers of the hot types (the decode
// kernels are in matmul_decode_avx512.cpp). See matmul_kernels.h for the layouts.
// Compiled with -mavx512*: call only when cpu_features().avx512 (and .avx512_vnni for the
// int8 kernels).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <cstring>

#include "backend/cpu/avx512_common.h"
#include "backend/cpu/matmul_kernels.h"
#include "core/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace kiln::cpu::avx512 {
using detail::q4k_scales_mins;
using detail::prefetch_step;
using detail::tail_mask16;

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

// Weight rows of the float decode stream from memory: prefetched this far ahead (bytes).
constexpr int kWeightPrefetch = 4096;

float dot_f16(const void* w, const float* x, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(w);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
  int64_t i = 0;
  auto load = [&](int64_t at) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + at))); };
  for (; i + 64 <= n; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(h + i) + kWeightPrefetch, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(h + i) + kWeightPrefetch + 64, _MM_HINT_T0);
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
    _mm_prefetch(reinterpret_cast<const char*>(h + i) + kWeightPrefetch, _MM_HINT_T0);
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

// Two panels at once: 16 independent accumulators (8 are just enough to cover the FMA
// latency at two per cycle) and each broadcast weight used twice.
void panel_f32_pair_rows8(const float* w, int64_t ws, int64_t k_len, const float* p0, const float* p1, float* acc0,
                          float* acc1, Prefetch pf) {
  __m512 a[8], b[8];
  for (int r = 0; r < 8; ++r) a[r] = b[r] = _mm512_setzero_ps();
  // One line fetched every `every` steps spreads pf over the loop.
  const int64_t every = std::max<int64_t>(1, std::min<int64_t>(16, k_len / std::max<int64_t>(1, pf.lines)));
  int64_t countdown = 0;  // a counter, not k % every: that was an integer division per step
  for (int64_t k = 0; k < k_len; ++k) {
    if (--countdown <= 0) {
      prefetch_step(pf);
      countdown = every;
    }
    const __m512 x0 = _mm512_load_ps(p0 + 16 * k), x1 = _mm512_load_ps(p1 + 16 * k);
    for (int r = 0; r < 8; ++r) {
      const __m512 wv = _mm512_set1_ps(w[r * ws + k]);
      a[r] = _mm512_fmadd_ps(wv, x0, a[r]);
      b[r] = _mm512_fmadd_ps(wv, x1, b[r]);
    }
  }
  for (int r = 0; r < 8; ++r) {
    _mm512_storeu_ps(acc0 + 16 * r, a[r]);
    _mm512_storeu_ps(acc1 + 16 * r, b[r]);
  }
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

void panel_f32_pair(const float* w, int64_t w_stride, int rows, int64_t k_len, const float* panel0,
                    const float* panel1, float* acc0, float* acc1, Prefetch pf) {
  if (rows == 8) return panel_f32_pair_rows8(w, w_stride, k_len, panel0, panel1, acc0, acc1, pf);
  panel_f32(w, w_stride, rows, k_len, panel0, acc0, false);
  panel_f32(w, w_stride, rows, k_len, panel1, acc1, false);
}

void transpose_tokens_f32(const float* x, int64_t x_stride, int n_tokens, int64_t cols, float* panel) {
  for (int64_t k = 0; k < cols; ++k) {
    float* p = panel + 16 * k;
    int t = 0;
    for (; t < n_tokens; ++t) p[t] = x[t * x_stride + k];
    for (; t < 16; ++t) p[t] = 0;
  }
}

// ---- int8 prefill ---------------------------------------------------------------------------

namespace {

// acc += x (unsigned bytes) . the 4 signed bytes at p, broadcast: one instruction with an
// embedded-broadcast memory operand (GCC emits a separate vpbroadcastd for the intrinsic).
inline __m512i dpbusd_bcast(__m512i acc, __m512i x, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

template <int R, bool kOffset>
void panel_int8_g32(const Int8Tile& tile, int64_t b0, int64_t b1, const Int8PanelBlock* panel, float* acc, bool accumulate,
                    Prefetch pf) {
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = accumulate ? _mm512_loadu_ps(acc + 16 * r) : _mm512_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    prefetch_step(pf);
    prefetch_step(pf);
    const Int8PanelBlock& p = panel[b];
    __m512i xc[8];
    for (int c = 0; c < 8; ++c) xc[c] = _mm512_load_si512(p.u[c]);
    const __m512 dx = _mm512_load_ps(p.dx);
    for (int r = 0; r < R; ++r) {
      const int8_t* q = tile.q + (b * kInt8TileRows + r) * 32;
      const int64_t m = r * tile.row_maps + b;
      // Two chains of 4 (vpdpbusd has a latency of several cycles).
      __m512i s = _mm512_set1_epi32(tile.bias[m]), s2 = _mm512_setzero_si512();
      for (int c = 0; c < 8; c += 2) {
        s = dpbusd_bcast(s, xc[c], q + 4 * c);
        s2 = dpbusd_bcast(s2, xc[c + 1], q + 4 * c + 4);
      }
      s = _mm512_add_epi32(s, s2);
      a[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(tile.scale[m]), dx), a[r]);
      if constexpr (kOffset) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(tile.offset[m]), _mm512_load_ps(p.dx_sum_all), a[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + 16 * r, a[r]);
}

template <int R, bool kOffset>
void panel_int8_g16(const Int8Tile& tile, int64_t b0, int64_t b1, const Int8PanelBlock* panel, float* acc, bool accumulate,
                    Prefetch pf) {
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = accumulate ? _mm512_loadu_ps(acc + 16 * r) : _mm512_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    prefetch_step(pf);
    prefetch_step(pf);
    const Int8PanelBlock& p = panel[b];
    __m512i xc[8];
    for (int c = 0; c < 8; ++c) xc[c] = _mm512_load_si512(p.u[c]);
    const __m512 dx = _mm512_load_ps(p.dx);
    for (int r = 0; r < R; ++r) {
      const int8_t* q = tile.q + (b * kInt8TileRows + r) * 32;
      // The two 16-groups of the block are two independent chains; their scales are applied
      // together: (lo * s_lo + hi * s_hi) * dx.
      const int64_t m_lo = r * tile.row_maps + 2 * b, m_hi = m_lo + 1;
      __m512i lo = _mm512_set1_epi32(tile.bias[m_lo]), hi = _mm512_set1_epi32(tile.bias[m_hi]);
      for (int c = 0; c < 4; ++c) {
        lo = dpbusd_bcast(lo, xc[c], q + 4 * c);
        hi = dpbusd_bcast(hi, xc[4 + c], q + 16 + 4 * c);
      }
      const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_set1_ps(tile.scale[m_hi]),
                                       _mm512_mul_ps(_mm512_cvtepi32_ps(lo), _mm512_set1_ps(tile.scale[m_lo])));
      a[r] = _mm512_fmadd_ps(f, dx, a[r]);
      if constexpr (kOffset) {
        a[r] = _mm512_fmadd_ps(_mm512_set1_ps(tile.offset[m_lo]), _mm512_load_ps(p.dx_sum_lo), a[r]);
        a[r] = _mm512_fmadd_ps(_mm512_set1_ps(tile.offset[m_hi]), _mm512_load_ps(p.dx_sum_hi), a[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + 16 * r, a[r]);
}

template <int R>
void panel_int8_rows(const Int8Tile& tile, int64_t b0, int64_t b1, const Int8PanelBlock* panel, float* acc, bool accumulate,
                     Prefetch pf) {
  const bool off = tile.offset != nullptr;
  if (tile.group == 32) {
    if (off) panel_int8_g32<R, true>(tile, b0, b1, panel, acc, accumulate, pf);
    else panel_int8_g32<R, false>(tile, b0, b1, panel, acc, accumulate, pf);
  } else {
    if (off) panel_int8_g16<R, true>(tile, b0, b1, panel, acc, accumulate, pf);
    else panel_int8_g16<R, false>(tile, b0, b1, panel, acc, accumulate, pf);
  }
}

}  // namespace

void panel_int8(const Int8Tile& tile, int rows, int64_t b0, int64_t b1, const Int8PanelBlock* panel, float* acc,
                bool accumulate, Prefetch pf) {
  switch (rows) {
    case 1: return panel_int8_rows<1>(tile, b0, b1, panel, acc, accumulate, pf);
    case 2: return panel_int8_rows<2>(tile, b0, b1, panel, acc, accumulate, pf);
    case 3: return panel_int8_rows<3>(tile, b0, b1, panel, acc, accumulate, pf);
    case 4: return panel_int8_rows<4>(tile, b0, b1, panel, acc, accumulate, pf);
    case 5: return panel_int8_rows<5>(tile, b0, b1, panel, acc, accumulate, pf);
    case 6: return panel_int8_rows<6>(tile, b0, b1, panel, acc, accumulate, pf);
    case 7: return panel_int8_rows<7>(tile, b0, b1, panel, acc, accumulate, pf);
    default: return panel_int8_rows<8>(tile, b0, b1, panel, acc, accumulate, pf);
  }
}

void group_bias(const int8_t* q, int group, int64_t n_groups, int32_t* bias) {
  // psadbw sums 8 unsigned bytes; with q + 128 a group sums to sum(q) + 128 * group.
  const int64_t n = int64_t(group) * n_groups;
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  const int32_t shift = 128 * group;
  int64_t i = 0, g = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i s = _mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(q + i), flip), _mm512_setzero_si512());
    const __m512i pairs = _mm512_add_epi64(s, _mm512_shuffle_epi32(s, _MM_PERM_BADC));  // 64-bit lane 2k: sum of 16 bytes
    if (group == 16) {
      const __m128i four = _mm256_castsi256_si128(_mm512_cvtepi64_epi32(_mm512_maskz_compress_epi64(0x55, pairs)));
      const __m128i sums = _mm_sub_epi32(four, _mm_set1_epi32(shift));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bias + g), _mm_mullo_epi32(sums, _mm_set1_epi32(-128)));
      g += 4;
    } else {  // 32: lanes 0 and 4 after adding the neighbouring 128-bit lane
      const __m512i quads = _mm512_add_epi64(pairs, _mm512_shuffle_i64x2(pairs, pairs, _MM_SHUFFLE(2, 3, 0, 1)));
      bias[g] = -128 * (int32_t(_mm512_cvtsi512_si32(quads)) - shift);
      bias[g + 1] = -128 * (int32_t(_mm256_cvtsi256_si32(_mm512_extracti64x4_epi64(quads, 1))) - shift);
      g += 2;
    }
  }
  for (; g < n_groups; ++g) {  // a last group of 32 or fewer 16s
    int32_t sum = 0;
    for (int j = 0; j < group; ++j) sum += q[g * group + j];
    bias[g] = -128 * sum;
  }
}

// ---- SIMD unpackers for the hot types -------------------------------------------------------

namespace {

// The sums of the unsigned bytes in each 16-byte half of a 32-byte block.
inline void half_sums_u8(__m256i u, int32_t* lo, int32_t* hi) {
  const __m256i s = _mm256_sad_epu8(u, _mm256_setzero_si256());  // 4 sums of 8 bytes
  const __m128i a = _mm256_castsi256_si128(s), b = _mm256_extracti128_si256(s, 1);
  *lo = _mm_cvtsi128_si32(_mm_add_epi32(a, _mm_unpackhi_epi64(a, a)));
  *hi = _mm_cvtsi128_si32(_mm_add_epi32(b, _mm_unpackhi_epi64(b, b)));
}

// q4_0, four blocks (72 bytes) at a time: word permutations of two loads (at bytes 0 and
// 8) gather the four blocks' 16 nibble bytes and their scales.
struct Q4_0Quad {
  __m512i qs, d;
  Q4_0Quad() {
    auto word = [](int byte) { return uint16_t(byte + 1 < 64 ? byte / 2 : 32 + (byte - 8) / 2); };
    alignas(64) uint16_t q[32], dd[32] = {};
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 8; ++j) q[8 * i + j] = word(18 * i + 2 + 2 * j);
      dd[i] = word(18 * i);
    }
    qs = _mm512_load_si512(q);
    d = _mm512_load_si512(dd);
  }
};

// Blocks [4 * quad, 4 * quad + 4) of a q4_0 row to the tile, biases and scales (contiguous).
inline void unpack_q4_0_quad(const Q4_0Quad& idx, const uint8_t* src, int64_t quad, const Int8Row& out,
                             int64_t block_stride, int32_t* bias) {
  const uint8_t* p = src + quad * 4 * sizeof(BlockQ4_0);
  const __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 8);
  const __m512i nib = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  const __m512i v = _mm512_permutex2var_epi16(a, idx.qs, b);  // 128-bit lane i: block i's qs
  const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
  // Block i = [low nibbles, high nibbles] of lane i.
  const __m512i b01 = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi);
  const __m512i b23 = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), hi);
  int8_t* q = out.q + 4 * quad * block_stride;
  const __m512i q01 = _mm512_sub_epi8(b01, eight), q23 = _mm512_sub_epi8(b23, eight);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm512_castsi512_si256(q01));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + block_stride), _mm512_extracti64x4_epi64(q01, 1));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 2 * block_stride), _mm512_castsi512_si256(q23));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 3 * block_stride), _mm512_extracti64x4_epi64(q23, 1));
  // Sums of the nibbles per block: psadbw gives 2 per 16 bytes, so 4 per block.
  __m512i t = _mm512_add_epi64(_mm512_sad_epu8(lo, _mm512_setzero_si512()), _mm512_sad_epu8(hi, _mm512_setzero_si512()));
  t = _mm512_add_epi64(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));  // 64-bit lanes 0, 2, 4, 6
  const __m128i sums = _mm256_castsi256_si128(_mm512_cvtepi64_epi32(_mm512_maskz_compress_epi64(0x55, t)));
  const __m128i bias4 = _mm_mullo_epi32(_mm_sub_epi32(sums, _mm_set1_epi32(8 * 32)), _mm_set1_epi32(-128));
  const __m128 scale4 = _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(a, idx.d, b)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(bias + 4 * quad), bias4);
  _mm_storeu_ps(out.scale + 4 * quad, scale4);
}

}  // namespace

bool unpack_int8_row_fast(GgmlType type, const void* row, int64_t cols, const Int8Row& out, int64_t block_stride,
                          int32_t* bias) {
  const auto* src = static_cast<const uint8_t*>(row);
  // 32-element block i of the row goes to out.q + i * block_stride; the weights are made
  // unsigned (u = q + zero) first, and their sums taken there for the bias.
  auto store32 = [&](int64_t i, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q + i * block_stride), v); };
  auto bias32 = [&](int64_t i, __m256i u, int zero) {  // group 32: bias = -128 * sum(q)
    int32_t lo, hi;
    half_sums_u8(u, &lo, &hi);
    bias[i] = -128 * (lo + hi - 32 * zero);
  };
  auto bias16 = [&](int64_t i, __m256i u, int zero) {  // group 16: the block's two groups
    int32_t lo, hi;
    half_sums_u8(u, &lo, &hi);
    bias[2 * i] = -128 * (lo - 16 * zero);
    bias[2 * i + 1] = -128 * (hi - 16 * zero);
  };
  const __m256i nib = _mm256_set1_epi8(0x0F);
  switch (type) {
    case GgmlType::Q4_0: {
      static const Q4_0Quad idx;
      int64_t b = 0;
      for (; b + 4 <= cols / 32; b += 4) unpack_q4_0_quad(idx, src, b / 4, out, block_stride, bias);
      const __m256i eight = _mm256_set1_epi8(8);
      for (; b < cols / 32; ++b) {  // the last 1..3 blocks
        const uint8_t* blk = src + b * sizeof(BlockQ4_0);
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
        const __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), nib);
        store32(b, _mm256_sub_epi8(u, eight));
        bias32(b, u, 8);
        uint16_t d;
        std::memcpy(&d, blk, 2);
        out.scale[b] = _cvtsh_ss(d);
      }
      return true;
    }
    case GgmlType::Q8_0: {
      const __m256i flip = _mm256_set1_epi8(char(0x80));
      for (int64_t b = 0; b < cols / 32; ++b) {
        const uint8_t* blk = src + b * sizeof(BlockQ8_0);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        store32(b, q);
        bias32(b, _mm256_xor_si256(q, flip), 128);
        uint16_t d;
        std::memcpy(&d, blk, 2);
        out.scale[b] = _cvtsh_ss(d);
      }
      return true;
    }
    case GgmlType::Q4_K: {
      for (int64_t b = 0; b < cols / 256; ++b) {
        // Read in place: a copy of the block on the stack made every load below wait for
        // store forwarding across two stores.
        const uint8_t* blk = src + b * sizeof(BlockQ4_K);
        for (int g = 0; g < 4; ++g) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ4_K, qs) + 32 * g));
          const __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
          store32(8 * b + 2 * g, lo);
          store32(8 * b + 2 * g + 1, hi);
          bias32(8 * b + 2 * g, lo, 0);
          bias32(8 * b + 2 * g + 1, hi, 0);
        }
        uint16_t d, dmin;
        std::memcpy(&d, blk + offsetof(BlockQ4_K, d), 2);
        std::memcpy(&dmin, blk + offsetof(BlockQ4_K, dmin), 2);
        // Lanes 0..7: d * scale_j; lanes 8..15: -dmin * min_j.
        const __m512 dd = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(_cvtsh_ss(d)), _mm512_set1_ps(-_cvtsh_ss(dmin)));
        const __m512 maps = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4k_scales_mins(blk + offsetof(BlockQ4_K, scales)))), dd);
        _mm256_storeu_ps(out.scale + 8 * b, _mm512_castps512_ps256(maps));
        _mm256_storeu_ps(out.offset + 8 * b, _mm512_extractf32x8_ps(maps, 1));
      }
      return true;
    }
    case GgmlType::Q6_K: {
      const __m512i nib512 = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30), zero = _mm512_set1_epi8(32);
      const __m512i shift_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
      const __m512i shift_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
      auto store64 = [&](int64_t i, __m512i u) {  // two blocks of u = q + 32
        const __m512i q = _mm512_sub_epi8(u, zero);
        store32(i, _mm512_castsi512_si256(q));
        store32(i + 1, _mm512_extracti64x4_epi64(q, 1));
        bias16(i, _mm512_castsi512_si256(u), 32);
        bias16(i + 1, _mm512_extracti64x4_epi64(u, 1), 32);
      };
      for (int64_t b = 0; b < cols / 256; ++b) {
        const uint8_t* blk = src + b * sizeof(BlockQ6_K);
        for (int half = 0; half < 2; ++half) {
          const __m512i ql = _mm512_loadu_si512(blk + 64 * half);
          const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * half)));
          // Elements 0..63 of the half: low nibbles, top bits 0-1 (first 32) and 2-3 (next 32).
          const __m512i hl = _mm512_and_si512(_mm512_sllv_epi16(qh, shift_lo), top);
          // Elements 64..127: high nibbles, top bits 4-5 and 6-7.
          const __m512i hh = _mm512_and_si512(_mm512_srlv_epi16(qh, shift_hi), top);
          store64(8 * b + 4 * half, _mm512_or_si512(_mm512_and_si512(ql, nib512), hl));
          store64(8 * b + 4 * half + 2, _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nib512), hh));
        }
        uint16_t dh;
        std::memcpy(&dh, blk + 208, 2);
        const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
        _mm512_storeu_ps(out.scale + 16 * b,
                         _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scales)), _mm512_set1_ps(_cvtsh_ss(dh))));
      }
      return true;
    }
    default:
      return false;
  }
}

// ---- results of a tile: 8 rows x 16 tokens, transposed to the output rows -------------------

void store_rows8(const float* acc, int n_tokens, float* y, int64_t y_stride) {
  __m512 a[8];
  for (int r = 0; r < 8; ++r) a[r] = _mm512_loadu_ps(acc + 16 * r);
  // Within each 128-bit lane L (tokens 4L..4L+3): pairs of rows, then quads of rows.
  __m512 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);      // r, r+1 of tokens 4L, 4L+1
    t[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);  // of tokens 4L+2, 4L+3
  }
  __m512 u[4], v[4];  // u[j] / v[j], lane L: rows 0..3 / 4..7 of token 4L + j
  for (int h = 0; h < 2; ++h) {
    __m512* out = h == 0 ? u : v;
    const __m512 p = t[4 * h], q = t[4 * h + 1], r = t[4 * h + 2], s = t[4 * h + 3];
    out[0] = _mm512_shuffle_ps(p, r, _MM_SHUFFLE(1, 0, 1, 0));
    out[1] = _mm512_shuffle_ps(p, r, _MM_SHUFFLE(3, 2, 3, 2));
    out[2] = _mm512_shuffle_ps(q, s, _MM_SHUFFLE(1, 0, 1, 0));
    out[3] = _mm512_shuffle_ps(q, s, _MM_SHUFFLE(3, 2, 3, 2));
  }
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int j = 0; j < 4; ++j) {
    const __m512 z0 = _mm512_permutex2var_ps(u[j], first, v[j]);   // tokens j, 4 + j
    const __m512 z1 = _mm512_permutex2var_ps(u[j], second, v[j]);  // tokens 8 + j, 12 + j
    const __m256 rows[4] = {_mm512_castps512_ps256(z0), _mm512_extractf32x8_ps(z0, 1), _mm512_castps512_ps256(z1),
                            _mm512_extractf32x8_ps(z1, 1)};
    for (int k = 0; k < 4; ++k) {
      const int tok = j + 4 * k;
      if (tok < n_tokens) _mm256_storeu_ps(y + tok * y_stride, rows[k]);
    }
  }
}

}  // namespace kiln::cpu::avx512
