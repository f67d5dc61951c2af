// AVX-512 activation quantizers of the int8 matmul paths (formats in matmul_q8.h), and the
// two kernel layouts built from their blocks: DecodeToken (decode) and Int8PanelBlock
// (prefill). The quantizers write the same bytes as the scalar references in quant/: the
// same f32 operations in the same order (d = amax / 127 and id = 1 / d for q8_0, not
// 127 / amax), and the same rounding (halves away from zero for q8_0 / q8_1, to even for q8_K).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/avx512_common.h"
#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/matmul_q8.h"
#include "core/half.h"
#include "quant/blocks.h"

namespace kiln::cpu::avx512 {
namespace {

// roundf for every lane: truncate, then step away from zero when the dropped fraction is
// at least one half (v - trunc(v) is exact in f32).
inline __m512i round_half_away(__m512 v) {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 step = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));
  return _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, step));
}

// One q8_0 block's levels: returns the f32 d (before f16 rounding) and the sum of q.
inline float q8_levels32(const float* x, int8_t* q, int32_t* sum) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float d = amax / 127;
  const __m512 id = _mm512_set1_ps(d != 0 ? 1.0f / d : 0.0f);
  const __m512i qa = round_half_away(_mm512_mul_ps(a, id)), qb = round_half_away(_mm512_mul_ps(b, id));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  return d;
}

void quantize_q8_K_block(const float* x, BlockQ8_K& y) {
  __m512 m = _mm512_setzero_ps();
  for (int i = 0; i < 256; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  const float amax = _mm512_reduce_max_ps(m);
  if (!(amax > 0)) {
    std::memset(&y, 0, sizeof(y));
    return;
  }
  // The first element of largest magnitude gives the sign of the scale.
  float max = 0;
  for (int i = 0; i < 256; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + i)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
    if (hit) {
      max = x[i + __builtin_ctz(hit)];
      break;
    }
  }
  const float iscale = -127.f / max;
  const __m512 is = _mm512_set1_ps(iscale);
  for (int j = 0; j < 16; ++j) {  // 16 elements = one bsum
    // cvtps rounds to nearest even, as the reference's 1.5 * 2^23 trick does.
    const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * j), is)),
                                       _mm512_set1_epi32(127));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y.qs + 16 * j), _mm512_cvtepi32_epi8(q));
    y.bsums[j] = int16_t(_mm512_reduce_add_epi32(q));
  }
  y.d = 1 / iscale;
}

}  // namespace

void quantize_activations(GgmlType act, const float* x, int64_t cols, void* blocks) {
  if (act == GgmlType::Q8_K) {
    auto* out = static_cast<BlockQ8_K*>(blocks);
    for (int64_t b = 0; b < cols / 256; ++b) quantize_q8_K_block(x + 256 * b, out[b]);
  } else if (act == GgmlType::Q8_1) {
    auto* out = static_cast<BlockQ8_1*>(blocks);
    for (int64_t b = 0; b < cols / 32; ++b) {
      int32_t sum;
      const float d = q8_levels32(x + 32 * b, out[b].qs, &sum);
      out[b].d = f32_to_f16(d);
      out[b].s = f32_to_f16(float(sum) * d);
    }
  } else {
    auto* out = static_cast<BlockQ8_0*>(blocks);
    for (int64_t b = 0; b < cols / 32; ++b) {
      int32_t sum;
      out[b].d = f32_to_f16(q8_levels32(x + 32 * b, out[b].qs, &sum));
    }
  }
}

void prepare_decode_token(const void* blocks, GgmlType act, const float* x, int64_t cols, int bias_shift,
                          DecodeToken& out) {
  out.x = x;
  out.act = act;
  out.blocks = blocks;
  out.n_quads = cols / 128;
  for (int64_t qd = 0; qd < out.n_quads; ++qd) {
    for (int i = 0; i < 4; ++i) {
      const Q8View v = q8_view(act, blocks, 4 * qd + i);
      std::memcpy(out.q + 128 * qd + 16 * i, v.q, 16);
      std::memcpy(out.q + 128 * qd + 64 + 16 * i, v.q + 16, 16);
      for (int l = 0; l < 4; ++l) {
        const int64_t lane = 16 * qd + 4 * i + l;
        out.bias[lane] = -(v.sum_lo + v.sum_hi) * (1 << bias_shift);
        out.bias_lo[lane] = -v.sum_lo * 8;
        out.bias_hi[lane] = -v.sum_hi * 8;
        out.dx[lane] = v.dx;
        out.neg_dx_sum[lane] = -v.dx_sum * 0.25f;
      }
    }
  }
}

void prepare_int8_panel(const void* const* token_blocks, GgmlType act, int n_tokens, int64_t cols,
                        Int8PanelBlock* panel) {
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  // u[c][4t + e] = q[t][4c + e] + 128: token t's block is 8 dwords, scattered to dword t of
  // each of the 8 rows u[c] (a 16 x 8 dword transpose, done as 8 scatters of 8 dwords).
  const __m256i rows = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
  for (int64_t b = 0; b < cols / 32; ++b) {
    Int8PanelBlock& p = panel[b];
    for (int t = 0; t < 16; ++t) {
      if (t >= n_tokens) {
        for (int c = 0; c < 8; ++c) std::memset(&p.u[c][4 * t], 0x80, 4);
        p.dx[t] = p.dx_sum_lo[t] = p.dx_sum_hi[t] = p.dx_sum_all[t] = 0;
        continue;
      }
      const Q8View v = q8_view(act, token_blocks[t], b);
      const __m256i q = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v.q)),
                                         _mm512_castsi512_si256(flip));
      _mm256_i32scatter_epi32(reinterpret_cast<int32_t*>(&p.u[0][0]) + t, rows, q, 4);
      p.dx[t] = v.dx;
      p.dx_sum_lo[t] = v.dx * float(v.sum_lo);
      p.dx_sum_hi[t] = v.dx * float(v.sum_hi);
      p.dx_sum_all[t] = v.dx_sum;
    }
  }
}

}  // namespace kiln::cpu::avx512
