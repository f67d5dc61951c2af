// Weights in the interleaved layout (backend/cuda/decode_layout.h): its readers give the block
// layout's bits, the others refuse it.
//  - dequantize_rows (prefill's bf16 slabs, get_rows): whole matrices, slabs from a whole tile
//    and from inside one, gathers with ids out of range, equal bit for bit to the same calls on
//    the block layout;
//  - the grouped products give the block layout's bits; a part starting inside a tile, and the
//    general matvec kernels, are refused;
//  - whole models (tiny256 Q4_0 and Q8_0, reference data): 16 greedy steps with the weights
//    in the layout give the tokens and the logits (bit for bit) of the block layout.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/decode_layout.h"
#include "backend/cuda/dequant.h"
#include "backend/cuda/matvec.h"
#include "backend/cuda/matvec_grouped.h"
#include "cuda_test_support.h"
#include "model/model_test_util.h"
#include "option_decode.h"
#include "quant/quant.h"
#include "support/testdata.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

struct Shape {
  GgmlType type;
  int64_t rows, cols;
  int64_t row_bytes() const { return cols / int64_t(traits(type).block_size) * int64_t(traits(type).type_size); }
  std::string name() const {  // a test name's part: letters, digits, underscores
    return std::string(type_name(type)) + "_" + std::to_string(rows) + "x" + std::to_string(cols);
  }
};

// Each test: the shape's weights, random, in the block layout (host).
class DecodeLayoutReaders : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    KILN_REQUIRE_GPU();
    host = random_rows(rng, c.type, c.rows, c.cols, c.row_bytes());
  }
  const Shape c = GetParam();
  std::mt19937_64 rng{uint64_t(c.rows * 131 + c.cols)};
  std::vector<uint8_t> host;
};

TEST_P(DecodeLayoutReaders, DequantizeRowsReadsTheLayout) {
  const DeviceBuffer plain = to_device(host), permuted = to_device_interleaved(c.type, host, c.rows, c.cols);
  const int64_t tile_rows = interleave_tile_rows(c.cols / 256);
  const std::vector<int32_t> ids = {5 % int32_t(c.rows), 0, int32_t(c.rows - 1), -1, int32_t(c.rows), 2};
  const DeviceBuffer ids_d = to_device(ids);

  // `rows` rows from `first` (or the gather of ids_d), as f32 or bf16, from w.
  auto dequant = [&](const DeviceBuffer& w, int64_t first, int64_t rows, bool gather, OutType out,
                     std::vector<uint8_t>& got) -> Status {
    const int64_t n = gather ? int64_t(ids.size()) : rows;
    const size_t out_bytes = size_t(n * c.cols) * (out == OutType::F32 ? 4 : 2);
    DeviceBuffer dst(out_bytes);
    dst.poison();
    DequantArgs a;
    a.type = c.type, a.src = static_cast<const uint8_t*>(w.as()) + first * c.row_bytes();
    a.src_row_bytes = c.row_bytes();
    a.rows = n, a.cols = c.cols, a.dst = dst.as(), a.dst_stride = c.cols, a.out = out;
    if (gather) a.ids = ids_d.as<int32_t>(), a.src_rows = c.rows;
    const Status s = dequantize_rows(a, nullptr);
    if (s.ok()) {
      EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
      got = to_host<uint8_t>(dst, out_bytes);
    }
    return s;
  };
  for (OutType out : {OutType::F32, OutType::BF16}) {
    for (const auto [first, rows, gather] : {std::tuple{int64_t(0), c.rows, false},
                                             std::tuple{tile_rows, c.rows - tile_rows, false},
                                             std::tuple{int64_t(1), c.rows - 2, false},  // inside a tile
                                             std::tuple{int64_t(0), int64_t(0), true}}) {
      SCOPED_TRACE("out " + std::to_string(int(out)) + " first " + std::to_string(first) +
                   (gather ? " gather" : ""));
      std::vector<uint8_t> want, got;
      KILN_STATUS_OK(dequant(plain, first, rows, gather, out, want));
      KILN_STATUS_OK(dequant(permuted, first, rows, gather, out, got));
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size())) << "dequantized bytes differ";
    }
  }
  unregister_interleaved(permuted.as());
}

