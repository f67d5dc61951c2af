// The interleaved twins of q4_0 / q8_0 decode weights (backend/cuda/decode_layout.h): the
// grouped products (and the int8 glu kernel) read from a registered twin give the bits they give from the original
// (the same groups, dotted and summed in the same order), the twin is what they read (the
// original zeroed afterwards changes nothing), and the registry finds twins only for whole
// tiles inside a registered matrix.
#include <cstring>

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
  auto* twin = reinterpret_cast<const uint8_t*>(uintptr_t(3) << 40);
  const size_t tile = 2 * 2304, bytes = 8 * tile;
  register_twin(base, bytes, twin);
  EXPECT_EQ(twin_of(base, bytes, tile), twin);
  EXPECT_EQ(twin_of(base + 3 * tile, 2 * tile, tile), twin + 3 * tile);
  EXPECT_EQ(twin_of(base + 2304, tile, tile), nullptr) << "starts inside a tile";
  EXPECT_EQ(twin_of(base + 7 * tile, 2 * tile, tile), nullptr) << "runs past the matrix";
  EXPECT_EQ(twin_of(base - tile, tile, tile), nullptr) << "before the matrix";
  unregister_twin(base);
  EXPECT_EQ(twin_of(base, bytes, tile), nullptr) << "unregistered";
}

TEST(DecodeLayoutRegistry, SaysWhichMatricesCanHaveTwins) {
  EXPECT_TRUE(interleavable(GgmlType::Q4_0, 6144, 4096));
  EXPECT_TRUE(interleavable(GgmlType::Q8_0, 4096, 14336));
  EXPECT_TRUE(interleavable(GgmlType::Q4_0, 7, 14336)) << "rows of 56 groups take a tile each";
  EXPECT_FALSE(interleavable(GgmlType::Q4_0, 7, 4096)) << "rows of 16 groups take tiles of two";
  EXPECT_FALSE(interleavable(GgmlType::Q4_0, 8, 4000)) << "not whole groups of 256";
  EXPECT_FALSE(interleavable(GgmlType::Q4_K, 8, 4096));
}

struct LayoutCase {
  GgmlType type;
  int64_t cols;
  std::vector<int64_t> part_rows;
  bool f32_input;  // x in f32 with the norm inside; else quantize_q8's int8 copy
};

class DecodeLayoutTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(DecodeLayoutTest, TwinGivesTheSameBits) {
  KILN_REQUIRE_GPU();
  const LayoutCase c = GetParam();
  SCOPED_TRACE(std::string(type_name(c.type)) + " cols " + std::to_string(c.cols) +
               (c.f32_input ? " f32 x" : " int8 x"));
  std::mt19937_64 rng(uint64_t(c.cols) * 31 + c.part_rows.size());
  const TypeTraits& t = traits(c.type);
  const int64_t row_bytes = c.cols / t.block_size * t.type_size;
  int64_t total = 0;
  for (int64_t r : c.part_rows) total += r;

  // Every part its own matrix (as weights are loaded), each with a twin.
  std::vector<DeviceBuffer> w_d, twin_d;
  for (int64_t rows : c.part_rows) {
    ASSERT_TRUE(interleavable(c.type, rows, c.cols));
    w_d.push_back(to_device(random_rows(rng, c.type, rows, c.cols, row_bytes)));
    twin_d.emplace_back(size_t(rows * row_bytes));
    KILN_STATUS_OK(interleave_weights(c.type, w_d.back().as(), twin_d.back().as(), rows, c.cols, nullptr));
  }
  const std::vector<float> x = random_floats(rng, size_t(c.cols), -2.0f, 2.0f);
  const std::vector<float> norm = random_floats(rng, size_t(c.cols), 0.5f, 1.5f);
  const std::vector<float> addend = random_floats(rng, size_t(total), -1.0f, 1.0f);
  const DeviceBuffer x_d = to_device(x), norm_d = to_device(norm), add_d = to_device(addend);
  DeviceBuffer xq_d(size_t(c.cols)), xds_d(size_t(c.cols / 32) * 8);
  const Q8Vector xq{xq_d.as<int8_t>(), xds_d.as<float2>(), c.cols};
  if (!c.f32_input) KILN_STATUS_OK(quantize_q8(x_d.as<float>(), c.cols, xq, nullptr));

