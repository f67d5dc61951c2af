#pragma once
// The gated activation of a prefill FFN written straight in the half type that the down
// product reads (f16 for f16 weights, bf16 for the others), for gemm() to take as its
// rounded X (GemmArgs::x_half):
//
//   out[r][i] = round_half(glu(gate[r][i], up[r][i]))      (glu as glu(), glu_math.cuh)
//
// The same bits as glu() followed by gemm()'s own rounding of its f32 X, without writing the
// f32 activation and reading it back (Llama-3-8B at T = 512: 29 MB written and read again,
// ~10 us per layer on an H200). gate, up f32 rows of n (strided); out packed rows of n halves.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/ops.h"
#include "backend/cuda/status.h"

namespace kiln::cuda {

struct GluHalfArgs {
  GluKind kind = GluKind::Silu;
  const float* gate = nullptr;
  int64_t gate_stride = 0;  // elements
  const float* up = nullptr;
  int64_t up_stride = 0;
  int64_t rows = 0, n = 0;
  void* out = nullptr;      // rows of n f16 / bf16 values, row r at r * n
  bool bf16 = false;        // the output type: bf16, else f16
  float alpha = 1.702f, limit = 7.0f;  // SwigluOai only
};

Status glu_to_half(const GluHalfArgs& args, cudaStream_t stream);

}  // namespace kiln::cuda
