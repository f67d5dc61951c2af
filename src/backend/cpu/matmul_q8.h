#pragma once
// The activation side of the int8 matmul paths: x quantized to ggml's q8 block formats,
// byte for byte as ggml's reference quantizers (and kiln's, quant/legacy.cpp and
// quant/kquants_quantize.cpp) write them, so that kiln's int8 products differ from
// llama.cpp's only by float summation order. Which format goes with which weight type is
// ggml's "vec_dot_type":
//   q8_0 (32-blocks, f16 d = max|x| / 127, q = round(x / d) halves away from zero):
//        q4_0 q5_0 q8_0 iq4_nl — the dot uses the f16-rounded d;
//   q8_1 (q8_0 plus the f16 s = d * sum(q), d before rounding): q4_1 q5_1 — the weights'
//        min term uses s;
//   q8_K (256-blocks, f32 d = -max / 127 for the signed value of largest magnitude, q
//        rounded to nearest even, capped at 127, bsums per 16): q2_K..q6_K iq4_xs.
// The kernels read the blocks through Q8View, one 32-element block at a time.
#include <cstdint>

#include "core/half.h"
#include "quant/blocks.h"
#include "quant/types.h"

namespace kiln::cpu {

// One 32-element block of quantized activations: x ~ dx * q. `sum_lo` / `sum_hi` are the
// sums of q over elements 0..15 / 16..31, `dx_sum` the scaled sum the weights' min (offset)
// term is multiplied with: s for q8_1, dx * (sum_lo + sum_hi) otherwise.
struct Q8View {
  const int8_t* q;
  float dx;
  int32_t sum_lo, sum_hi;
  float dx_sum;
};

inline int32_t sum_q(const int8_t* q, int n) {
  int32_t s = 0;
  for (int i = 0; i < n; ++i) s += q[i];
  return s;
}

// Block b (of 32 elements) of a row of `act` blocks (Q8_0, Q8_1 or Q8_K).
inline Q8View q8_view(GgmlType act, const void* blocks, int64_t b) {
  Q8View v{};
  if (act == GgmlType::Q8_K) {
    const auto& blk = static_cast<const BlockQ8_K*>(blocks)[b / 8];
    const int part = int(b % 8);
    v.q = blk.qs + 32 * part;
    v.dx = blk.d;
    v.sum_lo = blk.bsums[2 * part];
    v.sum_hi = blk.bsums[2 * part + 1];
    v.dx_sum = blk.d * float(v.sum_lo + v.sum_hi);
  } else if (act == GgmlType::Q8_1) {
    const auto& blk = static_cast<const BlockQ8_1*>(blocks)[b];
    v.q = blk.qs;
    v.dx = f16_to_f32(blk.d);
    v.sum_lo = sum_q(blk.qs, 16);
    v.sum_hi = sum_q(blk.qs + 16, 16);
    v.dx_sum = f16_to_f32(blk.s);
  } else {
    const auto& blk = static_cast<const BlockQ8_0*>(blocks)[b];
    v.q = blk.qs;
    v.dx = f16_to_f32(blk.d);
    v.sum_lo = sum_q(blk.qs, 16);
    v.sum_hi = sum_q(blk.qs + 16, 16);
    v.dx_sum = v.dx * float(v.sum_lo + v.sum_hi);
  }
  return v;
}

}  // namespace kiln::cpu
