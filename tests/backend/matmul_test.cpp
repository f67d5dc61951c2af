// matmul (every SIMD level, 1 and 2 threads) against matmul_reference, for every weight
// type kiln can dequantize, at awkward shapes with strided activations and outputs.
//
// Tolerances, per output y = sum_k w_k x_k (|w|.|x| below means sum_k |w_k| |x_k|):
// - float paths (f32 / f16 / bf16 weights; the scalar level; types without an int8 kernel
//   at the level), which dequantize to f32 and keep x in f32: the only error is f32
//   rounding of the accumulation, so |y - ref| <= 2e-5 * |w|.|x| + 1e-6.
// - int8 paths (quantizes_activations() says which): x is quantized per block of 32 to
//   q = round(x / dx), dx = max|x_block| / 127, so each x_k moves by at most dx / 2 and
//   |y - ref| <= sum_blocks (dx_b / 2) * sum_{k in b} |w_k|, plus the same f32 slack.
//   This bound is exact (not statistical); for Gaussian data it is ~1e-2 of |w|.|x|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/int8_rows.h"
#include "backend/cpu/matmul.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "quant/codec.h"
#include "quant/quant.h"

namespace kiln::cpu {
namespace {

std::vector<GgmlType> dequantizable_types() {
  std::vector<GgmlType> out;
  size_t count = 0;
  const TypeTraits* all = all_types(&count);
  for (size_t i = 0; i < count; ++i) {
    const GgmlType t = all[i].type;
    if (t == GgmlType::F64 || t == GgmlType::I8 || t == GgmlType::I16 || t == GgmlType::I32 || t == GgmlType::I64)
      continue;  // not weight types
    if (find_codec(t)) out.push_back(t);
  }
  return out;
}

// Random weights: quantized from Gaussian floats where kiln can quantize the type, else
// random block bytes, redrawn per block until the block dequantizes to finite values of
// sane size (random half-precision scales can be huge or NaN).
std::vector<uint8_t> random_weights(GgmlType type, int64_t rows, int64_t cols, size_t row_stride, std::mt19937& rng) {
  std::vector<uint8_t> w(row_stride * size_t(rows), 0xEE);  // padding bytes are junk
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const TypeTraits& tr = traits(type);
  std::vector<float> src(static_cast<size_t>(cols)), check(tr.block_size);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + size_t(r) * row_stride;
    if (can_quantize(type)) {
      for (auto& v : src) v = normal(rng) * 0.5f;
      quantize_row(type, src.data(), row, cols);
      continue;
    }
    for (int64_t b = 0; b < cols / tr.block_size; ++b) {
      uint8_t* blk = row + size_t(b) * tr.type_size;
      for (int attempt = 0;; ++attempt) {
        for (uint32_t i = 0; i < tr.type_size; ++i) blk[i] = uint8_t(rng());
        dequantize_row_reference(type, blk, check.data(), tr.block_size);
        const bool sane = std::all_of(check.begin(), check.end(), [](float v) { return std::isfinite(v) && std::fabs(v) < 1e3f; });
        if (sane) break;
        if (attempt > 10000) {
          ADD_FAILURE() << "no sane random block for " << type_name(type);
          return w;
        }
      }
    }
  }
  return w;
}

struct Case {
  int64_t rows, blocks, n_tokens;
};

// Every rows x n_tokens pair, with the column count rotating through 1, 2, 3 and 9 blocks
// (9 covers whole 128-element quads plus a tail for the 32-blocks).
std::vector<Case> cases() {
  const int64_t rows[] = {1, 7, 33, 257};
  const int64_t tokens[] = {1, 3, 17, 64};
  const int64_t blocks[] = {1, 2, 3, 9};
  std::vector<Case> out;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) out.push_back({rows[i], blocks[(i + j) % 4], tokens[j]});
  return out;
}

const char* level_name(SimdLevel l) {
  return l == SimdLevel::Scalar ? "scalar" : l == SimdLevel::Avx2 ? "avx2" : "avx512";
}

class MatmulTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulTest, MatchesReference) {
  const GgmlType type = GetParam();
  const TypeTraits& tr = traits(type);
  std::mt19937 rng(1234 + uint32_t(type));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool pool1(1), pool2(2);
  std::vector<SimdLevel> levels = {SimdLevel::Scalar};
  if (cpu_features().avx2) levels.push_back(SimdLevel::Avx2);
  if (cpu_features().avx512) levels.push_back(SimdLevel::Avx512);

