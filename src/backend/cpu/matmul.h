#pragma once
// Matrix products against weights of any ggml type, read in their block layout.
//
//   y[t][o] = sum_i W[o][i] * x[t][i]      t < n_tokens, o < rows, i < cols
//
// W: `rows` rows of `cols` elements of `type`, row r at (uint8_t*)w + r * w_row_bytes.
// x: n_tokens rows of `cols` f32, row t at x + t * x_stride.
// y: n_tokens rows of `rows` f32, row t at y + t * y_stride.
// Work is split over `pool`. Integer weight types may quantize x internally to the q8
// format ggml uses for them (activation_type(); same bytes as ggml) — results then agree
// with matmul_reference to ~1e-2 relative, and with ggml's to float summation order;
// f32 / f16 / bf16 weights keep x in f32.
#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"
#include "quant/types.h"

namespace kiln::cpu {

struct MatmulArgs {
  GgmlType type;
  const void* w;
  size_t w_row_bytes;
  int64_t rows, cols;
  const float* x;
  int64_t x_stride;
  int64_t n_tokens;
  float* y;
  int64_t y_stride;
};

// The fast path: SIMD, multi-threaded, using the best instruction set the processor has
// (capped by KILN_SIMD=scalar|avx2).
void matmul(const MatmulArgs& args, ThreadPool& pool);

// Instruction-set levels of the fast path, for tests and benchmarks that compare them.
enum class SimdLevel { Scalar, Avx2, Avx512 };

// The fast path at most at `level` (lowered further to what the processor supports).
void matmul(const MatmulArgs& args, ThreadPool& pool, SimdLevel level);

// The level matmul(args, pool) uses on this processor.
SimdLevel best_simd_level();

// The format the int8 paths quantize activations to for `weight_type`, as ggml's
// vec_dot_type: Q8_0 (q4_0 q5_0 q8_0 iq4_nl), Q8_1 (q4_1 q5_1), Q8_K (q2_K..q6_K iq4_xs);
// F32 for the types whose activations stay in f32.
GgmlType activation_type(GgmlType weight_type);

// Whether matmul at `level` quantizes the activations to int8 (per block of 32) for this
// weight type and token count (to activation_type(type)) — then results differ from
// matmul_reference by the quantization error of x; otherwise only by f32 rounding.
bool quantizes_activations(GgmlType type, int64_t n_tokens, SimdLevel level);

// The definition: each weight row dequantized with the scalar reference, dot products in
// double precision. Single-threaded and slow; tests compare against it.
void matmul_reference(const MatmulArgs& args);

}  // namespace kiln::cpu
