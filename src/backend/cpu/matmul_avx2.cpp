// AVX2 + FMA + F16C kernels for matmul: float dot products (decode), int8 decode of q4_0 and
// q8_0 (maddubs, activations quantized once per call), and the float panel (prefill of
// weights dequantized to f32, 8 token lanes). Compiled with -mavx2 -mfma -mf16c: call only
// when cpu_features().avx2.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "core/half.h"

namespace kiln::cpu::avx2 {
namespace {

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

float dot_f16(const void* w, const float* x, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(w);
  auto load = [&](int64_t at) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + at))); };
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(load(i + 8), _mm256_loadu_ps(x + i + 8), s1);
    s2 = _mm256_fmadd_ps(load(i + 16), _mm256_loadu_ps(x + i + 16), s2);
    s3 = _mm256_fmadd_ps(load(i + 24), _mm256_loadu_ps(x + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(x + i), s0);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) sum += f16_to_f32(h[i]) * x[i];
  return sum;
}

float dot_bf16(const void* w, const float* x, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(w);
  auto load = [&](int64_t at) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + at)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  };
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(load(i + 8), _mm256_loadu_ps(x + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(x + i), s0);
  float sum = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) sum += bf16_to_f32(h[i]) * x[i];
  return sum;
}

namespace {
template <int R>
void panel_f32_rows(const float* w, int64_t ws, int64_t k_len, const float* panel, float* acc, bool accumulate) {
  __m256 a[R];
  for (int r = 0; r < R; ++r) a[r] = accumulate ? _mm256_loadu_ps(acc + 8 * r) : _mm256_setzero_ps();
  for (int64_t k = 0; k < k_len; ++k) {
    const __m256 xv = _mm256_load_ps(panel + 8 * k);
    for (int r = 0; r < R; ++r) a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + r * ws + k), xv, a[r]);
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc + 8 * r, a[r]);
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

// ---- int8 decode (q4_0, q8_0) -------------------------------------------------------------

namespace {

// roundf for every lane: truncate, then step away from zero when the dropped fraction is
// at least one half (v - trunc(v) is exact in f32).
inline __m256i round_half_away(__m256 v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 step = _mm256_and_ps(up, _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, sign)));
  return _mm256_cvttps_epi32(_mm256_add_ps(t, step));
}

}  // namespace

void prepare_q8_token(const float* x, int64_t cols, Q8Token& out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + 32 * b;
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 32; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const float d = amax / 127;  // as ggml's q8_0: x * (1 / d), not x * (127 / amax)
    const __m256 id = _mm256_set1_ps(d != 0 ? 1.0f / d : 0.0f);
    int32_t sum = 0;
    for (int j = 0; j < 32; j += 8) {
      alignas(32) int32_t q[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(q), round_half_away(_mm256_mul_ps(_mm256_loadu_ps(xb + j), id)));
      for (int l = 0; l < 8; ++l) {
        out.q[32 * b + j + l] = int8_t(q[l]);
        sum += q[l];
      }
    }
    out.dx[b] = f16_to_f32(f32_to_f16(d));  // the dot uses the scale as q8_0 stores it
    out.sum[b] = sum;
  }
}

namespace {

// u8 x s8 products of 32 bytes summed into 8 f32 lanes: maddubs adds pairs into int16 with
// saturation, which never triggers here (|w| <= 128, |x| <= 127: 2 * 128 * 127 = 32512).
inline __m256 dot_u8_s8(__m256i w_u8, __m256i x_s8) {
  const __m256i pairs = _mm256_maddubs_epi16(w_u8, x_s8);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

template <typename Block>
void decode_rows(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const Q8Token* tokens, int n_tokens,
                 float* y, int64_t y_stride, Block block) {
  const int64_t n_blocks = int64_t(row_bytes) / block.bytes;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + size_t(r) * row_bytes;
    for (int t = 0; t < n_tokens; ++t) {
      const Q8Token& tk = tokens[t];
      __m256 acc = _mm256_setzero_ps();
      float zero_point = 0;  // sum over blocks of d_w * dx * sum(x), times the weights' zero point
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* blk = row + b * block.bytes;
        _mm_prefetch(reinterpret_cast<const char*>(blk) + 4096, _MM_HINT_T0);  // weights stream from memory
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tk.q + 32 * b));
        uint16_t dh;
        std::memcpy(&dh, blk, 2);
        const float s = _cvtsh_ss(dh) * tk.dx[b];
        acc = _mm256_fmadd_ps(block.dot(blk, x), _mm256_set1_ps(s), acc);
        zero_point += s * float(tk.sum[b]);
      }
      y[t * y_stride + r] = hsum(acc) - block.zero_point * zero_point;
    }
  }
}

struct Q4_0Block {
  int bytes = 18;
  float zero_point = 8;
  __m256i dot_mask = _mm256_set1_epi8(0x0F);
  __m256 dot(const uint8_t* blk, __m256i x) const {  // nibbles 0..15: elements j and j + 16
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), dot_mask);
    return dot_u8_s8(q, x);
  }
};

struct Q8_0Block {
  int bytes = 34;
  float zero_point = 0;
  __m256 dot(const uint8_t* blk, __m256i x) const {  // |w| . (x with w's sign)
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    return dot_u8_s8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
  }
};

}  // namespace

void decode_q4_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const Q8Token* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  decode_rows(w, row_bytes, r0, r1, tokens, n_tokens, y, y_stride, Q4_0Block{});
}

void decode_q8_0(const uint8_t* w, size_t row_bytes, int64_t r0, int64_t r1, const Q8Token* tokens, int n_tokens,
                 float* y, int64_t y_stride) {
  decode_rows(w, row_bytes, r0, r1, tokens, n_tokens, y, y_stride, Q8_0Block{});
}

// ---- float panels ---------------------------------------------------------------------------

void transpose_tokens_f32(const float* x, int64_t x_stride, int n_tokens, int64_t cols, float* panel) {
  for (int64_t k = 0; k < cols; ++k) {
    float* p = panel + 8 * k;
    int t = 0;
    for (; t < n_tokens; ++t) p[t] = x[t * x_stride + k];
    for (; t < 8; ++t) p[t] = 0;
  }
}

}  // namespace kiln::cpu::avx2
