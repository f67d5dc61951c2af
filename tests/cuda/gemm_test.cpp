// Prefill GEMM (backend/cuda/gemm.h) against double-precision references.
//
// Error bounds (S = sum_k |x_k w_k| per output):
//  - against a reference built from the same rounded inputs (x and, for quantized weights,
//    the dequantized w rounded to bf16; x rounded to f16 for f16 weights): only the tensor
//    cores' f32 accumulation differs: |Y - ref| <= 1e-4 * S (typical ~1e-6 * S);
//  - against the exact product: rounding x and w to bf16 costs up to 2^-8 * S (f16: 2^-10;
//    f32 weights: no rounding, 1e-5 * S).
#include <cublas_v2.h>

#include <cmath>

#include "backend/cuda/gemm.h"
#include "cuda_test_support.h"
#include "quant/quant.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

struct GemmCase {
  GgmlType type;
  int64_t t, n, k;
  int64_t slab_rows;  // 0: one slab
};

class GemmTest : public ::testing::TestWithParam<GemmCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (list_devices(&why).empty()) return;
    ASSERT_EQ(CUBLAS_STATUS_SUCCESS, cublasCreate(&blas_));
  }
  void TearDown() override {
    if (blas_) cublasDestroy(blas_);
  }
  cublasHandle_t blas_ = nullptr;
};

float round_as(GgmlType type, float v) {
  return type == GgmlType::F16 ? f16_to_f32(f32_to_f16(v)) : bf16_to_f32(f32_to_bf16(v));
}

TEST_P(GemmTest, MatchesReference) {
  KILN_REQUIRE_GPU();
  const GemmCase c = GetParam();
  SCOPED_TRACE(std::string(type_name(c.type)) + " t " + std::to_string(c.t) + " n " + std::to_string(c.n) + " k " +
               std::to_string(c.k) + " slab " + std::to_string(c.slab_rows));
  std::mt19937_64 rng(700 + uint64_t(c.type) * 31 + uint64_t(c.n));
  const TypeTraits& tr = traits(c.type);
  const int64_t w_stride = c.k / tr.block_size * tr.type_size;
  const int64_t x_stride = c.k + 4, y_stride = c.n + 3;
  const std::vector<uint8_t> w = random_rows(rng, c.type, c.n, c.k, w_stride);
  const std::vector<float> x = random_floats(rng, size_t(c.t * x_stride), -1.0f, 1.0f);
  const DeviceBuffer w_d = to_device(w), x_d = to_device(x);
  DeviceBuffer y_d(size_t(c.t * y_stride) * 4);
  y_d.poison();

  GemmArgs a;
  a.type = c.type;
  a.w = w_d.as();
  a.w_row_bytes = w_stride;
  a.n = c.n;
  a.k = c.k;
  a.x = x_d.as<float>();
  a.x_stride = x_stride;
  a.t = c.t;
  a.y = y_d.as<float>();
  a.y_stride = y_stride;
  DeviceBuffer scratch(std::max<size_t>(256, gemm_scratch_bytes(a, c.slab_rows)));
  scratch.poison();
  KILN_STATUS_OK(gemm(a, blas_, scratch.as(), scratch.bytes(), nullptr));
  const std::vector<float> y_all = to_host<float>(y_d, size_t(c.t * y_stride));

  const bool rounds = c.type != GgmlType::F32;
  const double unit = c.type == GgmlType::F32 ? 1e-5 : (c.type == GgmlType::F16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -8));
  std::vector<float> wrow(size_t(c.k));
  std::vector<float> got;
  std::vector<double> ref_same, tol_same, ref_exact, tol_exact;
  std::vector<std::vector<float>> wdeq(size_t(c.n));
  for (int64_t i = 0; i < c.n; ++i) {
    dequantize_row_reference(c.type, w.data() + i * w_stride, wrow.data(), c.k);
    wdeq[i] = wrow;
  }
  for (int64_t j = 0; j < c.t; ++j)
    for (int64_t i = 0; i < c.n; ++i) {
      double same = 0, exact = 0, mag = 0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const float xv = x[j * x_stride + kk], wv = wdeq[i][kk];
        exact += double(xv) * wv;
        mag += std::fabs(double(xv) * wv);
        same += rounds ? double(round_as(c.type, xv)) * round_as(c.type, wv) : double(xv) * wv;
      }
      got.push_back(y_all[j * y_stride + i]);
      ref_same.push_back(same);
      tol_same.push_back(1e-4 * mag + 1e-30);
      ref_exact.push_back(exact);
      tol_exact.push_back(unit * mag + 1e-4 * mag + 1e-30);
    }
  EXPECT_TRUE(all_close(got, ref_same, tol_same, "vs reference from the same rounded inputs"));
  EXPECT_TRUE(all_close(got, ref_exact, tol_exact, "vs exact product"));
}

