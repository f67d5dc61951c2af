#include "backend/cuda/router_transpose.h"

#include <string>

namespace kiln::cuda {
namespace {

// One thread an element of out (made once per router: no care for speed).
__global__ void transpose_router_kernel(const float* router, int64_t stride, int64_t n_expert, int64_t n_embd,
                                        float* out) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n_expert * n_embd) return;
  const int64_t i = k / n_expert, e = k % n_expert;
  out[k] = router[e * stride + i];
}

}  // namespace

Status transpose_router(const float* router, int64_t stride, int64_t n_expert, int64_t n_embd, float* out,
                        cudaStream_t stream) {
  if (!router || !out || n_expert <= 0 || n_embd <= 0 || stride < n_embd)
    return Status::invalid("transpose_router: " + std::to_string(n_expert) + " rows of " + std::to_string(n_embd) +
                           " (stride " + std::to_string(stride) + ") do not make a router");
  constexpr int kThreads = 256;
  const int64_t n = n_expert * n_embd;
  transpose_router_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(router, stride, n_expert,
                                                                                          n_embd, out);
  return launch_status("transpose_router_kernel");
}

}  // namespace kiln::cuda
