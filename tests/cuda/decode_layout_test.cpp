// The warp-interleaved layout of q4_0 / q8_0 / q4_K / q6_K decode weights (backend/cuda/decode_layout.h):
// the grouped products (and the int8 glu kernel) over weights permuted into the layout and
// registered give the bits they give over the block layout (the same groups, dotted and
// summed in the same order), and the registry answers for whole tiles inside a registered
// matrix only.
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cuda/decode_layout.h"
#include "backend/cuda/matvec.h"
#include "backend/cuda/matvec_grouped.h"
#include "backend/cuda/ops.h"
#include "cuda_test_support.h"
#include "quant/quant.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

// Registry arithmetic only (no device memory is touched): fake addresses.
TEST(DecodeLayoutRegistry, FindsWholeTilesInsideARegisteredMatrix) {
  auto* base = reinterpret_cast<const uint8_t*>(uintptr_t(1) << 40);
  const size_t tile = 2 * 2304, bytes = 8 * tile;
  register_interleaved(base, bytes);
  EXPECT_TRUE(interleaved_tiles(base, bytes, tile));
  EXPECT_TRUE(interleaved_tiles(base + 3 * tile, 2 * tile, tile));
  EXPECT_FALSE(interleaved_tiles(base + 2304, tile, tile)) << "starts inside a tile";
  EXPECT_FALSE(interleaved_tiles(base + 7 * tile, 2 * tile, tile)) << "runs past the matrix";
  EXPECT_FALSE(interleaved_tiles(base - tile, tile, tile)) << "before the matrix";
  EXPECT_TRUE(is_interleaved(base + bytes - 1, 1));
  EXPECT_TRUE(is_interleaved(base - 16, 17)) << "a span running into the matrix";
  EXPECT_FALSE(is_interleaved(base - 16, 16)) << "a span ending where the matrix starts";
  EXPECT_FALSE(is_interleaved(base + bytes, 4096)) << "after the matrix";
  const uint8_t* found = nullptr;
  size_t found_bytes = 0;
  ASSERT_TRUE(interleaved_matrix(base + 100, found, found_bytes));
  EXPECT_EQ(found, base);
  EXPECT_EQ(found_bytes, bytes);
  unregister_interleaved(base);
  EXPECT_FALSE(interleaved_tiles(base, bytes, tile)) << "unregistered";
  EXPECT_FALSE(is_interleaved(base, bytes)) << "unregistered";
}

TEST(DecodeLayoutRegistry, SaysWhichMatricesCanTakeTheLayout) {
  EXPECT_TRUE(interleavable(GgmlType::Q4_0, 6144, 4096));
  EXPECT_TRUE(interleavable(GgmlType::Q8_0, 4096, 14336));
  EXPECT_TRUE(interleavable(GgmlType::Q4_0, 7, 14336)) << "rows of 56 groups take a tile each";
  EXPECT_TRUE(interleavable(GgmlType::Q8_0, 2, 256)) << "rows of one group, two a tile";
  EXPECT_FALSE(interleavable(GgmlType::Q4_0, 7, 4096)) << "rows of 16 groups take tiles of two";
  EXPECT_FALSE(interleavable(GgmlType::Q4_0, 8, 4000)) << "not whole groups of 256";
  EXPECT_TRUE(interleavable(GgmlType::Q4_K, 8, 4096)) << "one q4_K block a group";
  EXPECT_TRUE(interleavable(GgmlType::Q6_K, 8, 4096)) << "16 groups of 210 bytes: tiles of whole words";
  EXPECT_TRUE(interleavable(GgmlType::Q6_K, 3, 14336)) << "56 groups, a row a tile";
  EXPECT_FALSE(interleavable(GgmlType::Q6_K, 8, 2816)) << "11 groups of 210 bytes: tiles of part words";
  EXPECT_FALSE(interleavable(GgmlType::Q5_K, 8, 4096)) << "not a type of the layout";
}

