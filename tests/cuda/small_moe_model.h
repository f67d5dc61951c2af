#pragma once
// A small Qwen3-MoE Q4_K_M (kiln synth's mix: q4_K gate / up experts, q4_K or q6_K downs; two
// layers of 16 experts, 4 used, width 512) decoded greedily through a CUDA backend of given
// options: what the tests that compare two decode paths of the MoE layer on a whole model share
// (moe_tiles_test.cpp, router_sums_test.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "model/model_test_util.h"
#include "runtime/synthetic_model.h"

namespace kiln::cuda::testing {

struct SmallMoeDecode {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // every step's
  int64_t ops = 0;            // ops the backend recorded for the decode
  size_t tiled_stacks = 0;    // expert stacks in the row-tile layout
  int vocab = 0;
};

constexpr int kSmallMoeLayers = 2;

// The model, `n_head` attention heads of 128 (the attention output product's width).
inline void write_small_moe(const std::string& path, int n_head) {
  SyntheticShape shape = synthetic_preset("qwen3-30b-a3b");
  shape.n_layer = kSmallMoeLayers, shape.n_embd = 512, shape.n_head = n_head, shape.n_head_kv = 2;
  shape.head_dim = 128, shape.n_expert = 16, shape.n_expert_used = 4, shape.n_ff_expert = 256, shape.n_vocab = 512;
  SynthOptions o;
  o.type = GgmlType::Q4_K;
  o.q4_k_m = true;
  o.row_pool = true;
  write_synthetic_model(shape, o, path);
}

// `steps` greedy steps after a prompt of 5 tokens (its pass first, then one token a pass).
inline SmallMoeDecode decode_small_moe(const std::string& path, const CudaOptions& options, int steps) {
  auto file = gguf::File::open(path);
  CudaBackend backend(options);
  std::unique_ptr<Model> model = Model::load(*file, backend);
  SmallMoeDecode d;
  d.vocab = model->hparams().n_vocab;
  const int64_t before = backend.recorded_ops();
  d.ids = kiln::testing::greedy_decode(*model, backend, {1, 17, 300, 42, 5}, steps, 64, &d.logits);
  d.ops = backend.recorded_ops() - before;
  d.tiled_stacks = backend.tiled_expert_stacks();
  return d;
}

// The same tokens, and every step's logits of `got` within `tol` relative L2 of `want`'s.
inline void expect_same_decode(const SmallMoeDecode& got, const SmallMoeDecode& want, double tol,
                               const std::string& what) {
  EXPECT_EQ(got.ids, want.ids) << what << ": greedy tokens";
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  ASSERT_GT(want.vocab, 0) << what;
  for (int64_t r = 0; r < int64_t(want.logits.size()) / want.vocab; ++r)
    EXPECT_LE(kiln::testing::relative_l2(got.logits.data() + r * want.vocab, want.logits.data() + r * want.vocab,
                                         want.vocab),
              tol)
        << what << ", step " << r << ": relative L2";
}

}  // namespace kiln::cuda::testing