INSTANTIATE_TEST_SUITE_P(
    Types, GemmTest,
    ::testing::Values(GemmCase{GgmlType::F32, 37, 67, 256, 0}, GemmCase{GgmlType::F16, 37, 67, 2816, 0},
                      GemmCase{GgmlType::BF16, 64, 129, 2816, 0}, GemmCase{GgmlType::BF16, 1, 7, 256, 0},
                      GemmCase{GgmlType::Q4_0, 37, 67, 2816, 0}, GemmCase{GgmlType::Q8_0, 37, 67, 256, 0},
                      GemmCase{GgmlType::Q4_K, 64, 200, 2816, 64}, GemmCase{GgmlType::Q6_K, 37, 67, 256, 0},
                      GemmCase{GgmlType::Q5_K, 17, 33, 256, 0}, GemmCase{GgmlType::IQ4_XS, 17, 130, 512, 64},
                      GemmCase{GgmlType::MXFP4, 17, 33, 256, 0}),
    [](const ::testing::TestParamInfo<GemmCase>& info) {
      return std::string(type_name(info.param.type)) + "_t" + std::to_string(info.param.t) + "_n" +
             std::to_string(info.param.n) + "_k" + std::to_string(info.param.k);
    });

// Several parts over one X (gemm_parts): q/k/v-like widths on three lanes (side streams with
// their own handles), against the same double-precision reference as a single product;
// and on one lane (the caller's stream only). Two rounds: the first times the algorithms
// of new shapes and runs the parts one after the other, the second runs them side by side;
// a third reads X already rounded (GemmPartsArgs::x_half, as a prefill norm leaves it) and
// must give the second's bits.
// Joined cases: the weights one after the other in one buffer and the outputs neighbouring
// columns of one Y (q/k/v as a prefill lays them out), so gemm_parts runs one product of
// all rows; the columns past the last part must stay as they were.
struct PartsCase {
  GgmlType type;
  int64_t t, k;
  int lanes;
  bool joined = false;                 // the parts' weights and outputs side by side
  GgmlType last_type = GgmlType::F32;  // quantized: the third part's own type (F32: as the others)
};

class GemmPartsTest : public ::testing::TestWithParam<PartsCase> {};

