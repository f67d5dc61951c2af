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

#include <string>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_support.h"
#include "model/model_test_util.h"
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

}  // namespace
}  // namespace kiln::testing
