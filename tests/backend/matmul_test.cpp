// matmul (every SIMD level, 1 and 2 threads) against matmul_reference, for every weight
// type kiln can dequantize, at awkward shapes with strided activations and outputs.
//
// Tolerances, per output y = sum_k w_k x_k (|w|.|x| below means sum_k |w_k| |x_k|):
// - float paths (f32 / f16 / bf16 weights; the scalar level; types without an int8 kernel
//   at the level), which dequantize to f32 and keep x in f32: the only error is f32
//   rounding of the accumulation, so |y - ref| <= 2e-5 * |w|.|x| + 1e-6.
// - int8 paths (quantizes_activations() says which): x is quantized to ggml's q8 format for
//   the weight type (activation_type()), x_k -> xq_k. The result must equal, up to the same
//   f32 slack (against |w|.|xq|), the "ggml reference": sum_k w_k xq_k in double, with
//   kiln's reference quantizers (quant/) making xq, plus, for q8_1, the weights' min times
//   (s - sum of the block's xq) since ggml's dot uses the stored f16 s there. That pins the
//   activation bytes: one level off in one element moves y by ~dx |w_k|, far above the slack.
//   Against matmul_reference the bound is the quantization error itself, computed exactly:
//   sum_k |w_k| |x_k - xq_k| (+ |m_b| |s_b - sum xq| for q8_1). A priori, per element,
//   q8_0 / q8_1: |x - xq| <= d/2 + 127 |d - f16(d)| <= 0.56 d with d = max|x_32-block| / 127;
//   q8_K: <= d/2 with d = max|x_256-block| / 127 (coarser: one scale per 256).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/int8_rows.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "core/half.h"
#include "quant/blocks.h"
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

// One token's activations as the int8 paths see them: xq (dequantized q8 blocks made by
// kiln's reference quantizer) and, per 32-block, the q8_1 correction s - sum(xq) (zero for
// the other formats, whose dots use dx * sum(q)).
struct QuantizedToken {
  std::vector<float> xq, s_excess;
};

QuantizedToken quantize_token(GgmlType act, const float* x, int64_t cols) {
  QuantizedToken out;
  out.xq.resize(size_t(cols));
  out.s_excess.assign(size_t(cols / 32), 0.0f);
  std::vector<uint8_t> blocks(*row_bytes(act, cols));
  quantize_row(act, x, blocks.data(), cols);
  dequantize_row_reference(act, blocks.data(), out.xq.data(), cols);
  if (act == GgmlType::Q8_1) {
    const auto* b = reinterpret_cast<const BlockQ8_1*>(blocks.data());
    for (int64_t i = 0; i < cols / 32; ++i) {
      double sum = 0;
      for (int j = 0; j < 32; ++j) sum += out.xq[size_t(32 * i + j)];
      out.s_excess[size_t(i)] = float(double(f16_to_f32(b[i].s)) - sum);
    }
  }
  return out;
}

