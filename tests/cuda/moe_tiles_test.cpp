// The row-tile layout of stacked q4_K / q6_K experts (backend/cuda/expert_tiles.h) and the MoE
// kernels that read it. Skips without a GPU (the address test runs everywhere).
//
//   - Addresses: a tile's words and d's cover its bytes exactly once.
//   - The permutation on the device: every 16-byte word of every group, and each q6_K d, is
//     found where the layout's address functions say.
//   - Decode (moe_ffn_matvec, the tiled kernels of moe_tiled_decode.cu): against the double
//     reference of moe_problem.h within its fast-path bound (moe_test.cpp's top), and against
//     the block layout's kernels, which sum the same int8 products in another order:
//     |tiled - blocks| <= 1e-5 S + 1e-6 (S = sum_j w_j (sum_k |down[i][k] h_k| + |bias_i|)).
//     Rows of 1, 2, 3, 8 and 9 groups (lanes idle, one item a lane, two), 1, 2, 8 and 10 slots
//     (down's 3 to 30 items a row over 8, 16 and 32 lanes), 1 and 3 tokens, gpt-oss's biases and SwiGLU;
//     h quantized by the gate / up kernel and by a launch of its own (a block-layout gate / up
//     before a tiled down); an expert id out of range poisons its token only; the residual
//     add gives residual + output bit for bit.
//   - Prefill (moe_ffn_gemm, tile engine v8): the same bits as over the block layout (its
//     stage holds the same bytes either way), also where gemm_version asks for v7.
//   - A whole model: a small Qwen3-MoE Q4_K_M (kiln synth's mix) decoded greedily with the
//     layout and without: every step's logits within 1e-5 relative L2 and the same tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/expert_tiles.h"
#include "backend/cuda/moe.h"
#include "cuda_test_support.h"
#include "moe_problem.h"
#include "small_moe_model.h"

namespace kiln::cuda::testing {
namespace {

TEST(ExpertTiles, WordsAndScalesCoverEachTileOnce) {
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K})
    for (const int64_t groups : {1, 3, 8}) {
      const int bytes = expert_tile_group_bytes(type), words = expert_tile_group_words(type);
      const int64_t tile_bytes = kExpertTileRows * groups * bytes;
      ASSERT_EQ(tile_bytes % 16, 0);
      for (const int64_t tile : {0, 5}) {
        std::vector<int> covered(size_t(tile_bytes), 0);
        auto mark = [&](int64_t at, int n) {
          for (int b = 0; b < n; ++b) {
            const int64_t i = at + b - tile * tile_bytes;
            ASSERT_GE(i, 0);
            ASSERT_LT(i, tile_bytes);
            ++covered[size_t(i)];
          }
        };
        for (int64_t row = tile * kExpertTileRows; row < (tile + 1) * kExpertTileRows; ++row)
          for (int64_t g = 0; g < groups; ++g) {
            for (int k = 0; k < words; ++k) mark(expert_tile_word_byte(row, g, k, groups, bytes), 16);
            if (type == GgmlType::Q6_K) mark(expert_tile_q6_k_d_byte(row, g, groups), 2);
          }
        for (size_t i = 0; i < covered.size(); ++i)
          ASSERT_EQ(covered[i], 1) << type_name(type) << " groups " << groups << " tile " << tile << " byte " << i;
      }
    }
  EXPECT_TRUE(expert_tiles_fit(GgmlType::Q4_K, 768, 2048));
  EXPECT_TRUE(expert_tiles_fit(GgmlType::Q6_K, 2048, 768));
  EXPECT_FALSE(expert_tiles_fit(GgmlType::Q6_K, 2040, 768)) << "rows not a multiple of 32";
  EXPECT_FALSE(expert_tiles_fit(GgmlType::Q4_K, 768, 2000)) << "not whole groups of 256";
  EXPECT_FALSE(expert_tiles_fit(GgmlType::Q5_K, 768, 2048)) << "not a type of the layout";
}

TEST(ExpertTiles, PermutationPutsEveryWordWhereTheLayoutSays) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261202);
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K}) {
    const int64_t n_expert = 3, rows = 64, cols = 768, groups = cols / 256;
    const int bytes = expert_tile_group_bytes(type), words = expert_tile_group_words(type);
    std::vector<uint8_t> host(size_t(n_expert * rows * groups * bytes));
    for (uint8_t& b : host) b = uint8_t(rng());
    DeviceBuffer d = to_device(host);
    ASSERT_TRUE(d.ok());
    KILN_STATUS_OK(tile_experts_in_place(type, d.as(), n_expert, rows, cols, nullptr));
    const std::vector<uint8_t> tiled = to_host<uint8_t>(d, host.size());
    for (int64_t row = 0; row < n_expert * rows; ++row)
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* group = host.data() + (row * groups + g) * bytes;
        for (int k = 0; k < words; ++k)
          ASSERT_EQ(std::memcmp(tiled.data() + expert_tile_word_byte(row, g, k, groups, bytes), group + 16 * k, 16), 0)
              << type_name(type) << " row " << row << " group " << g << " word " << k;
        if (type == GgmlType::Q6_K)
          ASSERT_EQ(std::memcmp(tiled.data() + expert_tile_q6_k_d_byte(row, g, groups), group + 208, 2), 0)
              << "q6_K d of row " << row << " group " << g;
      }
  }
}

