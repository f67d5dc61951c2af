// The int8 MoE decode path's down product (moe_matvec.cu) with each of its two walks over a
// warp's slots' rows: per segment (a row's slices in chunks of its own) and flattened (the
// slots' slices as one sequence, moe_flat_segments.cuh), forced through
// MoeFfnArgs::down_walk, and with the default. moe_ffn_matvec is called directly on random
// experts of every type the int8 path takes. Skips without a GPU.
//
// For each case:
//   - both walks against the double reference of moe_problem.h, within its fast-path bound
//     (moe_test.cpp's top: int8 rounding carried to the output, + 1e-4 S + 1e-5);
//   - the walks against each other: every term is computed alike and only the order of the
//     sum differs (moe_flat_segments.cuh), so |flat - per segment| <= 1e-5 S + 1e-6
//     (S = sum_j w_j (sum_k |down[i][k] h_k| + |bias_i|); f32 sums of at most a few hundred
//     terms reordered move by ~(terms per lane + 5) 2^-24 S); where a row is whole chunks (n_ff
//     1024: 32 slices) they must agree bit for bit;
//   - the default walk gives the bits of the walk it should pick: flattened where that leaves
//     fewer chunks, unless KILN_CUDA_MOE_FLAT_SEGMENTS=0 is set in the environment;
//   - with a residual: the output unchanged, and residual + output added in f32, bit for bit.
// Row widths: n_ff 768 (24 slices, Qwen3-30B-A3B's experts) and 1536 (48) walk flattened,
// 1024 (32) is whole; k 1, 2 and 8 slots; 1 and 3 tokens; biases and gpt-oss's SwiGLU on the
// 3-token cases; 64 tokens (two rows a warp) for four types.
//
// Also the gate / up kernel's launches (MoeFfnArgs::gate_up_launch: four copy stages, the
// one-wave kernel's fewer stages and registers, or the direct kernel's loads without staging,
// q4_K only, the one wave elsewhere): near the reference and the same bits, at
// rows of 2304 and 3328 columns (2.25 and 3.25 chunks of 1024: the stages wrap, the last
// chunk partial).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/moe.h"
#include "cuda_test_support.h"
#include "moe_problem.h"

namespace kiln::cuda::testing {
namespace {

// A problem's tensors on the device, with scratch for moe_ffn_matvec.
struct OnDevice : ProblemOnDevice {
  explicit OnDevice(const Problem& p) : ProblemOnDevice(p) {
    scratch = DeviceBuffer(moe_matvec_scratch_bytes(a, false));
  }

  // The output of one call with `walk` and the gate / up launch `gate_up` (the residual, if
  // set, is added to as well); h quantized inside the gate / up launch (with the tickets) or
  // by a launch of its own. The scratch is poisoned first, so no int8 copy of an earlier call
  // can stand in for this one's.
  std::vector<float> run(MoeDownWalk walk, MoeGateUpLaunch gate_up = MoeGateUpLaunch::Default,
                         bool h_in_gate_up = false) {
    a.down_walk = walk;
    a.gate_up_launch = gate_up;
    a.h_tickets = h_in_gate_up ? tickets.as<unsigned>() : nullptr;
    out.poison();
    scratch.poison();
    const Status st = moe_ffn_matvec(a, false, scratch.as(), scratch.bytes(), nullptr);
    EXPECT_TRUE(st.ok()) << st.message();
    return to_host<float>(out, size_t(a.n_tokens * a.n_embd));
  }
};

// Whether the default walk should be the flattened one (moe_matvec.cu's flat_down_walk).
bool default_is_flat(int64_t n_ff, int64_t k) {
  const char* env = std::getenv("KILN_CUDA_MOE_FLAT_SEGMENTS");
  if (env && std::string(env) == "0") return false;
  const int64_t slices = n_ff / 32;
  return slices % 32 != 0 && (k * slices + 31) / 32 < k * ((slices + 31) / 32);
}

void check_type(GgmlType type, std::mt19937_64& rng) {
  const int64_t embd = traits(type).block_size == 256 ? 256 : 64;
  for (const int64_t n_ff : {768, 1536, 1024})
    for (const int64_t k : {1, 2, 8})
      for (const int64_t T : {1, 3}) {
        const bool oai = T == 3;
        const MoeCase c{type, type, embd, n_ff, std::max<int64_t>(k, 4), k, oai};
        const Problem p = make_problem(rng, c, T);
        const std::string what = describe(c, T);
        OnDevice dev(p);
        ASSERT_TRUE(dev.scratch.ok() && dev.out.ok()) << what;
        const std::vector<float> per_segment = dev.run(MoeDownWalk::PerSegment);
        const std::vector<float> flat = dev.run(MoeDownWalk::Flat);
        const std::vector<float> by_default = dev.run(MoeDownWalk::Default);
        EXPECT_TRUE(near_reference(per_segment, p, "per-segment walk, " + what));
        EXPECT_TRUE(near_reference(flat, p, "flattened walk, " + what));
        if ((n_ff / 32) % 32 == 0)
          EXPECT_TRUE(all_equal_bits(flat, per_segment, "whole chunks: flattened vs per-segment, " + what));
        else
          EXPECT_TRUE(same_but_order(flat, per_segment, p, "flattened vs per-segment, " + what));
        const bool want_flat = default_is_flat(n_ff, k);
        EXPECT_TRUE(all_equal_bits(by_default, want_flat ? flat : per_segment,
                                   std::string("default walk (") + (want_flat ? "flattened" : "per segment") + "), " +
                                       what));
        if (T == 3) {  // a residual of another row stride
          const int64_t rs = embd + 4;
          const std::vector<float> residual = random_floats(rng, size_t(T * rs), -3.0f, 3.0f);
          dev.residual = to_device(residual);
          dev.a.residual = dev.residual.as<float>(), dev.a.residual_stride = rs;
          const std::vector<float> with_residual = dev.run(MoeDownWalk::Flat);
          EXPECT_TRUE(all_equal_bits(with_residual, flat, "flattened walk with a residual, output, " + what));
          std::vector<float> want = residual;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t d = 0; d < embd; ++d) want[size_t(t * rs + d)] += flat[size_t(t * embd + d)];
          EXPECT_TRUE(all_equal_bits(to_host<float>(dev.residual, residual.size()), want,
                                     "flattened walk, residual += output, " + what));
        }
      }
}

// Every type the int8 path takes: the k-quants, mxfp4, and the other block sizes, heads and
// alignments.
class CudaMoeDownWalkType : public ::testing::TestWithParam<GgmlType> {};

TEST_P(CudaMoeDownWalkType, WalksMeetTheReferenceAndAgree) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261200 + uint64_t(GetParam()));
  check_type(GetParam(), rng);
}

