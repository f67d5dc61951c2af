// Prefill on the CUDA backend with the joined products and the glu writing the down
// product's half input (the defaults) against the plain path (CudaOptions::joined_parts and
// glu_half_input off: separate q/k/v and gate/up outputs, one product per part, glu then
// matmul_add), on llama.cpp's tiny256 models (16 prompt tokens: a prefill batch). The same
// rounded inputs reach the same products; only the joined products' f32 accumulation order
// may differ, so every position's logits must agree within 1e-4 relative L2 (a wrong part,
// row stride or rounding is far above that). F16 and Q4_0 / Q8_0 take the joined products
// (half weights side by side; the quantized ones' one bf16 slab); Q4_K_M's mixed q/k/v
// types keep one product per part over the joined outputs.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_support.h"
#include "model/model_test_util.h"
#include "runtime/synthetic_model.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

class CudaPrefillJoin : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaPrefillJoin, LogitsMatchThePlainPath) {
  KILN_REQUIRE_GPU();
  const std::string type = GetParam();
  KILN_REQUIRE_TESTDATA(gguf_path, "quant/models/tiny256-" + type + ".gguf");
  KILN_REQUIRE_TESTDATA(ids_path, "quant/models/ids.json");
  const std::vector<int32_t> ids = to_ids(read_json(ids_path)["ids"]);
  ASSERT_GE(ids.size(), size_t(9)) << "a prefill of at most 8 tokens takes the decode paths";
  const auto file = gguf::File::open(gguf_path.string());
  std::vector<float> logits[2];
  int vocab = 0;
  for (int plain = 0; plain < 2; ++plain) {
    CudaOptions o;
    o.joined_parts = o.glu_half_input = plain == 0;
    CudaBackend backend(o);
    ASSERT_EQ(backend.options().joined_parts, plain == 0) << "KILN_CUDA_PREFILL_JOIN=0 set?";
    ASSERT_EQ(backend.options().glu_half_input, plain == 0) << "KILN_CUDA_PREFILL_GLU_HALF=0 set?";
    const auto model = Model::load(*file, backend);
    vocab = model->hparams().n_vocab;
    logits[plain] = prefill_all_logits(*model, backend, ids, 128);
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  double worst = 0;
  for (size_t r = 0; r < logits[0].size() / size_t(vocab); ++r) {
    const double err = relative_l2(logits[0].data() + r * vocab, logits[1].data() + r * vocab, vocab);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-4) << type << " position " << r << ": logit[0] joined " << logits[0][r * vocab] << " plain "
                         << logits[1][r * vocab];
  }
  std::printf("[ tiny256-%s ] joined + glu half vs plain prefill: max relative L2 %.3g\n", type.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Types, CudaPrefillJoin, ::testing::Values("F16", "Q4_0", "Q8_0", "Q4_K_M"));

// The norms and the attention writing the next product's rounded input (CudaOptions::
// half_copies, the default) against the products rounding it themselves: the same bits reach
// the same products, so the logits must be equal bit for bit. The model is synthetic, 1024
// wide (the norm's row kernel writes copies for widths of a multiple of 1024), 2 layers, and
// every token's logits are asked for: q/k/v, o and gate/up of each layer and the head take a
// copy, so their count says the path ran.
class CudaPrefillHalfCopies : public ::testing::TestWithParam<GgmlType> {};

TEST_P(CudaPrefillHalfCopies, LogitsEqualTheProductsOwnRounding) {
  KILN_REQUIRE_GPU();
  const GgmlType type = GetParam();
  SyntheticShape shape = synthetic_preset("test-tiny");
  shape.n_embd = 1024, shape.n_head = 8, shape.n_head_kv = 2, shape.head_dim = 128, shape.n_ff = 2048;
  SynthOptions so;
  so.type = type;
  so.q4_k_m = type == GgmlType::Q4_K;
  so.row_pool = true;
  TempGguf tmp("half_copies");
  write_synthetic_model(shape, so, tmp.path);

  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 5) % shape.n_vocab);
  std::vector<float> logits[2];
  for (int copies = 0; copies < 2; ++copies) {
    auto file = gguf::File::open(tmp.path);
    CudaOptions o;
    o.half_copies = copies == 1;
    CudaBackend backend(o);
    ASSERT_EQ(backend.options().half_copies, copies == 1) << "KILN_CUDA_PREFILL_HALF_COPY=0 set?";
    const auto model = Model::load(*file, backend);
    logits[copies] = prefill_all_logits(*model, backend, ids, 64);
    EXPECT_EQ(backend.half_copies_taken(), copies ? 3 * shape.n_layer + 1 : 0)
        << "q/k/v, o and gate/up of every layer, and the head";
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  ASSERT_FALSE(logits[0].empty());
  size_t differing = 0;
  for (size_t i = 0; i < logits[0].size(); ++i) differing += std::memcmp(&logits[0][i], &logits[1][i], 4) != 0;
  EXPECT_EQ(differing, size_t(0)) << type_name(type) << ": " << differing << " of " << logits[0].size()
                                  << " logits differ";
}

INSTANTIATE_TEST_SUITE_P(Types, CudaPrefillHalfCopies, ::testing::Values(GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_K),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(type_name(info.param));
                         });

}  // namespace
}  // namespace kiln::testing