// Address arithmetic only (host): a q6_K tile's 13 words a group and its d's cover the tile's
// bytes exactly once, and tiles follow each other at S * G * 210 bytes.
TEST(DecodeLayoutQ6K, PlacesEveryByteOfATileOnce) {
  for (const int64_t groups : {8, 16, 24, 40, 56}) {
    SCOPED_TRACE("groups " + std::to_string(groups));
    const int slots = interleave_tile_rows(groups);
    const int64_t tile_bytes = slots * groups * 210;
    ASSERT_EQ(tile_bytes % 16, 0);
    for (const int64_t tile : {0, 3}) {
      std::vector<int> covered(size_t(tile_bytes), 0);
      const int64_t start = tile * tile_bytes;
      auto mark = [&](int64_t byte, int n) {
        for (int b = 0; b < n; ++b) {
          const int64_t at = byte + b - start;
          ASSERT_GE(at, 0);
          ASSERT_LT(at, tile_bytes);
          ++covered[size_t(at)];
        }
      };
      for (int slot = 0; slot < slots; ++slot)
        for (int64_t group = 0; group < groups; ++group) {
          const int64_t row = tile * slots + slot;
          for (int k = 0; k < kQ6KLayoutWords; ++k) mark(16 * interleaved_q6_k_word(row, group, k, groups), 16);
          mark(interleaved_q6_k_d_byte(row, group, groups), 2);
        }
      for (size_t i = 0; i < covered.size(); ++i) ASSERT_EQ(covered[i], 1) << "byte " << i << " of tile " << tile;
    }
  }
}

struct LayoutCase {
  GgmlType type;
  int64_t cols;
  std::vector<int64_t> part_rows;
  bool f32_input;  // x in f32 with the norm inside; else quantize_q8's int8 copy
};

// Interleaved q4_0 launches over int8 x of two blocks or more run in clusters whose x arrives
// by multicast copies (q4_0 only; KILN_CUDA_X_MULTICAST sets the cluster), the block layout's
// launches copy x per block: the q4_0 int8 cases check the one staging against the other too.
class DecodeLayoutTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(DecodeLayoutTest, ProductsGiveTheBlockLayoutsBits) {
  KILN_REQUIRE_GPU();
  const LayoutCase c = GetParam();
  SCOPED_TRACE(std::string(type_name(c.type)) + " cols " + std::to_string(c.cols) +
               (c.f32_input ? " f32 x" : " int8 x"));
  std::mt19937_64 rng(uint64_t(c.cols) * 31 + c.part_rows.size());
  const TypeTraits& t = traits(c.type);
  const int64_t row_bytes = c.cols / t.block_size * t.type_size;
  int64_t total = 0;
  for (int64_t r : c.part_rows) total += r;

  // Every part its own matrix (as weights are loaded), in the block layout and in the
  // interleaved layout (registered).
  std::vector<DeviceBuffer> w_d, interleaved_d;
  for (int64_t rows : c.part_rows) {
    ASSERT_TRUE(interleavable(c.type, rows, c.cols));
    const std::vector<uint8_t> host = random_rows(rng, c.type, rows, c.cols, row_bytes);
    w_d.push_back(to_device(host));
    interleaved_d.push_back(to_device_interleaved(c.type, host, rows, c.cols));
  }
  const std::vector<float> x = random_floats(rng, size_t(c.cols), -2.0f, 2.0f);
  const std::vector<float> norm = random_floats(rng, size_t(c.cols), 0.5f, 1.5f);
  const std::vector<float> addend = random_floats(rng, size_t(total), -1.0f, 1.0f);
  const DeviceBuffer x_d = to_device(x), norm_d = to_device(norm), add_d = to_device(addend);
  DeviceBuffer xq_d(size_t(c.cols)), xds_d(size_t(c.cols / 32) * 8);
  const Q8Vector xq{xq_d.as<int8_t>(), xds_d.as<float2>(), c.cols};
  if (!c.f32_input) KILN_STATUS_OK(quantize_q8(x_d.as<float>(), c.cols, xq, nullptr));

