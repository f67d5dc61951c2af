// Weights copied into huge-page memory at load (CpuBackend's copy_weights, WeightArena):
// the copies must hold the file's bytes exactly, aligned for SIMD loads, whatever the mix
// of tensor sizes (several per region, one larger than a region, regions filled in turn),
// and a matmul against a copied weight must give what the same weight gives in place.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/weight_arena.h"
#include "formats/gguf.h"

namespace kiln {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {  // four bytes per draw: the arena test copies ~560 MB
    const uint32_t r = rng();
    std::memcpy(v.data() + i, &r, 4);
  }
  for (; i < n; ++i) v[i] = uint8_t(rng());
  return v;
}

// First differing byte, or -1.
int64_t first_difference(const uint8_t* a, const uint8_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return int64_t(i);
  return -1;
}

TEST(WeightArena, CopiesHoldTheBytesAligned) {
  cpu::WeightArena arena;
  // Odd sizes (not multiples of 64 or of a page), a tensor larger than a region, and enough
  // in total that a second and third region are mapped.
  const size_t sizes[] = {1,       37,       4099, size_t(3) << 20, 12345,
                          cpu::WeightArena::kRegionBytes + 777, 100, size_t(200) << 20, size_t(90) << 20};
  std::vector<std::vector<uint8_t>> sources;
  std::vector<const uint8_t*> copies;
  uint32_t seed = 1;
  for (size_t n : sizes) {
    sources.push_back(random_bytes(n, seed++));
    copies.push_back(arena.copy(sources.back().data(), n));
  }
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(copies[i]) % 64, 0u) << "copy " << i << " of " << sizes[i] << " bytes";
    const int64_t diff = first_difference(copies[i], sources[i].data(), sizes[i]);
    EXPECT_EQ(diff, -1) << "copy " << i << " of " << sizes[i] << " bytes differs at byte " << diff << ": "
                        << int(copies[i][diff < 0 ? 0 : diff]) << " vs " << int(sources[i][diff < 0 ? 0 : diff]);
  }
  size_t total = 0;
  for (size_t n : sizes) total += n;
  EXPECT_GE(arena.bytes_mapped(), total);
}

gguf::TensorInfo tensor_info(const std::vector<uint8_t>& bytes, GgmlType type, int64_t cols, int64_t rows) {
  gguf::TensorInfo info;
  info.name = "blk.0.ffn_up.weight";
  info.type = type;
  info.shape = {cols, rows};
  info.bytes = bytes.size();
  info.data = bytes.data();
  return info;
}

TEST(WeightCopy, BackendCopiesLargeTensorsAndKeepsSmallOnesMapped) {
  // q4_0 rows of 256 columns (144 bytes): 1000 rows are above the copy threshold, 10 below.
  const int64_t cols = 256;
  const size_t row_bytes = 144;
  const auto big = random_bytes(row_bytes * 1000, 7), small = random_bytes(row_bytes * 10, 8);
  CpuBackend mapped(2, /*copy_weights=*/false), copied(2, /*copy_weights=*/true);
  ASSERT_GE(big.size(), CpuBackend::kCopyMinBytes);
  ASSERT_LT(small.size(), CpuBackend::kCopyMinBytes);

  // Tensors name their TensorInfo's name (owned by the file, here by these locals).
  const gguf::TensorInfo big_info = tensor_info(big, GgmlType::Q4_0, cols, 1000);
  const gguf::TensorInfo small_info = tensor_info(small, GgmlType::Q4_0, cols, 10);
  const Tensor big_view = mapped.weight(big_info);
  const Tensor big_copy = copied.weight(big_info);
  const Tensor small_copy = copied.weight(small_info);
  EXPECT_EQ(big_view.data, big.data());
  EXPECT_NE(big_copy.data, big.data());
  EXPECT_EQ(small_copy.data, small.data());
  EXPECT_EQ(first_difference(static_cast<const uint8_t*>(big_copy.data), big.data(), big.size()), -1);
  EXPECT_EQ(big_copy.name, "blk.0.ffn_up.weight");
  // One tensor copied: its size rounded up to a whole huge page.
  EXPECT_GE(copied.weight_copies().bytes_mapped(), big.size());
  EXPECT_LE(copied.weight_copies().bytes_mapped(), big.size() + cpu::WeightArena::kHugePage);

  // The q4_0 blocks hold random bytes, so the f16 scales may be inf / nan: give them a
  // small finite scale so the products compare as numbers.
  std::vector<uint8_t> blocks = big;
  for (size_t b = 0; b < blocks.size(); b += 18) {
    blocks[b] = 0x00;
    blocks[b + 1] = 0x2C;  // f16 0.0625
  }
  const gguf::TensorInfo blocks_info = tensor_info(blocks, GgmlType::Q4_0, cols, 1000);
  const Tensor w_view = mapped.weight(blocks_info);
  const Tensor w_copy = copied.weight(blocks_info);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  for (int64_t n_tokens : {1, 5}) {
    std::vector<float> x(size_t(cols * n_tokens)), y_view(size_t(1000 * n_tokens)), y_copy(y_view.size());
    for (float& v : x) v = dist(rng);
    Tensor tx = Tensor::contiguous(GgmlType::F32, {cols, n_tokens}, x.data());
    Tensor ty_view = Tensor::contiguous(GgmlType::F32, {1000, n_tokens}, y_view.data());
    Tensor ty_copy = Tensor::contiguous(GgmlType::F32, {1000, n_tokens}, y_copy.data());
    mapped.matmul(tx, w_view, Tensor{}, ty_view);
    copied.matmul(tx, w_copy, Tensor{}, ty_copy);
    for (size_t i = 0; i < y_view.size(); ++i)
      ASSERT_EQ(y_copy[i], y_view[i]) << "n_tokens=" << n_tokens << " y[" << i << "]: copy " << y_copy[i] << ", mapped "
                                      << y_view[i];
  }
}

}  // namespace
}  // namespace kiln