  // The products into y (the first part adds `addend`, the last accumulates into acc).
  auto run = [&](std::vector<float>& y, std::vector<float>& acc) {
    DeviceBuffer y_d(size_t(total) * 4), acc_d = to_device(addend);
    y_d.poison();
    std::vector<MatvecPart> parts(c.part_rows.size());
    int64_t first = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      parts[i].w = w_d[i].as(), parts[i].rows = c.part_rows[i], parts[i].y = y_d.as<float>() + first;
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

  std::vector<float> y_plain, acc_plain, y_twin, acc_twin, y_zeroed, acc_zeroed;
  run(y_plain, acc_plain);
  for (size_t i = 0; i < w_d.size(); ++i)
    register_twin(w_d[i].as(), size_t(c.part_rows[i] * row_bytes), twin_d[i].as());
  run(y_twin, acc_twin);
  // The twin is what the products read: zeroing the originals changes nothing.
  for (const DeviceBuffer& w : w_d) KILN_CUDA_OK(cudaMemset(w.as(), 0, w.bytes()));
  run(y_zeroed, acc_zeroed);
  for (const DeviceBuffer& w : w_d) unregister_twin(w.as());

  EXPECT_TRUE(all_equal_bits(y_plain, y_twin, "y, twin vs original"));
  EXPECT_TRUE(all_equal_bits(acc_plain, acc_twin, "accumulated, twin vs original"));
  EXPECT_TRUE(all_equal_bits(y_plain, y_zeroed, "y, twin with the original zeroed"));
  EXPECT_TRUE(all_equal_bits(acc_plain, acc_zeroed, "accumulated, twin with the original zeroed"));
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
                      LayoutCase{GgmlType::Q8_0, 2816, {40}, true}));         // 11 groups

// gate / up with the glu in the epilogue (the int8 glu kernel, matvec_grouped_glu.cu): from the
// twins, gate, up, the activation and its int8 copy are the original's bits, and stay so with
// the originals zeroed. Llama-3-8B's width, 96 rows (3 h-blocks), the norm inside.
TEST(DecodeLayoutGlu, TwinGivesTheSameBits) {
  KILN_REQUIRE_GPU();
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0}) {
    SCOPED_TRACE(type_name(type));
    constexpr int64_t K = 4096, N = 96;
    const int64_t w_row = K / traits(type).block_size * traits(type).type_size;
    const int64_t q8_row = q8_row_bytes(N);
    std::mt19937_64 rng(uint64_t(type) * 7 + 1);
    DeviceBuffer w_d[2], twin_d[2];
    for (int s = 0; s < 2; ++s) {
      w_d[s] = to_device(random_rows(rng, type, N, K, w_row));
      twin_d[s] = DeviceBuffer(size_t(N * w_row));
      KILN_STATUS_OK(interleave_weights(type, w_d[s].as(), twin_d[s].as(), N, K, nullptr));
    }
    const DeviceBuffer x_d = to_device(random_floats(rng, size_t(K), -1.5f, 1.5f)),
                       norm_d = to_device(random_floats(rng, size_t(K), 0.5f, 1.5f));

    auto run = [&](std::vector<float>& out, std::vector<uint8_t>& q8) {
      DeviceBuffer gate_d{size_t(N) * 4}, up_d{size_t(N) * 4}, act_d{size_t(N) * 4}, q8_d{size_t(q8_row)};
      gate_d.poison(), up_d.poison(), act_d.poison(), q8_d.poison();
      MatvecPart parts[2];
      parts[0].w = w_d[0].as(), parts[0].rows = N, parts[0].y = gate_d.as<float>();
      parts[1].w = w_d[1].as(), parts[1].rows = N, parts[1].y = up_d.as<float>();
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

    std::vector<float> plain, twin, zeroed;
    std::vector<uint8_t> plain_q8, twin_q8, zeroed_q8;
    run(plain, plain_q8);
    for (int s = 0; s < 2; ++s) register_twin(w_d[s].as(), size_t(N * w_row), twin_d[s].as());
    run(twin, twin_q8);
    for (int s = 0; s < 2; ++s) KILN_CUDA_OK(cudaMemset(w_d[s].as(), 0, w_d[s].bytes()));
    run(zeroed, zeroed_q8);
    for (int s = 0; s < 2; ++s) unregister_twin(w_d[s].as());

    EXPECT_TRUE(all_equal_bits(plain, twin, "gate, up, activation: twin vs original"));
    EXPECT_TRUE(all_equal_bits(plain, zeroed, "gate, up, activation: twin with the originals zeroed"));
    EXPECT_TRUE(plain_q8 == twin_q8) << "the activation's int8 copy differs (twin vs original)";
    EXPECT_TRUE(plain_q8 == zeroed_q8) << "the activation's int8 copy differs (originals zeroed)";
  }
}

}  // namespace
}  // namespace kiln::cuda
