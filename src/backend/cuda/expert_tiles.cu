// The row-tile layout of stacked q4_K / q6_K expert matrices (see expert_tiles.h): the
// permuting kernel.
#include "backend/cuda/expert_tiles.h"

#include <algorithm>

#include "backend/cuda/common.cuh"

namespace kiln::cuda {
namespace {

// One thread per group of the source (one expert's rows): its words, and for q6_K its d, to
// their places. q4_K groups start 16-byte aligned; q6_K groups on even bytes, read as halves.
__global__ void tile_experts_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t rows,
                                    int64_t groups, bool q6_k) {
  const int64_t total = rows * groups;
  const int group_bytes = q6_k ? 210 : 144, words = q6_k ? 13 : 9;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / groups, group = i % groups;
    const auto* from = reinterpret_cast<const uint16_t*>(src + i * group_bytes);
    for (int k = 0; k < words; ++k) {
      uint32_t w[4];
      for (int e = 0; e < 4; ++e) w[e] = from[8 * k + 2 * e] | uint32_t(from[8 * k + 2 * e + 1]) << 16;
      *reinterpret_cast<uint4*>(dst + expert_tile_word_byte(row, group, k, groups, group_bytes)) =
          make_uint4(w[0], w[1], w[2], w[3]);
    }
    if (q6_k) *reinterpret_cast<uint16_t*>(dst + expert_tile_q6_k_d_byte(row, group, groups)) = from[8 * 13];
  }
}

}  // namespace

Status tile_experts_in_place(GgmlType type, void* data, int64_t n_expert, int64_t rows, int64_t cols,
                             cudaStream_t stream) {
  if (!expert_tiles_fit(type, rows, cols) || n_expert <= 0)
    return Status::invalid("tile_experts_in_place: only q4_K / q6_K experts of whole 256-weight groups and a "
                           "multiple of 32 rows");
  const int64_t groups = cols / kExpertTileGroupWeights;
  const size_t expert_bytes = size_t(rows * groups * expert_tile_group_bytes(type));
  void* copy = nullptr;
  if (cudaError_t e = cudaMalloc(&copy, expert_bytes); e != cudaSuccess)
    return Status::from_cuda(e, "cudaMalloc (expert tiles copy)");
  cudaError_t e = cudaSuccess;
  const int blocks = int(std::min<int64_t>((rows * groups + 255) / 256, 65536));
  for (int64_t x = 0; x < n_expert && e == cudaSuccess; ++x) {
    auto* expert = static_cast<uint8_t*>(data) + size_t(x) * expert_bytes;
    e = cudaMemcpyAsync(copy, expert, expert_bytes, cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) break;
    tile_experts_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint8_t*>(copy), expert, rows, groups,
                                                    type == GgmlType::Q6_K);
    e = cudaGetLastError();
  }
  const cudaError_t synced = cudaStreamSynchronize(stream);
  cudaFree(copy);
  if (e == cudaSuccess) e = synced;
  return Status::from_cuda(e, "tile_experts_kernel");
}

}  // namespace kiln::cuda
