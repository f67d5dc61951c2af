// A Q4_K_M Llama decoded on the CUDA backend with the two-format q/k/v launch (q4_K q/k and
// a q6_K v as one launch that takes rope_kv_store into its epilogue) against the composed
// path it replaces (one launch per type, then rope_kv_store: CudaOptions::mixed_parts off).
// The model is synthetic (kiln synth's Q4_K_M mix over 2 layers: layer 1's attn_v is q6_K)
// at widths the two-format launch takes (2048). Both paths do the same per-row arithmetic,
// so every decode step's logits must agree within 1e-6 relative L2 (a wrong row, part,
// rotation or cache slot is far above that) and the greedy tokens must be the same; the
// two-format side must record fewer ops (the fusion ran).
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_support.h"
#include "model/model_test_util.h"
#include "runtime/synthetic_model.h"

namespace kiln::testing {
namespace {

TEST(MixedQkvModel, TwoFormatLaunchMatchesOneLaunchPerType) {
  KILN_REQUIRE_GPU();
  SyntheticShape shape = synthetic_preset("test-tiny");
  shape.n_embd = 2048, shape.n_head = 16, shape.n_head_kv = 4, shape.head_dim = 128, shape.n_ff = 2048;
  SynthOptions o;
  o.type = GgmlType::Q4_K;
  o.q4_k_m = true;
  o.row_pool = true;
  TempGguf tmp("mixed_qkv");
  write_synthetic_model(shape, o, tmp.path);

  const std::vector<int32_t> prompt = {1, 17, 300, 42, 5};
  const int steps = 8;
  std::vector<int32_t> ids[2];
  std::vector<float> logits[2];
  int64_t ops[2] = {0, 0};
  int vocab = 0;
  for (int mixed = 0; mixed < 2; ++mixed) {
    auto file = gguf::File::open(tmp.path);
    CudaOptions co;
    co.mixed_parts = mixed == 1;
    auto backend = std::make_unique<CudaBackend>(co);
    std::unique_ptr<Model> model = Model::load(*file, *backend);
    vocab = model->hparams().n_vocab;
    ids[mixed] = greedy_decode(*model, *backend, prompt, steps, 64, &logits[mixed]);
    ops[mixed] = backend->recorded_ops();
  }
  EXPECT_EQ(ids[1], ids[0]) << "greedy tokens";
  ASSERT_EQ(logits[1].size(), logits[0].size());
  ASSERT_GT(vocab, 0);
  const int64_t rows = int64_t(logits[0].size()) / vocab;
  ASSERT_GT(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const double err = relative_l2(logits[1].data() + r * vocab, logits[0].data() + r * vocab, vocab);
    EXPECT_LE(err, 1e-6) << "step " << r << ": two-format launch vs one launch per type, relative L2";
  }
  EXPECT_LT(ops[1], ops[0]) << "ops recorded with the two-format launch (" << ops[1] << ") vs without (" << ops[0]
                            << ")";
}

}  // namespace
}  // namespace kiln::testing
