#pragma once
// Small fused ops of the forward pass on the device: RMS norm (with the residual add fused
// in), rotary position embedding, gated activations (silu * up, ...), per-row argmax. The
// embedding gather is get_rows() in dequant.h. All take explicit strides (in elements) and a
// stream, write into outputs passed in, and return a Status.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/status.h"

namespace kiln::cuda {

// Per row: y = x / sqrt(mean(x^2) + eps) * weight. With `residual`: first residual += x, then
// the normalized residual is written to y. weight may be null (no scale). y may alias x.
struct RmsNormArgs {
  const float* x = nullptr;
  int64_t x_stride = 0;
  float* residual = nullptr;  // optional, updated in place
  int64_t residual_stride = 0;
  const float* weight = nullptr;  // [dim] or null
  float eps = 1e-6f;
  int64_t rows = 0, dim = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  // Optional: also writes y's int8 copy for a following matvec (matvec.h's Q8Vector of row r
  // at q8 + r * q8_row_bytes, the bytes quantize_q8 would write). dim % 32 == 0.
  uint8_t* q8 = nullptr;
  int64_t q8_row_bytes = 0;
  // Optional (prefill): also writes y rounded to f16 (bf16 with y_half_bf16) as packed rows of
  // dim at y_half, 256-byte aligned: the next product's x_half (gemm.h). Only where
  // rmsnorm_writes_half says the row kernels run.
  void* y_half = nullptr;
  bool y_half_bf16 = false;
};
Status rmsnorm(const RmsNormArgs& args, cudaStream_t stream);
// Whether rmsnorm can write y's half copy for these arguments (many rows of a width the
// vectorized row kernel takes, no int8 copy).
bool rmsnorm_writes_half(const RmsNormArgs& args);

// Rotates, in place, the first n_rot dims of every head of x [tokens][heads][head_dim] by the
// token's position (the formulation of backend/cpu/ops_attention.cpp, YaRN included; angles
// in double precision, as there). Normal style pairs (2i, 2i+1); neox pairs (i, i + n_rot/2).
struct RopeArgs {
  float* x = nullptr;
  int64_t token_stride = 0, head_stride = 0;  // elements
  int64_t n_tokens = 0, n_heads = 0, head_dim = 0;
  const int32_t* positions = nullptr;  // [n_tokens], device
  int n_rot = 0;                       // even, <= head_dim, <= 1024
  bool neox = false;
  float freq_base = 10000.0f, freq_scale = 1.0f;
  const float* freq_factors = nullptr;  // [n_rot / 2] or null: theta_i /= freq_factors[i]
  // YaRN (ext_factor 0: off).
  float ext_factor = 0.0f, attn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f;
  int n_ctx_orig = 0;
  bool yarn_truncate = true;  // round the correction dims to whole dims (ggml, HF); gpt-oss: false
};
Status rope(const RopeArgs& args, cudaStream_t stream);

enum class GluKind : uint8_t {
  Silu,       // silu(gate) * up
  GeluTanh,   // gelu_tanh(gate) * up
  SwigluOai,  // gpt-oss: min(gate, limit) * sigmoid(alpha * that) * (clamp(up, -limit, limit) + 1)
};
// out = act(gate) * up elementwise over rows x n. out may alias gate or up.
struct GluArgs {
  GluKind kind = GluKind::Silu;
  const float* gate = nullptr;
  int64_t gate_stride = 0;
  const float* up = nullptr;
  int64_t up_stride = 0;
  int64_t rows = 0, n = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  float alpha = 1.702f, limit = 7.0f;  // SwigluOai only
  // Optional, as RmsNormArgs::q8: out's int8 copy for the down projection (glu_can_quantize).
  uint8_t* q8 = nullptr;
  int64_t q8_row_bytes = 0;
};
// Whether glu() can write the int8 copy too: n % 128 == 0 and 16-byte aligned rows.
bool glu_can_quantize(const GluArgs& args);
Status glu(const GluArgs& args, cudaStream_t stream);

// out[r] = index of the largest element of row r (the first one among equals; NaNs are
// skipped, an all-NaN row gives 0). Two passes: pieces of each row in parallel, then the
// pieces; `scratch` holds the pieces' results (argmax_scratch_bytes). With `host_out` (mapped
// host memory, step_io.h), the indexes are written there too, visible to the host once the
// kernel is done: a greedy step's download without a kernel of its own.
size_t argmax_scratch_bytes(int64_t rows, int64_t n);
Status argmax_rows(const float* x, int64_t x_stride, int64_t rows, int64_t n, int32_t* out, void* scratch,
                   size_t scratch_bytes, cudaStream_t stream, int32_t* host_out = nullptr);

}  // namespace kiln::cuda