// A problem's tensors on the device, experts in the block layout and in the row-tile layout,
// and the arguments of moe_ffn_matvec / moe_ffn_gemm for either.
struct TiledProblem : ProblemOnDevice {
  DeviceBuffer tiled_gate, tiled_up, tiled_down;

  explicit TiledProblem(const Problem& p)
      : ProblemOnDevice(p), tiled_gate(to_device(p.gate)), tiled_up(to_device(p.up)), tiled_down(to_device(p.down)) {
    const MoeCase& c = p.c;
    auto tile = [&](const DeviceBuffer& b, GgmlType type, int64_t rows, int64_t cols) {
      const Status s = tile_experts_in_place(type, b.as(), c.n_expert, rows, cols, nullptr);
      EXPECT_TRUE(s.ok()) << s.message();
    };
    tile(tiled_gate, c.gate_up, c.n_ff, c.n_embd);
    tile(tiled_up, c.gate_up, c.n_ff, c.n_embd);
    tile(tiled_down, c.down, c.n_embd, c.n_ff);
  }

  // Which matrices the call reads in the row-tile layout.
  void use_tiles(bool gate_up_tiled, bool down_tiled) {
    a.gate.data = gate_up_tiled ? tiled_gate.as() : gate.as(), a.gate.row_tiles = gate_up_tiled;
    a.up.data = gate_up_tiled ? tiled_up.as() : up.as(), a.up.row_tiles = gate_up_tiled;
    a.down.data = down_tiled ? tiled_down.as() : down.as(), a.down.row_tiles = down_tiled;
  }

  // The output of one decode call (h's int8 copy made in the gate / up launch with the
  // tickets, else by a launch of its own), scratch and output poisoned first.
  std::vector<float> decode(bool gate_up_tiled, bool down_tiled, bool with_tickets = true) {
    use_tiles(gate_up_tiled, down_tiled);
    a.h_tickets = with_tickets ? tickets.as<unsigned>() : nullptr;
    scratch = DeviceBuffer(moe_matvec_scratch_bytes(a, false));
    scratch.poison();
    out.poison();
    const Status st = moe_ffn_matvec(a, false, scratch.as(), scratch.bytes(), nullptr);
    EXPECT_TRUE(st.ok()) << st.message();
    return to_host<float>(out, size_t(a.n_tokens * a.n_embd));
  }

  std::vector<float> prefill(bool tiled, int version) {
    use_tiles(tiled, tiled);
    a.gemm_version = version;
    a.h_tickets = nullptr;
    scratch = DeviceBuffer(moe_gemm_scratch_bytes(a));
    scratch.poison();
    out.poison();
    const Status st = moe_ffn_gemm(a, scratch.as(), scratch.bytes(), nullptr);
    EXPECT_TRUE(st.ok()) << st.message();
    return to_host<float>(out, size_t(a.n_tokens * a.n_embd));
  }
};

struct TypePair {
  GgmlType gate_up, down;
};

class CudaMoeTiles : public ::testing::TestWithParam<TypePair> {};

TEST_P(CudaMoeTiles, DecodeMeetsTheReferenceAndTheBlockLayout) {
  KILN_REQUIRE_GPU();
  const TypePair types = GetParam();
  std::mt19937_64 rng(20261203 + uint64_t(types.gate_up) * 64 + uint64_t(types.down));
  struct Shape {
    int64_t embd, ff, k;
  };
  // The last: Qwen3-30B-A3B's shape (2048, 768, 8 of 128 experts; 16 here).
  for (const Shape s : {Shape{256, 768, 1}, Shape{768, 512, 2}, Shape{2048, 256, 8}, Shape{512, 512, 8},
                        Shape{2304, 768, 10}, Shape{2048, 768, 8}})
    for (const int64_t T : {1, 3}) {
      const MoeCase c{types.gate_up, types.down, s.embd, s.ff, std::max<int64_t>(2 * s.k, 4), s.k, T == 3};
      const Problem p = make_problem(rng, c, T);
      const std::string what = describe(c, T);
      TiledProblem dev(p);
      ASSERT_TRUE(dev.out.ok()) << what;
      const std::vector<float> blocks = dev.decode(false, false);
      const std::vector<float> tiled = dev.decode(true, true);
      EXPECT_TRUE(near_reference(tiled, p, "tiled, " + what));
      EXPECT_TRUE(same_but_order(tiled, blocks, p, "tiled vs blocks, " + what));
      // Each matrix alone in the layout, h quantized apart.
      EXPECT_TRUE(same_but_order(dev.decode(true, false), blocks, p, "tiled gate / up only, " + what));
      EXPECT_TRUE(same_but_order(dev.decode(false, true, false), blocks, p, "tiled down only, h apart, " + what));
      EXPECT_TRUE(all_equal_bits(dev.decode(true, true, false), tiled, "tiled, no tickets, " + what));
      if (T == 3) {  // a residual of another row stride
        const int64_t rs = s.embd + 4;
        const std::vector<float> residual = random_floats(rng, size_t(T * rs), -3.0f, 3.0f);
        dev.residual = to_device(residual);
        dev.a.residual = dev.residual.as<float>(), dev.a.residual_stride = rs;
        EXPECT_TRUE(all_equal_bits(dev.decode(true, true), tiled, "tiled with a residual, output, " + what));
        std::vector<float> want = residual;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < s.embd; ++d) want[size_t(t * rs + d)] += tiled[size_t(t * s.embd + d)];
        EXPECT_TRUE(all_equal_bits(to_host<float>(dev.residual, residual.size()), want,
                                   "tiled, residual += output, " + what));
      }
    }
}