INSTANTIATE_TEST_SUITE_P(Int8Types, CudaMoeDownWalkType,
                         ::testing::Values(GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K,
                                           GgmlType::Q6_K, GgmlType::MXFP4, GgmlType::Q4_1, GgmlType::Q5_0,
                                           GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::Q2_K, GgmlType::Q3_K,
                                           GgmlType::IQ4_XS),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(type_name(info.param));
                         });

class CudaMoeGateUpLaunch : public ::testing::TestWithParam<GgmlType> {};

std::string launch_name(MoeGateUpLaunch launch) {
  switch (launch) {
    case MoeGateUpLaunch::FourStages: return ", four stages";
    case MoeGateUpLaunch::OneWave: return ", one wave";
    case MoeGateUpLaunch::Direct: return ", direct";
    default: return ", default";
  }
}

TEST_P(CudaMoeGateUpLaunch, OneWaveGivesTheFourStageBits) {
  KILN_REQUIRE_GPU();
  const GgmlType type = GetParam();
  std::mt19937_64 rng(20261201 + uint64_t(type));
  for (const int64_t embd : {2304, 3328})
    for (const int64_t T : {1, 3}) {
      const MoeCase c{type, type, embd, 256, 4, 2, T == 3};  // 256: a whole K-quant block for down
      const Problem p = make_problem(rng, c, T);
      const std::string what = describe(c, T);
      OnDevice dev(p);
      ASSERT_TRUE(dev.scratch.ok() && dev.out.ok()) << what;
      const std::vector<float> four = dev.run(MoeDownWalk::Default, MoeGateUpLaunch::FourStages);
      const std::vector<float> one_wave = dev.run(MoeDownWalk::Default, MoeGateUpLaunch::OneWave);
      const std::vector<float> direct = dev.run(MoeDownWalk::Default, MoeGateUpLaunch::Direct);
      EXPECT_TRUE(near_reference(four, p, "gate / up in four stages, " + what));
      EXPECT_TRUE(near_reference(one_wave, p, "gate / up in one wave, " + what));
      EXPECT_TRUE(all_equal_bits(one_wave, four, "gate / up in one wave vs four stages, " + what));
      EXPECT_TRUE(all_equal_bits(direct, four, "gate / up direct vs four stages, " + what));
    }
}

INSTANTIATE_TEST_SUITE_P(Int8Types, CudaMoeGateUpLaunch,
                         ::testing::Values(GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K,
                                           GgmlType::Q6_K, GgmlType::MXFP4, GgmlType::Q4_1, GgmlType::IQ4_NL,
                                           GgmlType::Q2_K, GgmlType::IQ4_XS),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(type_name(info.param));
                         });