  // The products into y (the first part adds `addend`, the last accumulates into acc).
  auto run = [&](const std::vector<DeviceBuffer>& w, std::vector<float>& y, std::vector<float>& acc) {
    DeviceBuffer y_d(size_t(total) * 4), acc_d = to_device(addend);
    y_d.poison();
    std::vector<MatvecPart> parts(c.part_rows.size());
    int64_t first = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      parts[i].w = w[i].as(), parts[i].rows = c.part_rows[i], parts[i].y = y_d.as<float>() + first;
      first += c.part_rows[i];
    }
    parts.front().add = add_d.as<float>();
    parts.back().accumulate = acc_d.as<float>();
    if (c.f32_input) {
      F32Input in;
      in.x = x_d.as<float>(), in.norm_weight = norm_d.as<float>(), in.eps = 1e-5f;
      ASSERT_TRUE(matvec_parts_f32_fit(c.type, c.cols, row_bytes, parts, in));
      KILN_STATUS_OK(matvec_f32_parts(c.type, c.cols, row_bytes, parts, in, nullptr));
    } else {
      ASSERT_TRUE(matvec_parts_fit(c.type, c.cols, row_bytes, parts, xq));
      KILN_STATUS_OK(matvec_q8_parts(c.type, c.cols, row_bytes, parts, xq, nullptr));
    }
    KILN_CUDA_OK(cudaDeviceSynchronize());
    y = to_host<float>(y_d, size_t(total));
    acc = to_host<float>(acc_d, size_t(total));
  };

  std::vector<float> y_plain, acc_plain, y_interleaved, acc_interleaved;
  run(w_d, y_plain, acc_plain);
  run(interleaved_d, y_interleaved, acc_interleaved);
  for (const DeviceBuffer& w : interleaved_d) unregister_interleaved(w.as());

  EXPECT_TRUE(all_equal_bits(y_plain, y_interleaved, "y, interleaved vs block layout"));
  EXPECT_TRUE(all_equal_bits(acc_plain, acc_interleaved, "accumulated, interleaved vs block layout"));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DecodeLayoutTest,
    ::testing::Values(LayoutCase{GgmlType::Q4_0, 4096, {96, 32, 32}, true},   // q/k/v: 16 groups, two rows a tile
                      LayoutCase{GgmlType::Q8_0, 4096, {96, 32, 32}, true},
                      LayoutCase{GgmlType::Q4_0, 4096, {130}, false},         // o
                      LayoutCase{GgmlType::Q4_0, 14336, {70}, false},         // down: 56 groups, 32 + 24 lanes
                      LayoutCase{GgmlType::Q8_0, 14336, {70}, false},
                      LayoutCase{GgmlType::Q4_0, 3840, {18, 6}, false},       // 15 groups a row
                      LayoutCase{GgmlType::Q4_0, 4352, {9}, false},           // 17 groups: 32 lanes, one chunk
                      LayoutCase{GgmlType::Q8_0, 2816, {40}, true},           // 11 groups
                      LayoutCase{GgmlType::Q4_K, 4096, {96, 32, 32}, true},
                      LayoutCase{GgmlType::Q4_K, 14336, {70}, false},
                      LayoutCase{GgmlType::Q4_K, 2816, {18, 6}, false},
                      // q6_K: 13 words a group and d apart (rows of a multiple of 8 groups)
                      LayoutCase{GgmlType::Q6_K, 4096, {96, 32, 32}, true},
                      LayoutCase{GgmlType::Q6_K, 4096, {130}, false},
                      LayoutCase{GgmlType::Q6_K, 14336, {70}, false},
                      LayoutCase{GgmlType::Q6_K, 6144, {40}, false},   // 24 groups: 32 lanes, one chunk
                      LayoutCase{GgmlType::Q6_K, 2048, {64}, true},    // 8 groups: 8 lanes a row
                      // Llama-3-8B's q/k/v and down: warps with several items (the next item's
                      // words loaded while this one's are dotted, across tasks)
                      LayoutCase{GgmlType::Q4_0, 4096, {4096, 1024, 1024}, true},
                      LayoutCase{GgmlType::Q4_0, 14336, {4200}, false},
                      LayoutCase{GgmlType::Q8_0, 14336, {4200}, false},
                      LayoutCase{GgmlType::Q4_K, 14336, {4200}, false}));

// Every int8 glu format at 96 rows and at 14336.
std::vector<std::pair<GgmlType, int64_t>> layout_glu_cases() {
  std::vector<std::pair<GgmlType, int64_t>> cases;
  for (const int64_t rows : {int64_t(96), int64_t(14336)})
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) cases.emplace_back(type, rows);
  return cases;
}

