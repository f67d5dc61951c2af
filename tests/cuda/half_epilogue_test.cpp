// The CUDA backend's f16 / bf16 gate/up products taking the glu into their epilogue
// (CudaOptions::half_epilogues), against the same ops recorded apart (a synchronize()
// between them records the held products on their own), bit for bit: the activation, up's
// rows and the normed input, for every activation, after rmsnorm_matmul_parts and after
// matmul_parts, for 1 and 3 tokens. recorded_ops() says whether the fusion ran; an
// activation written elsewhere than over gate or up, and a backend with the epilogues off,
// must not fuse and give the same values. (The rope + cache-store epilogue of the same
// launches: pair_epilogue_test.cpp.)
// And one whole model: tiny256-F16 (reference data) decoded greedily with the epilogues and
// without: the same tokens, the same logits (each op gives the same bits either way).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "fused_ops_fixture.h"
#include "model/model_test_util.h"
#include "option_decode.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

struct GluCase {
  GgmlType type;
  int64_t K, N, T;
  Activation act;
  bool norm;      // rmsnorm_matmul_parts (else matmul_parts)
  bool in_place;  // glu(gate, up, act, gate), else into a tensor of its own
};

class HalfGluEpilogue : public FusedOps {};

TEST_F(HalfGluEpilogue, GateUpProductsThenGluMatchTheOpsApart) {
  const GluCase cases[] = {
      {GgmlType::F16, 4096, 1024, 1, Activation::Silu, true, true},
      {GgmlType::BF16, 1032, 300, 3, Activation::Silu, true, true},
      {GgmlType::F16, 520, 77, 3, Activation::GeluTanh, false, true},
      {GgmlType::BF16, 2048, 130, 1, Activation::SwigluOai, true, true},
      {GgmlType::F16, 256, 64, 2, Activation::SwigluOai, false, true},
      {GgmlType::F16, 512, 96, 1, Activation::Silu, true, false},  // not fused: the activation elsewhere
  };
  for (const GluCase& c : cases) {
    SCOPED_TRACE(std::string(type_name(c.type)) + " K " + std::to_string(c.K) + " N " + std::to_string(c.N) +
                 " T " + std::to_string(c.T) + " act " + std::to_string(int(c.act)) + (c.norm ? " norm" : "") +
                 (c.in_place ? " in place" : " apart"));
    const int64_t K = c.K, N = c.N, T = c.T;
    const Tensor x = random({K, T}), norm_w = random({K});
    const Tensor wg = weight(c.type, K, N), wu = weight(c.type, K, N), bu = random({N}), none;
    GluParams act;
    act.act = c.act;
    act.limit = 0.5f;  // within the products' range, so that the clamps matter
    struct Side {
      Tensor normed, gate, up, out;
    } side[2];
    for (int s = 0; s < 2; ++s) {
      Side& d = side[s];
      d.normed = poisoned(K, T), d.gate = poisoned(N, T), d.up = poisoned(N, T);
      d.out = c.in_place ? d.gate : poisoned(N, T);
      gpu_->synchronize();
      const int64_t before = gpu_->recorded_ops();
      const Backend::MatmulPart parts[] = {{&wg, &none, &d.gate}, {&wu, &bu, &d.up}};
      if (c.norm) gpu_->rmsnorm_matmul_parts(x, norm_w, 1e-5f, d.normed, parts);
      else gpu_->matmul_parts(x, parts);
      if (s == 1) gpu_->synchronize();  // the products recorded on their own
      gpu_->glu(d.gate, d.up, act, d.out);
      gpu_->synchronize();
      if (s == 0) EXPECT_EQ(gpu_->recorded_ops() - before, c.in_place ? 1 : 2) << "ops recorded for gate/up and glu";
    }
    EXPECT_TRUE(all_equal_bits(host(side[0].out), host(side[1].out), "activation"));
    EXPECT_TRUE(all_equal_bits(host(side[0].gate), host(side[1].gate), "gate's rows"));
    EXPECT_TRUE(all_equal_bits(host(side[0].up), host(side[1].up), "up's rows"));
    if (c.norm) EXPECT_TRUE(all_equal_bits(host(side[0].normed), host(side[1].normed), "normed"));
    for (float v : host(side[0].out)) ASSERT_FALSE(std::isnan(v)) << "an activation was not written";
  }
}

// With the epilogues off (CudaOptions::half_epilogues = 0) nothing is held back to fuse.
TEST(HalfGluEpilogueOff, GluRunsAsItsOwnKernel) {
  KILN_REQUIRE_GPU();
  CudaOptions o;
  o.graphs = false;
  o.half_epilogues = 0;
  CudaBackend gpu(o);
  const int64_t K = 256, N = 64;
  std::vector<std::unique_ptr<Buffer>> buffers;
  auto tensor = [&](GgmlType type, std::initializer_list<int64_t> shape, size_t bytes) {
    buffers.push_back(gpu.allocate(bytes));
    return buffers.back()->view(type, shape);
  };
  const Tensor x = tensor(GgmlType::F32, {K, 1}, K * 4), wg = tensor(GgmlType::F16, {K, N}, K * N * 2),
               wu = tensor(GgmlType::F16, {K, N}, K * N * 2), none;
  Tensor gate = tensor(GgmlType::F32, {N, 1}, N * 4), up = tensor(GgmlType::F32, {N, 1}, N * 4);
  const int64_t before = gpu.recorded_ops();
  const Backend::MatmulPart parts[] = {{&wg, &none, &gate}, {&wu, &none, &up}};
  gpu.matmul_parts(x, parts);
  gpu.glu(gate, up, GluParams{}, gate);
  gpu.synchronize();
  EXPECT_EQ(gpu.recorded_ops() - before, 2);
}

TEST(HalfEpilogueModel, Tiny256F16DecodesTheSameWithAndWithoutTheEpilogues) {
  KILN_REQUIRE_GPU();
  KILN_REQUIRE_TESTDATA(gguf_path, "quant/models/tiny256-F16.gguf");
  KILN_REQUIRE_TESTDATA(ids_path, "quant/models/ids.json");
  const std::vector<int32_t> prompt = tiny256_prompt(read_json(ids_path));
  const auto file = gguf::File::open(gguf_path.string());
  OptionDecode run[2];
  for (int on = 0; on < 2; ++on) {
    CudaOptions o;
    o.half_epilogues = on ? CudaOptions::kHalfEpilogueRope | CudaOptions::kHalfEpilogueGlu : 0;
    run[on] = decode_with_options(*file, o, prompt, GgmlType::F16);
  }
  EXPECT_EQ(run[1].tokens, run[0].tokens);
  EXPECT_LT(run[1].ops, run[0].ops) << "the epilogues never ran";
  ASSERT_EQ(run[1].logits.size(), run[0].logits.size());
  EXPECT_TRUE(all_equal_bits(run[1].logits, run[0].logits, "logits with the epilogues vs without"));
  std::printf("[ tiny256-F16 ] ops recorded: %lld with the epilogues, %lld without\n", (long long)run[1].ops,
              (long long)run[0].ops);
}

}  // namespace
}  // namespace kiln::testing