// h's int8 copy made by the gate / up kernel (MoeFfnArgs::h_tickets: the last block of each
// group of 32 values quantizes it) against the launch of its own: the same bits, with every
// gate / up launch, twice in a row (the tickets must be back at zero after each launch, else
// the second call leaves groups unquantized: the scratch is poisoned before each call), and
// the tickets all zero at the end. n_ff 768 (24 groups a pair) and 1024, 8 slots, 1 and 3
// tokens (gpt-oss's SwiGLU and biases on 3), an expert id out of range on one slot of the
// 3-token case (its token's output NaN either way).
TEST_P(CudaMoeGateUpLaunch, HQuantizedInsideGivesTheOwnLaunchsBits) {
  KILN_REQUIRE_GPU();
  const GgmlType type = GetParam();
  std::mt19937_64 rng(20261202 + uint64_t(type));
  for (const int64_t n_ff : {768, 1024})
    for (const int64_t T : {1, 3}) {
      const MoeCase c{type, type, 512, n_ff, 16, 8, T == 3};
      Problem p = make_problem(rng, c, T);
      if (T == 3) p.ids[size_t(1 * 8 + 3)] = 16;
      const std::string what = describe(c, T);
      OnDevice dev(p);
      ASSERT_TRUE(dev.scratch.ok() && dev.out.ok() && dev.tickets.ok()) << what;
      for (const MoeGateUpLaunch launch : {MoeGateUpLaunch::FourStages, MoeGateUpLaunch::OneWave,
                                           MoeGateUpLaunch::Direct}) {
        const std::string how = what + launch_name(launch);
        const std::vector<float> apart = dev.run(MoeDownWalk::Default, launch, false);
        const std::vector<float> inside = dev.run(MoeDownWalk::Default, launch, true);
        const std::vector<float> again = dev.run(MoeDownWalk::Default, launch, true);
        if (T == 1) EXPECT_TRUE(near_reference(apart, p, "h quantized apart, " + how));
        EXPECT_TRUE(all_equal_bits(inside, apart, "h quantized in gate / up vs apart, " + how));
        EXPECT_TRUE(all_equal_bits(again, apart, "the same, a second time, " + how));
      }
      const std::vector<unsigned> left = to_host<unsigned>(dev.tickets, size_t(moe_h_ticket_count(dev.a)));
      EXPECT_EQ(std::count(left.begin(), left.end(), 0u), int64_t(left.size())) << "tickets left non-zero, " << what;
    }
}

// x's int8 copy made before the op (MoeFfnArgs::x_q8, the front's copy in decode; here
// quantize_q8_host's bytes in rows of the backend's pitch) against x quantized by the op's own
// launch: the same bits, with every gate / up launch and h quantized apart or inside. x's f32
// rows are poisoned (NaN) while the copy stands in, so a kernel that still read them would
// leave NaN outputs. n_ff 768, 8 slots, 1 and 3 tokens (gpt-oss's SwiGLU and biases on 3).
TEST_P(CudaMoeGateUpLaunch, XCopyFromBeforeGivesTheOwnLaunchsBits) {
  KILN_REQUIRE_GPU();
  const GgmlType type = GetParam();
  std::mt19937_64 rng(20261203 + uint64_t(type));
  for (const int64_t T : {1, 3}) {
    const MoeCase c{type, type, 512, 768, 16, 8, T == 3};
    const Problem p = make_problem(rng, c, T);
    const std::string what = describe(c, T);
    OnDevice dev(p);
    ASSERT_TRUE(dev.scratch.ok() && dev.out.ok() && dev.tickets.ok()) << what;
    const int64_t pitch = q8_row_bytes(c.n_embd);
    std::vector<uint8_t> rows(size_t(T * pitch), 0);
    for (int64_t t = 0; t < T; ++t) {
      const HostQ8 q = quantize_q8_host(std::vector<float>(p.x.begin() + t * c.n_embd, p.x.begin() + (t + 1) * c.n_embd));
      uint8_t* row = rows.data() + t * pitch;
      std::memcpy(row, q.qs.data(), q.qs.size());
      float* ds = reinterpret_cast<float*>(row + (c.n_embd + 15) / 16 * 16);
      for (size_t b = 0; b < q.d.size(); ++b) ds[2 * b] = q.d[b], ds[2 * b + 1] = q.s[b];
    }
    const DeviceBuffer x_q8 = to_device(rows);
    for (const MoeGateUpLaunch launch : {MoeGateUpLaunch::FourStages, MoeGateUpLaunch::OneWave,
                                         MoeGateUpLaunch::Direct})
      for (const bool h_inside : {false, true}) {
        const std::string how = what + launch_name(launch) +
                                (h_inside ? ", h inside" : ", h apart");
        dev.a.x_q8 = nullptr, dev.a.x_q8_row_bytes = 0;
        dev.x = to_device(p.x), dev.a.x = dev.x.as<float>();
        const std::vector<float> own = dev.run(MoeDownWalk::Default, launch, h_inside);
        dev.x.poison();
        dev.a.x_q8 = x_q8.as<uint8_t>(), dev.a.x_q8_row_bytes = pitch;
        const std::vector<float> given = dev.run(MoeDownWalk::Default, launch, h_inside);
        if (T == 1) EXPECT_TRUE(near_reference(own, p, "x quantized by the op, " + how));
        EXPECT_TRUE(all_equal_bits(given, own, "x's copy given vs quantized by the op, " + how));
      }
    dev.a.x_q8_row_bytes = (c.n_embd + 15) / 16 * 16 + c.n_embd / 32 * 8 - 16;  // two scale pairs short
    dev.scratch.poison();
    EXPECT_FALSE(moe_ffn_matvec(dev.a, false, dev.scratch.as(), dev.scratch.bytes(), nullptr).ok()) << what;
  }
}

