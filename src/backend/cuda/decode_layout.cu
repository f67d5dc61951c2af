// The warp-interleaved layout of q4_0 / q8_0 / q4_K / q6_K weights (see decode_layout.h): the
// permuting kernels and the registry of matrices in the layout.
#include "backend/cuda/decode_layout.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "backend/cuda/common.cuh"

namespace kiln::cuda {
namespace {

constexpr int64_t kGroupWeights = 256;

// Bytes of a group of 256 weights: 144 (q4_0, q4_K), 272 (q8_0), 210 (q6_K).
int64_t group_bytes(GgmlType type) {
  return int64_t(traits(type).type_size) * (kGroupWeights / int64_t(traits(type).block_size));
}

// One thread per 16-byte word of the source: its row, group and word within the group give
// its place in the layout.
__global__ void interleave_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t rows,
                                  int64_t groups, int words_per_group) {
  const int64_t row_words = groups * words_per_group;
  const int64_t total = rows * row_words;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_words, in_row = i % row_words;
    dst[interleaved_word(row, in_row / words_per_group, int(in_row % words_per_group), groups, words_per_group)] =
        src[i];
  }
}

// q6_K: one thread per group of the source (210 bytes at an even offset): its 13 words and
// its d to their places in the tile (decode_layout.h).
__global__ void interleave_q6_k_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t rows,
                                       int64_t groups) {
  const int64_t total = rows * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / groups, group = i % groups;
    const auto* from = reinterpret_cast<const uint16_t*>(src + i * kQ6KGroupBytes);
    for (int k = 0; k < kQ6KLayoutWords; ++k) {
      uint16_t h[8];
      for (int e = 0; e < 8; ++e) h[e] = from[8 * k + e];
      uint4 word;
      word.x = h[0] | uint32_t(h[1]) << 16, word.y = h[2] | uint32_t(h[3]) << 16;
      word.z = h[4] | uint32_t(h[5]) << 16, word.w = h[6] | uint32_t(h[7]) << 16;
      reinterpret_cast<uint4*>(dst)[interleaved_q6_k_word(row, group, k, groups)] = word;
    }
    *reinterpret_cast<uint16_t*>(dst + interleaved_q6_k_d_byte(row, group, groups)) = from[8 * kQ6KLayoutWords];
  }
}

std::mutex g_matrices_mutex;
std::map<const uint8_t*, size_t> g_matrices;  // first byte -> size

}  // namespace

bool interleavable(GgmlType type, int64_t rows, int64_t cols) {
  if (!interleaved_type(type)) return false;
  if (cols <= 0 || cols % kGroupWeights != 0 || rows <= 0) return false;
  if (type == GgmlType::Q6_K && (cols / kGroupWeights) % 8 != 0) return false;  // tiles of whole words
  return rows % interleave_tile_rows(cols / kGroupWeights) == 0;
}

Status interleave_in_place(GgmlType type, void* w, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (!interleavable(type, rows, cols))
    return Status::invalid("interleave_in_place: only q4_0 / q8_0 / q4_K / q6_K rows of whole 256-weight groups (q6_K: "
                           "of a multiple of 8), in whole tiles of rows");
  const int64_t groups = cols / kGroupWeights;
  const bool q6_k = type == GgmlType::Q6_K;
  const int64_t words = rows * groups * group_bytes(type) / 16;  // whole: see interleavable
  void* copy = nullptr;
  if (cudaError_t e = cudaMalloc(&copy, size_t(words) * 16); e != cudaSuccess)
    return Status::from_cuda(e, "cudaMalloc (interleaving copy)");
  cudaError_t e = cudaMemcpyAsync(copy, w, size_t(words) * 16, cudaMemcpyDeviceToDevice, stream);
  if (e == cudaSuccess) {
    const int blocks = int(std::min<int64_t>((words + 255) / 256, 65536));
    if (q6_k)
      interleave_q6_k_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint8_t*>(copy), static_cast<uint8_t*>(w),
                                                         rows, groups);
    else
      interleave_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(copy), static_cast<uint4*>(w), rows,
                                                    groups, int(group_bytes(type) / 16));
    e = cudaGetLastError();
  }
  const cudaError_t synced = cudaStreamSynchronize(stream);
  cudaFree(copy);
  if (e == cudaSuccess) e = synced;
  return Status::from_cuda(e, "interleave_kernel");
}

void register_interleaved(const void* base, size_t bytes) {
  std::lock_guard lock(g_matrices_mutex);
  g_matrices[static_cast<const uint8_t*>(base)] = bytes;
}

void unregister_interleaved(const void* base) {
  std::lock_guard lock(g_matrices_mutex);
  g_matrices.erase(static_cast<const uint8_t*>(base));
}

bool interleaved_matrix(const void* p, const uint8_t*& base, size_t& bytes) {
  const auto* q = static_cast<const uint8_t*>(p);
  std::lock_guard lock(g_matrices_mutex);
  auto it = g_matrices.upper_bound(q);  // the first matrix starting after q; the one before may hold it
  if (it == g_matrices.begin()) return false;
  --it;
  if (q >= it->first + it->second) return false;
  base = it->first, bytes = it->second;
  return true;
}

bool is_interleaved(const void* p, size_t span) {
  const auto* q = static_cast<const uint8_t*>(p);
  std::lock_guard lock(g_matrices_mutex);
  auto it = g_matrices.lower_bound(q + span);  // the first matrix starting at or after the span's end
  if (it == g_matrices.begin()) return false;
  --it;  // the last one starting before it: the only one that can overlap
  return it->first + it->second > q;
}

bool interleaved_tiles(const void* p, size_t span, size_t tile_bytes) {
  const auto* q = static_cast<const uint8_t*>(p);
  const uint8_t* base = nullptr;
  size_t bytes = 0;
  return interleaved_matrix(p, base, bytes) && q + span <= base + bytes && size_t(q - base) % tile_bytes == 0;
}

}  // namespace kiln::cuda