  for (const Case& c : cases()) {
    const int64_t cols = c.blocks * tr.block_size;
    const size_t stride = *row_bytes(type, cols) + 3;  // padded rows
    const auto w = random_weights(type, c.rows, cols, stride, rng);
    if (HasFatalFailure()) return;
    const int64_t x_stride = cols + 5, y_stride = c.rows + 3;
    std::vector<float> x(size_t(x_stride * c.n_tokens));
    for (auto& v : x) v = normal(rng);
    for (int64_t t = 0; t < c.n_tokens; ++t) x[size_t(t * x_stride + (t % cols))] *= 8;  // an outlier per token

    MatmulArgs args{type, w.data(), stride, c.rows, cols, x.data(), x_stride, c.n_tokens, nullptr, y_stride};
    std::vector<float> ref(size_t(y_stride * c.n_tokens), 0.0f);
    args.y = ref.data();
    matmul_reference(args);

    // Per output: |w|.|x| and the int8 bound sum_b (dx_b / 2) * sum_{k in b} |w_k|.
    std::vector<double> abs_dot(ref.size()), int8_bound(ref.size());
    std::vector<float> wrow(static_cast<size_t>(cols));
    for (int64_t r = 0; r < c.rows; ++r) {
      dequantize_row_reference(type, w.data() + size_t(r) * stride, wrow.data(), cols);
      for (int64_t t = 0; t < c.n_tokens; ++t) {
        const float* xt = x.data() + t * x_stride;
        double ad = 0, ib = 0;
        for (int64_t b = 0; b < cols / 32 || (b == 0 && cols < 32); ++b) {
          const int64_t k0 = 32 * b, k1 = std::min<int64_t>(cols, k0 + 32);
          double amax = 0, wabs = 0;
          for (int64_t k = k0; k < k1; ++k) {
            amax = std::max(amax, double(std::fabs(xt[k])));
            wabs += std::fabs(wrow[k]);
            ad += std::fabs(double(wrow[k]) * xt[k]);
          }
          ib += amax / 127.0 / 2.0 * wabs;
        }
        abs_dot[size_t(t * y_stride + r)] = ad;
        int8_bound[size_t(t * y_stride + r)] = ib;
      }
    }

    for (SimdLevel level : levels)
      for (ThreadPool* pool : {&pool1, &pool2}) {
        std::vector<float> y(ref.size(), -777.0f);  // padding must stay untouched
        args.y = y.data();
        matmul(args, *pool, level);
        const bool int8 = quantizes_activations(type, c.n_tokens, level);
        int failures = 0;
        for (int64_t t = 0; t < c.n_tokens; ++t)
          for (int64_t r = 0; r < y_stride; ++r) {
            const size_t i = size_t(t * y_stride + r);
            if (r >= c.rows) {
              ASSERT_EQ(y[i], -777.0f) << "padding written at token " << t << " column " << r;
              continue;
            }
            const double tol = 2e-5 * abs_dot[i] + 1e-6 + (int8 ? int8_bound[i] : 0.0);
            if (!(std::fabs(double(y[i]) - ref[i]) <= tol) && ++failures <= 5)
              ADD_FAILURE() << type_name(type) << " " << level_name(level) << " threads=" << pool->size()
                            << " rows=" << c.rows << " cols=" << cols << " n_tokens=" << c.n_tokens << ": y[" << t
                            << "][" << r << "] = " << y[i] << ", reference " << ref[i] << ", tolerance " << tol;
          }
        ASSERT_EQ(failures, 0);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTest, ::testing::ValuesIn(dequantizable_types()),
                         [](const ::testing::TestParamInfo<GgmlType>& info) { return std::string(type_name(info.param)); });

// Bad arguments are refused on the calling thread with a message naming the problem.
TEST(Matmul, RefusesBadArguments) {
  ThreadPool pool(2);
  std::vector<uint8_t> w(1024);
  std::vector<float> x(64), y(64);
  MatmulArgs args{GgmlType::Q4_0, w.data(), 18, 2, 33, x.data(), 33, 1, y.data(), 2};  // 33: not whole blocks
  EXPECT_THROW(matmul(args, pool), Error);
  args.cols = 64;  // a row of 64 q4_0 elements is 36 bytes, more than the stride of 18
  EXPECT_THROW(matmul(args, pool), Error);
}

// The int8 unpacking reproduces the reference dequantization: scale * q + offset.
TEST(Int8Rows, UnpackMatchesDequantize) {
  std::mt19937 rng(99);
  for (GgmlType type : dequantizable_types()) {
    const Int8Layout layout = int8_layout(type);
    if (layout.group == 0 || !can_quantize(type)) continue;
    const int64_t cols = 512;
    const auto w = random_weights(type, 1, cols, *row_bytes(type, cols), rng);
    std::vector<int8_t> q(cols);
    std::vector<float> scale(cols / layout.group), offset(cols / layout.group, 0.0f), ref(cols);
    std::vector<int32_t> qsum(cols / layout.group);
    unpack_int8_row(type, w.data(), cols, {q.data(), scale.data(), offset.data(), qsum.data()});
    dequantize_row_reference(type, w.data(), ref.data(), cols);
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t g = k / layout.group;
      const float v = scale[g] * float(q[k]) + offset[g];
      ASSERT_NEAR(v, ref[k], 1e-6f * (1 + std::fabs(ref[k]))) << type_name(type) << " element " << k;
    }
    for (int64_t g = 0; g < cols / layout.group; ++g) {
      int32_t s = 0;
      for (int j = 0; j < layout.group; ++j) s += q[g * layout.group + j];
      ASSERT_EQ(qsum[g], s) << type_name(type) << " group " << g;
    }
  }
}

}  // namespace
}  // namespace kiln::cpu