// Enough tokens (n_tokens * n_embd >= 16384) for two rows a warp: the flattened kernel takes
// them where they fit its shared memory (q4_K, q6_K, mxfp4) and one row elsewhere (q8_0).
TEST(CudaMoeDownWalk, TwoRowsPerWarp) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261209);
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::MXFP4, GgmlType::Q8_0}) {
    const MoeCase c{type, type, 256, 768, 8, 8, type == GgmlType::MXFP4};
    const int64_t T = 64;
    const Problem p = make_problem(rng, c, T);
    const std::string what = describe(c, T);
    OnDevice dev(p);
    ASSERT_TRUE(dev.scratch.ok() && dev.out.ok()) << what;
    const std::vector<float> per_segment = dev.run(MoeDownWalk::PerSegment);
    const std::vector<float> flat = dev.run(MoeDownWalk::Flat);
    EXPECT_TRUE(near_reference(flat, p, "flattened walk, " + what));
    EXPECT_TRUE(same_but_order(flat, per_segment, p, "flattened vs per-segment, " + what));
  }
}

// More slots than the int8 down kernel takes (a warp's lanes: moe_matvec.cu) go to the f32 down
// kernel: still near the reference, for a k-quant and a 32-element type.
TEST(CudaMoeDownWalk, MoreSlotsThanLanesTakeTheF32Down) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261210);
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q8_0}) {
    const int64_t embd = traits(type).block_size == 256 ? 256 : 64;
    const MoeCase c{type, type, embd, 256, 40, 33, false};
    const Problem p = make_problem(rng, c, 2);
    const std::string what = describe(c, 2);
    OnDevice dev(p);
    ASSERT_TRUE(dev.scratch.ok() && dev.out.ok()) << what;
    EXPECT_TRUE(near_reference(dev.run(MoeDownWalk::Default), p, "33 slots, " + what));
  }
}

// An expert id out of range (past the end, or negative) makes its token's output NaN, the
// other tokens' untouched, in the flattened walk as in the per-segment one.
TEST(CudaMoeDownWalk, BadExpertIdGivesNanRows) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261208);
  for (const GgmlType type : {GgmlType::Q6_K, GgmlType::Q8_0})
    for (const int32_t bad : {-1, 16}) {
      const int64_t embd = traits(type).block_size == 256 ? 256 : 64, T = 3, k = 8;
      const MoeCase c{type, type, embd, 768, 16, k, false};
      Problem p = make_problem(rng, c, T);
      p.ids[size_t(1 * k + 5)] = bad;  // token 1, slot 5
      const std::string what = describe(c, T) + ", id " + std::to_string(bad) + " at token 1 slot 5";
      OnDevice dev(p);
      ASSERT_TRUE(dev.scratch.ok() && dev.out.ok()) << what;
      const std::vector<float> flat = dev.run(MoeDownWalk::Flat);
      const std::vector<float> per_segment = dev.run(MoeDownWalk::PerSegment);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < embd; ++d) {
          const float v = flat[size_t(t * embd + d)];
          EXPECT_EQ(t == 1, std::isnan(v)) << what << ": token " << t << " row " << d << ": " << v;
          EXPECT_EQ(t == 1, std::isnan(per_segment[size_t(t * embd + d)])) << what << ": per-segment walk, token " << t;
        }
      // The other tokens as the per-segment walk has them (token 1 set to 0 in both).
      std::vector<float> flat_ok = flat, per_segment_ok = per_segment;
      std::fill(flat_ok.begin() + embd, flat_ok.begin() + 2 * embd, 0.0f);
      std::fill(per_segment_ok.begin() + embd, per_segment_ok.begin() + 2 * embd, 0.0f);
      EXPECT_TRUE(same_but_order(flat_ok, per_segment_ok, p, "flattened vs per-segment, other tokens, " + what));
    }
}

}  // namespace
}  // namespace kiln::cuda::testing