// The weights' min of 32-block b for q4_1 / q5_1 (value = d * q + m), else 0.
float block_min(GgmlType type, const uint8_t* row, int64_t b) {
  if (type != GgmlType::Q4_1 && type != GgmlType::Q5_1) return 0;
  uint16_t m;
  std::memcpy(&m, row + b * traits(type).type_size + 2, 2);
  return f16_to_f32(m);
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

    // Per output: |w|.|x|; for the int8 paths the ggml reference, |w|.|xq| and the exact
    // quantization error bound (see the top of the file).
    const GgmlType act = activation_type(type);
    std::vector<QuantizedToken> xq;
    if (act != GgmlType::F32)
      for (int64_t t = 0; t < c.n_tokens; ++t) xq.push_back(quantize_token(act, x.data() + t * x_stride, cols));
    std::vector<double> abs_dot(ref.size()), q8_ref(ref.size()), q8_abs_dot(ref.size()), q8_error(ref.size());
    std::vector<float> wrow(static_cast<size_t>(cols));
    for (int64_t r = 0; r < c.rows; ++r) {
      const uint8_t* row = w.data() + size_t(r) * stride;
      dequantize_row_reference(type, row, wrow.data(), cols);
      for (int64_t t = 0; t < c.n_tokens; ++t) {
        const float* xt = x.data() + t * x_stride;
        const size_t i = size_t(t * y_stride + r);
        double ad = 0;
        for (int64_t k = 0; k < cols; ++k) ad += std::fabs(double(wrow[k]) * xt[k]);
        abs_dot[i] = ad;
        if (xq.empty()) continue;
        const QuantizedToken& q = xq[size_t(t)];
        double y = 0, aq = 0, err = 0;
        for (int64_t k = 0; k < cols; ++k) {
          y += double(wrow[k]) * q.xq[k];
          aq += std::fabs(double(wrow[k]) * q.xq[k]);
          err += std::fabs(double(wrow[k])) * std::fabs(double(xt[k]) - q.xq[k]);
        }
        for (int64_t b = 0; b < cols / 32; ++b) {
          const double m = block_min(type, row, b);
          y += m * q.s_excess[b];
          err += std::fabs(m * q.s_excess[b]);
        }
        q8_ref[i] = y;
        q8_abs_dot[i] = aq;
        q8_error[i] = err;
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
            const double tol = 2e-5 * abs_dot[i] + 1e-6 + (int8 ? q8_error[i] : 0.0);
            if (!(std::fabs(double(y[i]) - ref[i]) <= tol) && ++failures <= 5)
              ADD_FAILURE() << type_name(type) << " " << level_name(level) << " threads=" << pool->size()
                            << " rows=" << c.rows << " cols=" << cols << " n_tokens=" << c.n_tokens << ": y[" << t
                            << "][" << r << "] = " << y[i] << ", reference " << ref[i] << ", tolerance " << tol;
            if (!int8) continue;
            const double q8_tol = 2e-5 * q8_abs_dot[i] + 1e-6;
            if (!(std::fabs(double(y[i]) - q8_ref[i]) <= q8_tol) && ++failures <= 5)
              ADD_FAILURE() << type_name(type) << " " << level_name(level) << " threads=" << pool->size()
                            << " rows=" << c.rows << " cols=" << cols << " n_tokens=" << c.n_tokens << ": y[" << t
                            << "][" << r << "] = " << y[i] << ", ggml reference (" << type_name(act)
                            << " activations) " << q8_ref[i] << ", tolerance " << q8_tol;
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

// Activations with the cases that trip rounding: values exactly half-way between levels
// (after the scale is derived from the block maximum), ties of +max and -max, zero blocks,
// tiny and huge magnitudes.
std::vector<float> tricky_activations(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = normal(rng);
  for (int64_t b = 0; b + 32 <= n; b += 32) {
    switch ((b / 32) % 6) {
      case 0: {  // halves: max 127 makes d = 1, so k + 0.5 is a tie
        x[size_t(b)] = 127.0f;
        for (int j = 1; j < 32; ++j) x[size_t(b + j)] = float(int(rng() % 200) - 100) + 0.5f;
        break;
      }
      case 1: x[size_t(b + 3)] = -4.0f, x[size_t(b + 9)] = 4.0f; break;  // +-max tie
      case 2: std::fill(x.begin() + b, x.begin() + b + 32, 0.0f); break;
      case 3: for (int j = 0; j < 32; ++j) x[size_t(b + j)] *= 1e-6f; break;
      case 4: for (int j = 0; j < 32; ++j) x[size_t(b + j)] *= 1e3f; break;
      default: break;
    }
  }
  return x;
}

// The SIMD activation quantizers write the same bytes as kiln's reference quantizers
// (which are byte-identical to ggml's reference).
TEST(MatmulActivations, QuantizersMatchReference) {
  std::mt19937 rng(5);
  const int64_t cols = 2048;
  for (int trial = 0; trial < 4; ++trial) {
    const std::vector<float> x = tricky_activations(cols, rng);
    if (cpu_features().avx512) {
      for (GgmlType act : {GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K}) {
        const size_t bytes = *row_bytes(act, cols);
        std::vector<uint8_t> want(bytes), got(bytes, 0xEE);
        quantize_row(act, x.data(), want.data(), cols);
        avx512::quantize_activations(act, x.data(), cols, got.data());
        for (size_t i = 0; i < bytes; ++i)
          ASSERT_EQ(int(got[i]), int(want[i])) << type_name(act) << " trial " << trial << " byte " << i;
      }
    }
    if (cpu_features().avx2) {
      std::vector<BlockQ8_0> want(size_t(cols / 32));
      quantize_row(GgmlType::Q8_0, x.data(), want.data(), cols);
      std::vector<int8_t> q(static_cast<size_t>(cols));
      std::vector<float> dx(size_t(cols / 32));
      std::vector<int32_t> sum(size_t(cols / 32));
      Q8Token tk{q.data(), dx.data(), sum.data()};
      avx2::prepare_q8_token(x.data(), cols, tk);
      for (int64_t b = 0; b < cols / 32; ++b) {
        ASSERT_EQ(dx[size_t(b)], f16_to_f32(want[size_t(b)].d)) << "avx2 q8_0 scale of block " << b;
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) {
          ASSERT_EQ(int(q[size_t(32 * b + j)]), int(want[size_t(b)].qs[j])) << "avx2 q8_0 element " << 32 * b + j;
          s += q[size_t(32 * b + j)];
        }
        ASSERT_EQ(sum[size_t(b)], s) << "avx2 q8_0 sum of block " << b;
      }
    }
  }
}

}  // namespace
}  // namespace kiln::cpu