// gate / up with the glu in the epilogue (the int8 glu kernel, matvec_grouped_glu.cu): from the
// interleaved layout, gate, up, the activation and its int8 copy are the block layout's bits.
// Llama-3-8B's width, 96 rows (3 h-blocks) and Llama-3-8B's 14336 (448 h-blocks: warps with 8
// items, so that the items copied ahead (KILN_CUDA_GLU_AHEAD) wrap their slots), the norm inside.
TEST(DecodeLayoutGlu, ProductsGiveTheBlockLayoutsBits) {
  KILN_REQUIRE_GPU();
  for (const std::pair<GgmlType, int64_t>& c : layout_glu_cases()) {
    const GgmlType type = c.first;
    const int64_t N = c.second;
    SCOPED_TRACE(std::string(type_name(type)) + " rows " + std::to_string(N));
    constexpr int64_t K = 4096;
    const int64_t w_row = K / traits(type).block_size * traits(type).type_size;
    const int64_t q8_row = q8_row_bytes(N);
    std::mt19937_64 rng(uint64_t(type) * 7 + 1);
    DeviceBuffer w_d[2], interleaved_d[2];
    for (int s = 0; s < 2; ++s) {
      const std::vector<uint8_t> host = random_rows(rng, type, N, K, w_row);
      w_d[s] = to_device(host);
      interleaved_d[s] = to_device_interleaved(type, host, N, K);
    }
    const DeviceBuffer x_d = to_device(random_floats(rng, size_t(K), -1.5f, 1.5f)),
                       norm_d = to_device(random_floats(rng, size_t(K), 0.5f, 1.5f));

    auto run = [&](const DeviceBuffer* w, std::vector<float>& out, std::vector<uint8_t>& q8) {
      DeviceBuffer gate_d{size_t(N) * 4}, up_d{size_t(N) * 4}, act_d{size_t(N) * 4}, q8_d{size_t(q8_row)};
      gate_d.poison(), up_d.poison(), act_d.poison(), q8_d.poison();
      MatvecPart parts[2];
      parts[0].w = w[0].as(), parts[0].rows = N, parts[0].y = gate_d.as<float>();
      parts[1].w = w[1].as(), parts[1].rows = N, parts[1].y = up_d.as<float>();
      F32Input in;
      in.x = x_d.as<float>(), in.norm_weight = norm_d.as<float>(), in.eps = 1e-5f;
      PairEpilogue ep;
      ep.kind = PairEpilogueKind::Glu, ep.token = 0;
      ep.glu.kind = GluKind::Silu, ep.glu.out = act_d.as<float>(), ep.glu.out_stride = N, ep.glu.stages = 2;
      ep.glu.q8 = q8_d.as<uint8_t>(), ep.glu.q8_row_bytes = q8_row;
      ASSERT_TRUE(matvec_pairs_fit(K, parts, ep));
      KILN_STATUS_OK(matvec_f32_parts(type, K, w_row, parts, in, nullptr, ep));
      KILN_CUDA_OK(cudaDeviceSynchronize());
      out = to_host<float>(gate_d, size_t(N));
      for (const DeviceBuffer* b : {&up_d, &act_d}) {
        const std::vector<float> more = to_host<float>(*b, size_t(N));
        out.insert(out.end(), more.begin(), more.end());
      }
      q8 = to_host<uint8_t>(q8_d, size_t(q8_row));
    };

    std::vector<float> plain, interleaved;
    std::vector<uint8_t> plain_q8, interleaved_q8;
    run(w_d, plain, plain_q8);
    run(interleaved_d, interleaved, interleaved_q8);
    for (int s = 0; s < 2; ++s) unregister_interleaved(interleaved_d[s].as());

    EXPECT_TRUE(all_equal_bits(plain, interleaved, "gate, up, activation: interleaved vs block layout"));
    EXPECT_TRUE(plain_q8 == interleaved_q8) << "the activation's int8 copy differs (interleaved vs block layout)";
  }
}

}  // namespace
}  // namespace kiln::cuda