TEST_P(DecodeLayoutReaders, GroupedProductsReadTheLayout) {
  const DeviceBuffer x_d = to_device(random_floats(rng, size_t(c.cols), -2.0f, 2.0f));
  const DeviceBuffer plain = to_device(host);
  DeviceBuffer xq_d(size_t(c.cols)), xds_d(size_t(c.cols / 32) * 8);
  const Q8Vector xq{xq_d.as<int8_t>(), xds_d.as<float2>(), c.cols};
  KILN_STATUS_OK(quantize_q8(x_d.as<float>(), c.cols, xq, nullptr));

  auto run = [&](const DeviceBuffer& w, int64_t first_row, std::vector<float>& y) -> Status {
    DeviceBuffer y_d(size_t(c.rows) * 4);
    y_d.poison();
    MatvecPart part;
    part.w = static_cast<const uint8_t*>(w.as()) + first_row * c.row_bytes(), part.rows = c.rows - first_row;
    part.y = y_d.as<float>();
    const Status s = matvec_q8_parts(c.type, c.cols, c.row_bytes(), std::span(&part, 1), xq, nullptr);
    if (s.ok()) {
      EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
      y = to_host<float>(y_d, size_t(part.rows));
    }
    return s;
  };
  std::vector<float> want, got;
  KILN_STATUS_OK(run(plain, 0, want));
  const DeviceBuffer interleaved = to_device_interleaved(c.type, host, c.rows, c.cols);
  KILN_STATUS_OK(run(interleaved, 0, got));
  EXPECT_TRUE(all_equal_bits(got, want, "products from the interleaved layout"));
  if (interleave_tile_rows(c.cols / 256) > 1)
    EXPECT_FALSE(run(interleaved, 1, got).ok()) << "a part starting inside a tile";
  unregister_interleaved(interleaved.as());
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeLayoutReaders,
                         ::testing::Values(Shape{GgmlType::Q4_0, 64, 4096}, Shape{GgmlType::Q8_0, 64, 4096},
                                           Shape{GgmlType::Q4_0, 24, 14336}, Shape{GgmlType::Q8_0, 10, 14336},
                                           Shape{GgmlType::Q4_0, 18, 3840}, Shape{GgmlType::Q8_0, 40, 2048},
                                           Shape{GgmlType::Q4_K, 64, 4096}, Shape{GgmlType::Q4_K, 10, 14336},
                                           Shape{GgmlType::Q6_K, 64, 4096}, Shape{GgmlType::Q6_K, 10, 14336},
                                           Shape{GgmlType::Q6_K, 12, 6144}),
                         [](const ::testing::TestParamInfo<Shape>& info) { return info.param.name(); });

}  // namespace
}  // namespace kiln::cuda

namespace kiln::testing {
namespace {

// 16 greedy steps of tiny256 with its q4_0 / q8_0 / q4_K weights in the block layout and in
// the interleaved layout (every matrix that can take it, however narrow; Q4_K_M's second layer
// keeps q / k / v in blocks, for its q6_K v): the same tokens and the same logits, bit for bit.
void expect_same_decode(const char* model) {
  KILN_REQUIRE_GPU();
  KILN_REQUIRE_TESTDATA(gguf_path, std::string("quant/models/") + model);
  KILN_REQUIRE_TESTDATA(ids_path, "quant/models/ids.json");
  const std::vector<int32_t> prompt = tiny256_prompt(read_json(ids_path));
  const auto file = gguf::File::open(gguf_path.string());
  CudaOptions block_layout;
  block_layout.interleaved_decode = false;
  const OptionDecode plain = decode_with_options(*file, block_layout, prompt);
  CudaOptions all_interleaved;
  all_interleaved.interleaved_min_cols = 0, all_interleaved.interleaved_q4_k = cuda::kLayoutAll;
  all_interleaved.interleaved_q6_k = cuda::kLayoutAll;
  bool took_layout = false;
  auto check_layout = [&](const Model& m) {
    took_layout = cuda::is_interleaved(m.weights().layers[0].ffn_gate.data, 1);
  };
  const OptionDecode interleaved = decode_with_options(*file, all_interleaved, prompt, GgmlType::F32, check_layout);
  EXPECT_TRUE(took_layout) << "the weights were not permuted into the layout";
  EXPECT_EQ(interleaved.tokens, plain.tokens);
  EXPECT_TRUE(cuda::testing::all_equal_bits(interleaved.logits, plain.logits, "logits"));
}

TEST(DecodeLayoutModel, Tiny256Q4_0DecodesTheSame) { expect_same_decode("tiny256-Q4_0.gguf"); }
TEST(DecodeLayoutModel, Tiny256Q8_0DecodesTheSame) { expect_same_decode("tiny256-Q8_0.gguf"); }
TEST(DecodeLayoutModel, Tiny256Q4_K_MDecodesTheSame) { expect_same_decode("tiny256-Q4_K_M.gguf"); }

}  // namespace
}  // namespace kiln::testing