TEST_P(GemmPartsTest, EachPartMatchesReference) {
  KILN_REQUIRE_GPU();
  const PartsCase c = GetParam();
  SCOPED_TRACE(std::string(type_name(c.type)) + " t " + std::to_string(c.t) + " k " + std::to_string(c.k) +
               " lanes " + std::to_string(c.lanes) + " last part " + std::string(type_name(c.last_type)));
  std::mt19937_64 rng(900 + uint64_t(c.type) * 7 + uint64_t(c.lanes));
  const bool mixed = c.last_type != GgmlType::F32;
  const GgmlType types[3] = {c.type, c.type, mixed ? c.last_type : c.type};
  auto row_bytes = [&](GgmlType t) { return c.k / traits(t).block_size * int64_t(traits(t).type_size); };
  const int64_t w_stride = row_bytes(c.type), x_stride = c.k + 4;
  const int64_t widths[3] = {131, 64, 35};
  const int64_t offsets[3] = {0, 131, 195}, all_rows = 230;  // joined: part i's first row / column
  const std::vector<float> x = random_floats(rng, size_t(c.t * x_stride), -1.0f, 1.0f);
  const DeviceBuffer x_d = to_device(x);
  std::vector<std::vector<uint8_t>> w(3);
  std::vector<DeviceBuffer> w_d, y_d;
  std::vector<GemmPart> parts;
  for (int i = 0; i < 3; ++i) w[size_t(i)] = random_rows(rng, types[i], widths[i], c.k, row_bytes(types[i]));
  if (c.joined && mixed) {  // outputs side by side, weights of two types apart (their bf16 rows join in the slab)
    y_d.emplace_back(size_t(c.t * (all_rows + 5)) * 4);
    for (int i = 0; i < 3; ++i) {
      w_d.push_back(to_device(w[size_t(i)]));
      parts.push_back({w_d[size_t(i)].as(), widths[i], y_d[0].as<float>() + offsets[i], all_rows + 5});
    }
    parts[2].own_row_bytes = row_bytes(types[2]), parts[2].own_type = types[2];
  } else if (c.joined) {
    std::vector<uint8_t> w_all;
    for (int i = 0; i < 3; ++i)  // the rows only (random_rows leaves slack past them)
      w_all.insert(w_all.end(), w[size_t(i)].begin(), w[size_t(i)].begin() + widths[i] * w_stride);
    w_d.push_back(to_device(w_all));
    y_d.emplace_back(size_t(c.t * (all_rows + 5)) * 4);
    for (int i = 0; i < 3; ++i)
      parts.push_back({static_cast<uint8_t*>(w_d[0].as()) + offsets[i] * w_stride, widths[i],
                       y_d[0].as<float>() + offsets[i], all_rows + 5});
  } else {
    for (int i = 0; i < 3; ++i) {
      w_d.push_back(to_device(w[size_t(i)]));
      y_d.emplace_back(size_t(c.t * (widths[i] + 5)) * 4);
      y_d.back().poison();
    }
    for (int i = 0; i < 3; ++i)
      parts.push_back({w_d[size_t(i)].as(), widths[i], y_d[size_t(i)].as<float>(), widths[i] + 5});
    if (mixed) parts[2].own_row_bytes = row_bytes(types[2]), parts[2].own_type = types[2];
  }

  GemmLanes lanes;
  lanes.count = c.lanes;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&lanes.stream[0], cudaStreamNonBlocking));
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&lanes.fork, cudaEventDisableTiming));
  for (int i = 0; i < c.lanes; ++i) {
    if (i > 0) ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&lanes.stream[i], cudaStreamNonBlocking));
    ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&lanes.join[i], cudaEventDisableTiming));
    ASSERT_EQ(CUBLAS_STATUS_SUCCESS, cublasCreate(&lanes.blas[i]));
  }
  GemmPartsArgs a;
  a.type = c.type, a.w_row_bytes = w_stride, a.k = c.k, a.x = x_d.as<float>(), a.x_stride = x_stride, a.t = c.t;
  a.parts = parts;
  DeviceBuffer scratch(gemm_parts_scratch_bytes(a));
  scratch.poison();
  std::vector<uint16_t> x_rounded;  // packed rows of k, f16 for f16 weights, else bf16
  for (int64_t j = 0; j < c.t; ++j)
    for (int64_t kk = 0; kk < c.k; ++kk) {
      const float v = x[size_t(j * x_stride + kk)];
      x_rounded.push_back(c.type == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v));
    }
  const DeviceBuffer x_half_d = to_device(x_rounded);
  std::vector<float> wrow(size_t(c.k));
  std::vector<std::vector<float>> second(3);  // round 1's outputs
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    for (const DeviceBuffer& y : y_d) y.poison();
    if (round == 2) a.x = nullptr, a.x_half = x_half_d.as();
    KILN_STATUS_OK(gemm_parts(a, lanes, scratch.as(), scratch.bytes()));
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(lanes.stream[0]));  // lane 0 has joined the others
    if (c.joined) {  // the five columns past the parts are untouched (still poison)
      const std::vector<float> y_all = to_host<float>(y_d[0], size_t(c.t * (all_rows + 5)));
      for (int64_t j = 0; j < c.t; ++j)
        for (int64_t col = all_rows; col < all_rows + 5; ++col) {
          const size_t at = size_t(j * (all_rows + 5) + col);
          ASSERT_TRUE(std::isnan(y_all[at])) << "row " << j << " column " << col << " was written: " << y_all[at];
        }
    }
    for (int i = 0; i < 3; ++i) {
      const int64_t n = widths[i], y_stride = c.joined ? all_rows + 5 : n + 5;
      const DeviceBuffer& y_buf = y_d[c.joined ? 0 : size_t(i)];
      const std::vector<float> y_all = to_host<float>(y_buf, size_t(c.t * y_stride));
      if (round == 1) second[size_t(i)] = y_all;
      if (round == 2)
        EXPECT_TRUE(all_equal_bits(y_all, second[size_t(i)], "part " + std::to_string(i) + " over x_half"));
      std::vector<float> got;
      std::vector<double> ref, tol;
      std::vector<std::vector<float>> wdeq(static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) {
        dequantize_row_reference(types[i], w[size_t(i)].data() + r * row_bytes(types[i]), wrow.data(), c.k);
        wdeq[size_t(r)] = wrow;
      }
      for (int64_t j = 0; j < c.t; ++j)
        for (int64_t r = 0; r < n; ++r) {
          double same = 0, mag = 0;
          for (int64_t kk = 0; kk < c.k; ++kk) {
            const float xv = x[size_t(j * x_stride + kk)], wv = wdeq[size_t(r)][size_t(kk)];
            mag += std::fabs(double(xv) * wv);
            same += double(round_as(c.type, xv)) * round_as(c.type, wv);
          }
          got.push_back(y_all[size_t(j * y_stride + (c.joined ? offsets[i] : 0) + r)]);
          ref.push_back(same);
          tol.push_back(1e-4 * mag + 1e-30);
        }
      EXPECT_TRUE(all_close(got, ref, tol, "part " + std::to_string(i) + " vs reference from the same rounded inputs"));
    }
  }
  for (int i = 0; i < c.lanes; ++i) {
    cublasDestroy(lanes.blas[i]);
    cudaEventDestroy(lanes.join[i]);
    cudaStreamDestroy(lanes.stream[i]);
  }
  cudaEventDestroy(lanes.fork);
}