TEST_P(CudaMoeTiles, BadExpertIdPoisonsItsTokenOnly) {
  KILN_REQUIRE_GPU();
  const TypePair types = GetParam();
  std::mt19937_64 rng(20261204);
  const MoeCase c{types.gate_up, types.down, 512, 256, 8, 2, false};
  Problem p = make_problem(rng, c, 3);
  p.ids[2] = 8;  // token 1, slot 0: one past the last expert
  TiledProblem dev(p);
  const std::vector<float> got = dev.decode(true, true);
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t d = 0; d < c.n_embd; ++d) {
      const float v = got[size_t(t * c.n_embd + d)];
      EXPECT_EQ(t == 1, std::isnan(v)) << "token " << t << " row " << d << ": " << v;
    }
}

TEST_P(CudaMoeTiles, PrefillGivesTheBlockLayoutBits) {
  KILN_REQUIRE_GPU();
  const TypePair types = GetParam();
  std::mt19937_64 rng(20261205);
  for (const int64_t T : {40, 300}) {
    const MoeCase c{types.gate_up, types.down, 512, 768, 16, 4, T == 40};
    const Problem p = make_problem(rng, c, T);
    const std::string what = describe(c, T);
    TiledProblem dev(p);
    const std::vector<float> blocks = dev.prefill(false, 8);
    EXPECT_TRUE(near_reference(blocks, p, "v8 over blocks, " + what));
    EXPECT_TRUE(all_equal_bits(dev.prefill(true, 8), blocks, "v8 over tiles vs blocks, " + what));
    EXPECT_TRUE(all_equal_bits(dev.prefill(true, 7), blocks, "tiles with v7 asked for (v8 runs), " + what));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMoeTiles,
                         ::testing::Values(TypePair{GgmlType::Q4_K, GgmlType::Q6_K},
                                           TypePair{GgmlType::Q4_K, GgmlType::Q4_K},
                                           TypePair{GgmlType::Q6_K, GgmlType::Q6_K}),
                         [](const ::testing::TestParamInfo<TypePair>& info) {
                           return std::string(type_name(info.param.gate_up)) + "_" +
                                  std::string(type_name(info.param.down));
                         });

TEST(CudaMoeTilesArgs, MismatchedOrExactTilesAreRefused) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261206);
  const Problem p = make_problem(rng, MoeCase{GgmlType::Q4_K, GgmlType::Q6_K, 256, 256, 4, 2, false}, 1);
  TiledProblem dev(p);
  dev.use_tiles(true, true);
  dev.a.up.row_tiles = false;
  dev.scratch = DeviceBuffer(std::max(moe_matvec_scratch_bytes(dev.a, true), moe_matvec_scratch_bytes(dev.a, false)));
  EXPECT_FALSE(moe_ffn_matvec(dev.a, false, dev.scratch.as(), dev.scratch.bytes(), nullptr).ok())
      << "gate tiled, up not";
  dev.use_tiles(true, true);
  EXPECT_FALSE(moe_ffn_matvec(dev.a, true, dev.scratch.as(), dev.scratch.bytes(), nullptr).ok()) << "exact mode";
}

TEST(CudaMoeTilesModel, DecodeWithTilesMatchesBlocks) {
  KILN_REQUIRE_GPU();
  kiln::testing::TempGguf tmp("moe_tiles");
  write_small_moe(tmp.path, 4);
  CudaOptions blocks_options;
  blocks_options.expert_tiles = false;
  const SmallMoeDecode blocks = decode_small_moe(tmp.path, blocks_options, 8);
  const SmallMoeDecode tiles = decode_small_moe(tmp.path, CudaOptions{}, 8);
  EXPECT_EQ(blocks.tiled_stacks, 0u);
  // 3 stacks a layer (q4_K gate / up, q4_K or q6_K down), unless the environment turned it off.
  if (!env_is("KILN_CUDA_EXPERT_TILES", "0")) EXPECT_EQ(tiles.tiled_stacks, size_t(3 * kSmallMoeLayers));
  expect_same_decode(tiles, blocks, 1e-5, "experts in row tiles vs blocks");
}

}  // namespace
}  // namespace kiln::cuda::testing
