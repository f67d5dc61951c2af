// The grouped 16-bit float matvec (backend/cuda/matvec_f16_grouped.h) against a double-
// precision CPU reference on fresh random inputs: f16 and bf16 weights; 1-3 parts with row
// counts that are not multiples of the block's 16 warps; widths that are and are not
// multiples of the kernel's 256-column spans and 2048-column chunks (down to 8 columns, up
// to the 16384 the kernel takes); padded rows; bias; residual accumulate; x RMS-normalized
// inside the launch, with and without the normalized vector written out. Every output is
// poisoned (NaN) first, so a row the kernel did not write fails.
//
// Error bounds:
//  - y: f32 products and sums of the exact 16-bit weights with x (or with the f32 normalized
//    x, within a few ulp of the double one): |y - ref| <= 1e-5 * (sum_i |w_i x_i| + |bias|);
//  - the residual: residual + y rounded once, so bit for bit the host's f32 sum with the y
//    the kernel wrote;
//  - the normalized vector: rsqrt (2 ulp), two rounded products, a sum of squares in another
//    order: within 2e-6 relative of the double rmsnorm.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/matvec_f16_grouped.h"
#include "cuda_test_support.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

struct PartSpec {
  int64_t rows = 0;
  bool bias = false;
  bool accumulate = false;
};

struct Case {
  GgmlType type;
  int64_t cols;
  int64_t row_pad_bytes;  // a multiple of 16
  std::vector<PartSpec> parts;
  bool norm;
  bool write_normed;
};

std::string describe(const Case& c) {
  std::string s = std::string(type_name(c.type)) + " cols " + std::to_string(c.cols) + " pad " +
                  std::to_string(c.row_pad_bytes) + (c.norm ? " norm" : "") + (c.write_normed ? "+normed" : "") +
                  " parts";
  for (const PartSpec& p : c.parts)
    s += " " + std::to_string(p.rows) + (p.bias ? "+bias" : "") + (p.accumulate ? "+acc" : "");
  return s;
}

float weight_value(GgmlType type, const uint8_t* row, int64_t i) {
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  return type == GgmlType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

void run_case(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c));
  const int64_t K = c.cols, row_bytes = 2 * K + c.row_pad_bytes;
  const std::vector<float> x = random_floats(rng, size_t(K), -1.5f, 1.5f);
  const std::vector<float> norm_w = random_floats(rng, size_t(K), 0.5f, 1.5f);
  constexpr float kEps = 1e-5f;

  // What the products see: x, or its RMS norm in double.
  std::vector<double> xn(static_cast<size_t>(K));
  double sum_sq = 0;
  for (float v : x) sum_sq += double(v) * v;
  const double inv = 1.0 / std::sqrt(sum_sq / double(K) + kEps);
  for (int64_t i = 0; i < K; ++i) xn[size_t(i)] = c.norm ? x[size_t(i)] * inv * norm_w[size_t(i)] : x[size_t(i)];

  const DeviceBuffer x_d = to_device(x), norm_w_d = to_device(norm_w);
  DeviceBuffer normed_d(size_t(K) * 4);
  normed_d.poison();

  struct PartData {
    std::vector<uint8_t> w;
    std::vector<float> bias, residual;
    const DeviceBuffer* y_d = nullptr;
    const DeviceBuffer* residual_d = nullptr;
  };
  std::vector<DeviceBuffer> buffers;  // every part's device data, kept alive to the end
  buffers.reserve(4 * c.parts.size());
  std::vector<PartData> data(c.parts.size());
  std::vector<MatvecPart> parts(c.parts.size());
  for (size_t p = 0; p < c.parts.size(); ++p) {
    const PartSpec& spec = c.parts[p];
    PartData& d = data[p];
    d.w = random_rows(rng, c.type, spec.rows, K, row_bytes);
    parts[p].w = buffers.emplace_back(to_device(d.w)).as();
    parts[p].rows = spec.rows;
    d.y_d = &buffers.emplace_back(size_t(spec.rows) * 4);
    d.y_d->poison();
    parts[p].y = d.y_d->as<float>();
    if (spec.bias) {
      d.bias = random_floats(rng, size_t(spec.rows), -2.0f, 2.0f);
      parts[p].add = buffers.emplace_back(to_device(d.bias)).as<float>();
    }
    if (spec.accumulate) {
      d.residual = random_floats(rng, size_t(spec.rows), -3.0f, 3.0f);
      d.residual_d = &buffers.emplace_back(to_device(d.residual));
      parts[p].accumulate = d.residual_d->as<float>();
    }
  }
  F32Input in;
  in.x = x_d.as<float>();
  if (c.norm) {
    in.norm_weight = norm_w_d.as<float>();
    in.eps = kEps;
    if (c.write_normed) in.normed = normed_d.as<float>();
  }
  ASSERT_TRUE(matvec_half_parts_fit(c.type, K, row_bytes, parts, in));
  KILN_STATUS_OK(matvec_half_parts(c.type, K, row_bytes, parts, in, nullptr));
  KILN_CUDA_OK(cudaDeviceSynchronize());

  for (size_t p = 0; p < c.parts.size(); ++p) {
    SCOPED_TRACE("part " + std::to_string(p));
    const PartSpec& spec = c.parts[p];
    const PartData& d = data[p];
    std::vector<double> ref(size_t(spec.rows)), tol(size_t(spec.rows));
    for (int64_t r = 0; r < spec.rows; ++r) {
      const uint8_t* row = d.w.data() + r * row_bytes;
      double sum = 0, magnitude = 0;
      for (int64_t i = 0; i < K; ++i) {
        const double term = double(weight_value(c.type, row, i)) * xn[size_t(i)];
        sum += term;
        magnitude += std::fabs(term);
      }
      if (spec.bias) sum += d.bias[size_t(r)], magnitude += std::fabs(d.bias[size_t(r)]);
      ref[size_t(r)] = sum;
      tol[size_t(r)] = 1e-5 * magnitude;
    }
    const std::vector<float> y = to_host<float>(*d.y_d, size_t(spec.rows));
    EXPECT_TRUE(all_close(y, ref, tol, "y"));
    if (spec.accumulate) {
      std::vector<float> want(size_t(spec.rows));
      for (size_t r = 0; r < want.size(); ++r) want[r] = d.residual[r] + y[r];
      EXPECT_TRUE(all_equal_bits(to_host<float>(*d.residual_d, size_t(spec.rows)), want, "residual += y"));
    }
  }
  if (c.norm && c.write_normed) EXPECT_TRUE(all_close(to_host<float>(normed_d, size_t(K)), xn, 2e-6, 0.0, "normed"));
}