INSTANTIATE_TEST_SUITE_P(
    Types, GemmPartsTest,
    ::testing::Values(PartsCase{GgmlType::F16, 37, 512, 3}, PartsCase{GgmlType::BF16, 64, 256, 3},
                      PartsCase{GgmlType::Q4_0, 37, 512, 3}, PartsCase{GgmlType::Q8_0, 100, 256, 3},
                      PartsCase{GgmlType::Q4_K, 17, 512, 2}, PartsCase{GgmlType::Q6_K, 37, 256, 1},
                      PartsCase{GgmlType::F16, 37, 512, 3, true}, PartsCase{GgmlType::BF16, 64, 256, 1, true},
                      PartsCase{GgmlType::Q4_0, 100, 512, 1, true}, PartsCase{GgmlType::Q8_0, 17, 256, 3, true},
                      PartsCase{GgmlType::Q4_K, 37, 512, 1, false, GgmlType::Q6_K},
                      PartsCase{GgmlType::Q4_K, 100, 512, 1, true, GgmlType::Q6_K},
                      PartsCase{GgmlType::Q6_K, 17, 256, 3, false, GgmlType::Q8_0}),
    [](const ::testing::TestParamInfo<PartsCase>& info) {
      const bool mixed = info.param.last_type != GgmlType::F32;
      return std::string(type_name(info.param.type)) + (mixed ? "_" + std::string(type_name(info.param.last_type)) : "") +
             "_t" + std::to_string(info.param.t) + "_k" + std::to_string(info.param.k) + "_lanes" +
             std::to_string(info.param.lanes) + (info.param.joined ? "_joined" : "");
    });

}  // namespace
}  // namespace kiln::cuda
