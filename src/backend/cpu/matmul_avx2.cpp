// AVX2 + FMA + F16C kernels for matmul: float dot products (decode) and the float panel
// (prefill of weights dequantized to f32, 8 token lanes). Compiled with -mavx2 -mfma
// -mf16c: call only when cpu_features().avx2.
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

void transpose_tokens_f32(const float* x, int64_t x_stride, int n_tokens, int64_t cols, float* panel) {
  for (int64_t k = 0; k < cols; ++k) {
    float* p = panel + 8 * k;
    int t = 0;
    for (; t < n_tokens; ++t) p[t] = x[t * x_stride + k];
    for (; t < 8; ++t) p[t] = 0;
  }
}

}  // namespace kiln::cpu::avx2
