// Decode matvec (backend/cuda/matvec.h) against scalar references on random weights of every
// supported type, at awkward sizes.
//
// Error bounds:
//  - quantized weights, against a reference that uses the same int8 activations (the CPU
//    mirror of quantize_q8 below, checked bit for bit): the GPU sums exact integer dot
//    products, scales them and accumulates in f32, so |y - ref| <= 1e-5 * sum_i |w_i xq_i|;
//  - quantized weights, against the exact f32 product: the activation rounding adds at most
//    sum_b (max|x in b| / 254) * sum_{i in b} |w_i| (stated in matvec.h);
//  - f32 / f16 / bf16 weights (x kept in f32): |y - ref| <= 1e-5 * sum_i |w_i x_i|.
#include <algorithm>
#include <cmath>

#include "backend/cuda/matvec.h"
#include "backend/cuda/matvec_grouped.h"
#include "cuda_test_support.h"
#include "quant/quant.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

struct Shape {
  int64_t rows, cols;
};

class MatvecTest : public ::testing::TestWithParam<GgmlType> {};

// Runs one product and checks it; `row_pad` bytes of padding per row, `add` a fused addend.
void check_matvec(GgmlType type, Shape shape, int64_t row_pad, bool with_add, int rows_per_warp, int warps_per_row,
                  uint64_t seed) {
  SCOPED_TRACE(std::string(type_name(type)) + " " + std::to_string(shape.rows) + "x" + std::to_string(shape.cols) +
               " pad " + std::to_string(row_pad) + (with_add ? " +add" : "") + " rows/warp " + std::to_string(rows_per_warp) +
               " warps/row " + std::to_string(warps_per_row) +
               " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const TypeTraits& t = traits(type);
  const int64_t row_bytes = shape.cols / t.block_size * t.type_size;
  const int64_t stride = row_bytes + row_pad;
  const std::vector<uint8_t> w = random_rows(rng, type, shape.rows, shape.cols, stride);
  const std::vector<float> x = random_floats(rng, size_t(shape.cols), -2.0f, 2.0f);
  const std::vector<float> addend = random_floats(rng, size_t(shape.rows), -1.0f, 1.0f);

  const DeviceBuffer w_d = to_device(w), x_d = to_device(x);
  DeviceBuffer y_d(size_t(shape.rows) * 4);
  if (with_add) {
    y_d.upload(addend.data(), addend.size() * 4);  // in place: y = W x + y
  } else {
    y_d.poison();
  }
  DeviceBuffer scratch(std::max<size_t>(16, matvec_scratch_bytes(type, shape.cols)));
  scratch.poison();

  MatvecArgs a;
  a.type = type;
  a.w = w_d.as();
  a.w_row_bytes = stride;
  a.rows = shape.rows;
  a.cols = shape.cols;
  a.x = x_d.as<float>();
  a.add = with_add ? y_d.as<float>() : nullptr;
  a.y = y_d.as<float>();
  a.rows_per_warp = rows_per_warp;
  a.warps_per_row = warps_per_row;
  KILN_STATUS_OK(matvec(a, scratch.as(), scratch.bytes(), nullptr));
  const std::vector<float> y = to_host<float>(y_d, size_t(shape.rows));

  // References.
  const bool quant = !is_float_type(type);
  const HostQ8 xq = quant ? quantize_q8_host(x) : HostQ8{};
  std::vector<double> ref_same(shape.rows), tol_same(shape.rows), ref_exact(shape.rows), tol_exact(shape.rows);
  std::vector<float> deq(size_t(shape.cols));
  for (int64_t r = 0; r < shape.rows; ++r) {
    dequantize_row_reference(type, w.data() + r * stride, deq.data(), shape.cols);
    double same = 0, same_mag = 0, exact = 0, exact_mag = 0, act_bound = 0;
    for (int64_t b = 0; b < (shape.cols + 31) / 32; ++b) {
      double amax = 0, wsum = 0;
      for (int64_t i = 32 * b; i < std::min(32 * b + 32, shape.cols); ++i) {
        exact += double(deq[i]) * x[i];
        exact_mag += std::fabs(double(deq[i]) * x[i]);
        amax = std::max(amax, double(std::fabs(x[i])));
        wsum += std::fabs(double(deq[i]));
        if (quant) {
          const double xv = double(xq.d[b]) * xq.qs[i];
          same += double(deq[i]) * xv;
          same_mag += std::fabs(double(deq[i]) * xv);
        }
      }
      act_bound += amax / 254.0 * wsum;
    }
    const double extra = with_add ? addend[r] : 0.0;
    const double add_tol = with_add ? 1e-6 * std::fabs(extra) + 1e-30 : 1e-30;
    ref_exact[r] = exact + extra;
    if (quant) {
      ref_same[r] = same + extra;
      tol_same[r] = 1e-5 * same_mag + add_tol;
      tol_exact[r] = act_bound * 1.0001 + 1e-5 * exact_mag + add_tol;
    } else {
      tol_exact[r] = 1e-5 * exact_mag + add_tol;
    }
  }
  if (quant) EXPECT_TRUE(all_close(y, ref_same, tol_same, "vs reference with the same int8 activations"));
  EXPECT_TRUE(all_close(y, ref_exact, tol_exact, "vs exact f32 product"));
}

TEST_P(MatvecTest, AwkwardShapes) {
  KILN_REQUIRE_GPU();
  const GgmlType type = GetParam();
  const int64_t bs = traits(type).block_size;
  std::vector<int64_t> widths = {256, 2816};
  if (bs <= 32) widths.push_back(800);  // 25 blocks of 32: a partial chunk
  if (bs == 1) widths.push_back(44);    // not a multiple of 8: the scalar float path
  uint64_t seed = 1000 + uint64_t(type) * 100;
  for (int64_t rows : {1, 7, 33, 4097})
    for (int64_t cols : widths) check_matvec(type, {rows, cols}, 0, false, 0, 0, seed++);
}

TEST_P(MatvecTest, PaddedRowsFusedAddAndBlockShapes) {
  KILN_REQUIRE_GPU();
  const GgmlType type = GetParam();
  const int64_t pad = is_float_type(type) ? traits(type).type_size : 2;  // rows off 16-byte alignment
  uint64_t seed = 5000 + uint64_t(type) * 100;
  check_matvec(type, {65, 2816}, pad, false, 0, 0, seed++);
  check_matvec(type, {65, 2816}, 0, true, 0, 0, seed++);
  for (int rows_per_warp : {1, 2})
    for (int warps_per_row : {1, 2, 4})
      check_matvec(type, {37, 2816}, 0, warps_per_row == 2, rows_per_warp, warps_per_row, seed++);
}

// Widths of whole 256-element groups (the grouped q4_0 / q8_0 / q4_K / q6_K kernel; q6_K takes
// 17 groups to the general kernel): 16 groups (two rows per warp), 8 (four rows per warp, 8
// lanes a row, unless KILN_CUDA_GROUPED_EIGHT_LANES=0), 56 (a full and a partial chunk of 32
// groups), 17, 32 (one chunk of 32); rows that leave a task partly empty; the fused addend.
TEST_P(MatvecTest, LlamaShapesAndGroupedWidths) {
  KILN_REQUIRE_GPU();
  const GgmlType type = GetParam();
  if (traits(type).block_size != 32 && type != GgmlType::Q4_K && type != GgmlType::Q6_K) GTEST_SKIP();
  uint64_t seed = 9000 + uint64_t(type) * 100;
  check_matvec(type, {1, 4096}, 0, false, 0, 0, seed++);
  check_matvec(type, {301, 4096}, 0, true, 0, 0, seed++);
  // Rows of two per task over x of 2048: more tasks than the one-stage launch's resident
  // warps (two stages, several tasks per warp) and fewer (one stage, one task each).
  check_matvec(type, {7001, 2048}, 0, false, 0, 0, seed++);
  check_matvec(type, {5999, 2048}, 0, true, 0, 0, seed++);
  check_matvec(type, {33, 14336}, 0, false, 0, 0, seed++);
  check_matvec(type, {67, 17 * 256}, 0, true, 0, 0, seed++);
  check_matvec(type, {45, 8192}, 0, false, 0, 0, seed++);
}

// q6_K in the grouped kernel: its 210-byte super-blocks start on a 16-byte boundary every 8,
// so widths of 8k groups only. 8 groups (two rows per warp, one partial chunk), 24 (one partial
// chunk of 32), 40 (a full and a partial chunk of 8), 56 (Llama's down projection); rows that
// leave a two-row task half empty; rows padded by 16 bytes; the fused addend. Each case must
// be one the grouped kernel takes (not the general kernel's), and 17 groups must not be.
TEST(MatvecQ6KGrouped, WidthsOfWholeSuperBlockOctets) {
  KILN_REQUIRE_GPU();
  const int64_t block_bytes = traits(GgmlType::Q6_K).type_size;
  alignas(16) static int8_t stand_in[16];
  auto takes = [&](int64_t rows, int64_t cols, int64_t pad) {
    MatvecArgs a;
    a.type = GgmlType::Q6_K;
    a.w = stand_in;
    a.w_row_bytes = cols / 256 * block_bytes + pad;
    a.rows = rows;
    a.cols = cols;
    Q8Vector xq;
    xq.qs = stand_in, xq.ds = reinterpret_cast<float2*>(stand_in), xq.n = cols;
    return matvec_grouped_fits(a, xq);
  };
  EXPECT_FALSE(takes(8, 17 * 256, 0));
  EXPECT_FALSE(takes(8, 4096, 2));  // rows off 16-byte alignment
  uint64_t seed = 31000;
  for (int64_t groups : {8, 24, 40, 56})
    for (int64_t rows : {1, 3, 37, 130}) {
      const int64_t pad = rows == 37 ? 16 : 0;
      ASSERT_TRUE(takes(rows, 256 * groups, pad)) << groups << " groups";
      check_matvec(GgmlType::Q6_K, {rows, 256 * groups}, pad, rows == 3 || rows == 130, 0, 0, seed++);
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatvecTest,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                                           GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K,
                                           GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                                           GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(type_name(info.param));
                         });

// The device quantizer gives the bytes of its CPU mirror exactly.
TEST(QuantizeQ8, MatchesHostMirrorBitForBit) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(77);
  for (int64_t n : {32, 96, 4096, 14336}) {
    std::vector<float> x = random_floats(rng, size_t(n), -3.0f, 3.0f);
    for (int i = 0; i < 32 && i < n; ++i) x[i] = 0.0f;  // an all-zero block: scale 0
    const DeviceBuffer x_d = to_device(x);
    DeviceBuffer scratch(matvec_scratch_bytes(GgmlType::Q4_0, n));
    scratch.poison();
    const Q8Vector q = q8_vector_in(scratch.as(), n);
    KILN_STATUS_OK(quantize_q8(x_d.as<float>(), n, q, nullptr));
    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
    std::vector<int8_t> qs(static_cast<size_t>(n));
    std::vector<float> ds(size_t(n / 32) * 2);
    ASSERT_EQ(cudaSuccess, cudaMemcpy(qs.data(), q.qs, qs.size(), cudaMemcpyDeviceToHost));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(ds.data(), q.ds, ds.size() * 4, cudaMemcpyDeviceToHost));
    const HostQ8 ref = quantize_q8_host(x);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i)
      if (qs[i] != ref.qs[i] && bad++ < 8) ADD_FAILURE() << "n " << n << " qs[" << i << "] got " << int(qs[i]) << " want " << int(ref.qs[i]);
    std::vector<float> got_d, got_s;
    for (int64_t b = 0; b < n / 32; ++b) got_d.push_back(ds[2 * b]), got_s.push_back(ds[2 * b + 1]);
    EXPECT_TRUE(all_equal_bits(got_d, ref.d, "scales"));
    EXPECT_TRUE(all_equal_bits(got_s, ref.s, "scaled sums"));
  }
}

TEST(Matvec, RefusesUnsupportedTypeNamingTheSupportedOnes) {
  MatvecArgs a;
  a.type = GgmlType::IQ2_XXS;
  a.rows = 1;
  a.cols = 256;
  const Status s = matvec(a, nullptr, 0, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("q4_K"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("iq2_xxs"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kiln::cuda
