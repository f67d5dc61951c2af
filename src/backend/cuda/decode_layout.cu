// The interleaved twins of q4_0 / q8_0 decode weights (see decode_layout.h): the permuting
// kernel and the registry that finds a twin by the original's address.
#include "backend/cuda/decode_layout.h"

#include <map>
#include <mutex>

#include "backend/cuda/common.cuh"

namespace kiln::cuda {
namespace {

constexpr int64_t kGroupWeights = 256;

int64_t group_words(GgmlType type) { return type == GgmlType::Q4_0 ? 9 : 17; }

// One thread per 16-byte word of the source: its row, group and word within the group give
// its place in the twin.
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

struct Twin {
  size_t bytes;
  const uint8_t* twin;
};
std::mutex g_twins_mutex;
std::map<const uint8_t*, Twin> g_twins;

}  // namespace

bool interleavable(GgmlType type, int64_t rows, int64_t cols) {
  if (type != GgmlType::Q4_0 && type != GgmlType::Q8_0) return false;
  if (cols <= 0 || cols % kGroupWeights != 0 || rows <= 0) return false;
  return rows % (detail::kWarpSize / interleave_lanes(cols / kGroupWeights)) == 0;
}

Status interleave_weights(GgmlType type, const void* src, void* dst, int64_t rows, int64_t cols,
                          cudaStream_t stream) {
  if (!interleavable(type, rows, cols)) return Status::invalid("interleave_weights: only q4_0 / q8_0 rows of whole 256-weight groups, in whole tiles of rows");
  const int64_t groups = cols / kGroupWeights;
  const int64_t words = rows * groups * group_words(type);
  const int blocks = int(std::min<int64_t>((words + 255) / 256, 65536));
  interleave_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), rows, groups,
                                                int(group_words(type)));
  return Status::from_cuda(cudaGetLastError(), "interleave_kernel");
}

void register_twin(const void* base, size_t bytes, const void* twin) {
  std::lock_guard lock(g_twins_mutex);
  g_twins[static_cast<const uint8_t*>(base)] = {bytes, static_cast<const uint8_t*>(twin)};
}

void unregister_twin(const void* base) {
  std::lock_guard lock(g_twins_mutex);
  g_twins.erase(static_cast<const uint8_t*>(base));
}

const uint8_t* twin_of(const void* p, size_t span, size_t tile_bytes) {
  const auto* q = static_cast<const uint8_t*>(p);
  std::lock_guard lock(g_twins_mutex);
  auto it = g_twins.upper_bound(q);  // the first matrix starting after q; the one before may hold it
  if (it == g_twins.begin()) return nullptr;
  --it;
  const uint8_t* base = it->first;
  if (q + span > base + it->second.bytes || size_t(q - base) % tile_bytes != 0) return nullptr;
  return it->second.twin + (q - base);
}

bool in_place_matrix(const void* p, const uint8_t*& base, size_t& bytes) {
  const auto* q = static_cast<const uint8_t*>(p);
  std::lock_guard lock(g_twins_mutex);
  auto it = g_twins.upper_bound(q);
  if (it == g_twins.begin()) return false;
  --it;
  if (it->second.twin != it->first || q >= it->first + it->second.bytes) return false;
  base = it->first, bytes = it->second.bytes;
  return true;
}

bool in_place(const void* p) {
  const uint8_t* base = nullptr;
  size_t bytes = 0;
  return in_place_matrix(p, base, bytes);
}

}  // namespace kiln::cuda
