// Device dequantization and the embedding gather (backend/cuda/dequant.h) against the scalar
// reference dequantizers. Bound: bit-identical (f32 out), and bit-identical after round to
// nearest even (bf16 / f16 out).
#include "backend/cuda/dequant.h"
#include "cuda_test_support.h"
#include "quant/quant.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

class DequantTest : public ::testing::TestWithParam<GgmlType> {};

std::vector<float> reference_rows(GgmlType type, const std::vector<uint8_t>& data, int64_t stride,
                                  const std::vector<int64_t>& rows, int64_t cols) {
  std::vector<float> out(rows.size() * size_t(cols));
  for (size_t r = 0; r < rows.size(); ++r)
    dequantize_row_reference(type, data.data() + rows[r] * stride, out.data() + r * size_t(cols), cols);
  return out;
}

TEST_P(DequantTest, RowsBitExactToF32AndRoundedToBf16F16) {
  KILN_REQUIRE_GPU();
  const GgmlType type = GetParam();
  const TypeTraits& t = traits(type);
  std::mt19937_64 rng(300 + uint64_t(type));
  for (int64_t cols : {256, 2816}) {
    const int64_t rows = 33, stride = cols / t.block_size * t.type_size + (t.block_size == 1 ? 0 : 2);
    const std::vector<uint8_t> w = random_rows(rng, type, rows, cols, stride);
    std::vector<int64_t> all(rows);
    for (int64_t r = 0; r < rows; ++r) all[r] = r;
    const std::vector<float> ref = reference_rows(type, w, stride, all, cols);
    const DeviceBuffer w_d = to_device(w);
    for (OutType out : {OutType::F32, OutType::BF16, OutType::F16}) {
      SCOPED_TRACE(std::string(type_name(type)) + " cols " + std::to_string(cols) + " out " + std::to_string(int(out)));
      const int64_t dst_stride = cols + 8;  // strided output
      const size_t esize = out == OutType::F32 ? 4 : 2;
      DeviceBuffer dst(size_t(rows * dst_stride) * esize);
      dst.poison();
      DequantArgs a;
      a.type = type;
      a.src = w_d.as();
      a.src_row_bytes = stride;
      a.rows = rows;
      a.cols = cols;
      a.dst = dst.as();
      a.dst_stride = dst_stride;
      a.out = out;
      KILN_STATUS_OK(dequantize_rows(a, nullptr));
      std::vector<float> got, want;
      if (out == OutType::F32) {
        const std::vector<float> all_out = to_host<float>(dst, size_t(rows * dst_stride));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < cols; ++i) got.push_back(all_out[r * dst_stride + i]), want.push_back(ref[r * cols + i]);
      } else {
        const std::vector<uint16_t> all_out = to_host<uint16_t>(dst, size_t(rows * dst_stride));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < cols; ++i) {
            const uint16_t h = all_out[r * dst_stride + i];
            const float v = ref[r * cols + i];
            got.push_back(out == OutType::BF16 ? bf16_to_f32(h) : f16_to_f32(h));
            want.push_back(out == OutType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v)));
          }
      }
      EXPECT_TRUE(all_equal_bits(got, want, "dequantized rows"));
    }
  }
}

TEST_P(DequantTest, GatherRowsByIdWithRepeatsAndBadIds) {
  KILN_REQUIRE_GPU();
  const GgmlType type = GetParam();
  const TypeTraits& t = traits(type);
  std::mt19937_64 rng(400 + uint64_t(type));
  const int64_t table_rows = 1000, cols = 512, stride = cols / t.block_size * t.type_size;
  const std::vector<uint8_t> table = random_rows(rng, type, table_rows, cols, stride);
  std::vector<int32_t> ids = {0, 999, 5, 5, 731, -1, 1000, 17, 0};
  std::uniform_int_distribution<int> pick(0, int(table_rows) - 1);
  for (int i = 0; i < 30; ++i) ids.push_back(pick(rng));
  const DeviceBuffer table_d = to_device(table), ids_d = to_device(ids);
  const int64_t out_stride = cols + 4;
  DeviceBuffer out(ids.size() * size_t(out_stride) * 4);
  out.poison();
  KILN_STATUS_OK(get_rows(type, table_d.as(), stride, table_rows, cols, ids_d.as<int32_t>(), int64_t(ids.size()),
                          out.as<float>(), out_stride, nullptr));
  const std::vector<float> all_out = to_host<float>(out, ids.size() * size_t(out_stride));
  std::vector<float> got, want;
  std::vector<float> row(static_cast<size_t>(cols));
  for (size_t r = 0; r < ids.size(); ++r) {
    const bool valid = ids[r] >= 0 && ids[r] < table_rows;
    if (valid) dequantize_row_reference(type, table.data() + ids[r] * stride, row.data(), cols);
    for (int64_t i = 0; i < cols; ++i) {
      got.push_back(all_out[r * out_stride + i]);
      want.push_back(valid ? row[i] : std::nanf(""));  // an id outside the table gives NaN
    }
  }
  EXPECT_TRUE(all_equal_bits(got, want, "gathered rows"));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantTest,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                                           GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K,
                                           GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                                           GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(type_name(info.param));
                         });

}  // namespace
}  // namespace kiln::cuda
