#pragma once
// The MoE router transposed for the router sums of an attention output product
// (matvec_grouped.h's RouterSums): out[i][e] = router[e][i], so that the lanes of a warp that
// add column i's terms of 32 experts read 128 bytes in a run.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/status.h"

namespace kiln::cuda {

// router: n_expert rows of n_embd f32 (row stride `stride` floats); out: n_embd rows of n_expert.
Status transpose_router(const float* router, int64_t stride, int64_t n_expert, int64_t n_embd, float* out,
                        cudaStream_t stream);

}  // namespace kiln::cuda