TEST(MatvecHalfGrouped, AwkwardShapesPartsNormAndResidual) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(20261130);
  const Case cases[] = {
      // 25 pieces per row: most lanes idle; rows far fewer than one block's warps.
      {GgmlType::F16, 200, 16, {{1, false, false}, {17, true, true}}, false, false},
      {GgmlType::F16, 8, 0, {{5, true, false}}, true, true},
      // Not a multiple of 256: a partial last span, three chunks.
      {GgmlType::BF16, 4096 + 40, 32, {{100, false, false}, {33, true, false}, {64, false, true}}, true, true},
      // One whole chunk and one span; norm without the normalized vector written.
      {GgmlType::BF16, 2048 + 256, 0, {{999, true, true}}, true, false},
      {GgmlType::F16, 16384, 0, {{70, false, false}}, true, true},
      {GgmlType::F16, 512, 48, {{3, false, false}, {1, true, false}, {2, false, true}}, false, false},
  };
  for (const Case& c : cases) run_case(c, rng);
}

// The shapes of a Llama-3-8B decode layer, as the backend launches them: q/k/v and gate/up
// after the norm, o and down adding into the residual. The grid is smaller than the rows,
// so every block owns several rows.
TEST(MatvecHalfGrouped, LlamaLayerShapes) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(7);
  const Case cases[] = {
      {GgmlType::F16, 4096, 0, {{4096, false, false}, {1024, true, false}, {1024, false, false}}, true, true},
      {GgmlType::F16, 4096, 0, {{14336, false, false}, {14336, false, false}}, true, true},
      {GgmlType::F16, 4096, 0, {{4096, false, true}}, false, false},
      {GgmlType::BF16, 14336, 0, {{4096, true, true}}, false, false},
      // The widest x the kernel takes, 8 chunks per row; 4400 rows: each warp owns one or two
      // rows, a part boundary among them.
      {GgmlType::F16, 16384, 0, {{2000, false, false}, {2400, true, true}}, true, true},
  };
  for (const Case& c : cases) run_case(c, rng);
}

TEST(MatvecHalfGrouped, RefusesWhatItDoesNotTakeNamingTheLimits) {
  alignas(16) static uint8_t weights[64 * 1024];
  alignas(16) static float x[16400 + 4], y[8];
  MatvecPart part;
  part.w = weights, part.rows = 2, part.y = y;
  F32Input in;
  in.x = x;
  const std::vector<MatvecPart> one{part};
  EXPECT_TRUE(matvec_half_parts_fit(GgmlType::F16, 64, 128, one, in));
  EXPECT_TRUE(matvec_half_parts_fit(GgmlType::BF16, 64, 128, one, in));
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::Q4_0, 64, 128, one, in)) << "not a 16-bit float type";
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F32, 64, 256, one, in)) << "f32 weights";
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F16, 12, 32, one, in)) << "columns not a multiple of 8";
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F16, kMaxHalfMatvecCols + 8, 2 * (kMaxHalfMatvecCols + 8), one, in))
      << "wider than shared memory holds";
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F16, 64, 120, one, in)) << "row stride not a multiple of 16";
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F16, 64, 112, one, in)) << "row stride shorter than a row";
  MatvecPart shifted = part;
  shifted.w = weights + 2;
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F16, 64, 128, std::vector<MatvecPart>{shifted}, in)) << "weights misaligned";
  F32Input bad_x = in;
  bad_x.x = x + 1;
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F16, 64, 128, one, bad_x)) << "x misaligned";
  F32Input normed_alone = in;
  normed_alone.normed = x + 8;
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F16, 64, 128, one, normed_alone)) << "normed without a norm weight";
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F16, 64, 128, std::vector<MatvecPart>(kMaxMatvecParts + 1, part), in))
      << "too many parts";
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F16, 64, 128, {}, in)) << "no parts";
  MatvecPart empty = part;
  empty.rows = 0;
  EXPECT_FALSE(matvec_half_parts_fit(GgmlType::F16, 64, 128, std::vector<MatvecPart>{empty}, in)) << "no rows";

  // The launcher refuses the same, saying what it takes, without launching anything.
  const Status s = matvec_half_parts(GgmlType::Q4_0, 64, 128, one, in, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("f16 / bf16"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("multiple of 8"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kiln::cuda
