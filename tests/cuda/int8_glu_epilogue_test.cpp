// The CUDA backend's int8 gate/up products taking the glu into their epilogue
// (CudaOptions::int8_glu_epilogue, matvec_grouped_glu.cu), against the same ops recorded
// apart (a synchronize() between them records the held products on their own), bit for bit:
// the activation, up's rows, the normed input, and the down product after them, which reads
// the activation's int8 copy (the epilogue's on one side, the glu kernel's on the other).
// recorded_ops() says whether the fusion ran; what the epilogue cannot take (rows not a
// multiple of 32, the activation elsewhere, gate/up over int8 x, the switch off) must not
// fuse and give the same values.
// And whole models: tiny256 Q4_0 / Q8_0 / Q4_K_M (reference data) decoded greedily with the
// epilogue and without: the same tokens, the same logits bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "fused_ops_fixture.h"
#include "model/model_test_util.h"
#include "option_decode.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

struct Int8GluCase {
  GgmlType type;
  int64_t K, N, T;
  Activation act;
  bool norm;      // rmsnorm_matmul_parts (else matmul_parts over a fresh x: f32 x in the launch)
  bool int8_x;    // rmsnorm() first, then matmul_parts over its output and its int8 copy
  bool in_place;  // glu(gate, up, act, gate), else into a tensor of its own
  bool fuses;
};

class Int8GluEpilogue : public FusedOps {};

TEST_F(Int8GluEpilogue, GateUpGluDownMatchTheOpsApart) {
  const Int8GluCase cases[] = {
      {GgmlType::Q4_0, 4096, 14336, 1, Activation::Silu, true, false, true, true},
      {GgmlType::Q8_0, 2048, 5632, 2, Activation::Silu, true, false, true, true},
      {GgmlType::Q4_K, 1024, 2048, 3, Activation::GeluTanh, true, false, true, true},
      {GgmlType::Q4_0, 512, 1024, 8, Activation::SwigluOai, true, false, true, true},
      {GgmlType::Q8_0, 1024, 1024, 1, Activation::Silu, false, false, true, true},
      {GgmlType::Q4_0, 1024, 1000, 1, Activation::Silu, true, false, true, false},   // rows not whole blocks of 32
      {GgmlType::Q4_K, 1024, 1024, 1, Activation::Silu, true, false, false, false},  // the activation elsewhere
      {GgmlType::Q4_0, 4352, 1024, 1, Activation::Silu, true, false, true, false},   // 17 groups a row
      {GgmlType::Q4_0, 1024, 1024, 2, Activation::Silu, false, true, true, false},   // over x's int8 copy
  };
  for (const Int8GluCase& c : cases) {
    SCOPED_TRACE(std::string(type_name(c.type)) + " K " + std::to_string(c.K) + " N " + std::to_string(c.N) +
                 " T " + std::to_string(c.T) + " act " + std::to_string(int(c.act)) + (c.norm ? " norm" : "") +
                 (c.in_place ? " in place" : " apart"));
    const int64_t K = c.K, N = c.N, T = c.T;
    Tensor x = random({K, T});
    const Tensor norm_w = random({K});
    const Tensor wg = weight(c.type, K, N), wu = weight(c.type, K, N), bu = random({N}), none;
    const bool down_fits = N % 256 == 0;  // the down product over the activation (K = N)
    const Tensor w_down = down_fits ? weight(c.type, N, 256) : Tensor{};
    GluParams act;
    act.act = c.act;
    act.limit = 0.5f;  // within the products' range, so that the clamps matter
    struct Side {
      Tensor normed, gate, up, out, down;
    } side[2];
    for (int s = 0; s < 2; ++s) {
      Side& d = side[s];
      d.normed = poisoned(K, T), d.gate = poisoned(N, T), d.up = poisoned(N, T), d.down = poisoned(256, T);
      d.out = c.in_place ? d.gate : poisoned(N, T);
      if (!c.norm) gpu_->scale(x, 1.0f, x);  // no int8 copy of x left from before: f32 x in the launch
      gpu_->synchronize();
      const int64_t before = gpu_->recorded_ops();
      const Backend::MatmulPart parts[] = {{&wg, &none, &d.gate}, {&wu, &bu, &d.up}};
      if (c.int8_x) {
        gpu_->rmsnorm(x, norm_w, 1e-5f, d.normed);  // leaves the normed x's int8 copy
        gpu_->matmul_parts(d.normed, parts);
      } else if (c.norm) {
        gpu_->rmsnorm_matmul_parts(x, norm_w, 1e-5f, d.normed, parts);
      } else {
        gpu_->matmul_parts(x, parts);
      }
      if (s == 1) gpu_->synchronize();  // the products recorded on their own
      gpu_->glu(d.gate, d.up, act, d.out);
      if (s == 0) {
        gpu_->synchronize();
        EXPECT_EQ(gpu_->recorded_ops() - before, (c.fuses ? 1 : 2) + (c.int8_x ? 1 : 0))
            << "ops recorded for (rmsnorm,) gate/up and glu";
      }
      if (down_fits) gpu_->matmul(d.out, w_down, none, d.down);
      gpu_->synchronize();
    }
    EXPECT_TRUE(all_equal_bits(host(side[0].out), host(side[1].out), "activation"));
    if (!c.in_place) EXPECT_TRUE(all_equal_bits(host(side[0].gate), host(side[1].gate), "gate's rows"));
    EXPECT_TRUE(all_equal_bits(host(side[0].up), host(side[1].up), "up's rows"));
    if (c.norm || c.int8_x) EXPECT_TRUE(all_equal_bits(host(side[0].normed), host(side[1].normed), "normed"));
    if (down_fits) {
      EXPECT_TRUE(all_equal_bits(host(side[0].down), host(side[1].down), "down product over the activation"));
      for (float v : host(side[0].down)) ASSERT_FALSE(std::isnan(v)) << "a down row was not written";
    }
    for (float v : host(side[0].out)) ASSERT_FALSE(std::isnan(v)) << "an activation was not written";
  }
}

// With the switch off (CudaOptions::int8_glu_epilogue = 0) the glu runs as its own kernel.
TEST(Int8GluEpilogueOff, GluRunsAsItsOwnKernel) {
  KILN_REQUIRE_GPU();
  CudaOptions o;
  o.graphs = false;
  o.int8_glu_epilogue = 0;
  CudaBackend gpu(o);
  const int64_t K = 256, N = 64, row_bytes = K / 32 * 18;
  std::vector<std::unique_ptr<Buffer>> buffers;
  auto tensor = [&](GgmlType type, std::initializer_list<int64_t> shape, size_t bytes) {
    buffers.push_back(gpu.allocate(bytes));
    return buffers.back()->view(type, shape);
  };
  const Tensor x = tensor(GgmlType::F32, {K, 1}, K * 4), norm_w = tensor(GgmlType::F32, {K}, K * 4),
               wg = tensor(GgmlType::Q4_0, {K, N}, N * row_bytes), wu = tensor(GgmlType::Q4_0, {K, N}, N * row_bytes),
               none;
  Tensor normed = tensor(GgmlType::F32, {K, 1}, K * 4), gate = tensor(GgmlType::F32, {N, 1}, N * 4),
         up = tensor(GgmlType::F32, {N, 1}, N * 4);
  const int64_t before = gpu.recorded_ops();
  const Backend::MatmulPart parts[] = {{&wg, &none, &gate}, {&wu, &none, &up}};
  gpu.rmsnorm_matmul_parts(x, norm_w, 1e-5f, normed, parts);
  gpu.glu(gate, up, GluParams{}, gate);
  gpu.synchronize();
  EXPECT_EQ(gpu.recorded_ops() - before, 2);
}

TEST(Int8GluEpilogueModel, Tiny256DecodesTheSameWithAndWithoutTheEpilogue) {
  KILN_REQUIRE_GPU();
  KILN_REQUIRE_TESTDATA(ids_path, "quant/models/ids.json");
  const std::vector<int32_t> prompt = tiny256_prompt(read_json(ids_path));
  for (const char* name : {"tiny256-Q4_0", "tiny256-Q8_0", "tiny256-Q4_K_M"}) {
    SCOPED_TRACE(name);
    KILN_REQUIRE_TESTDATA(gguf_path, std::string("quant/models/") + name + ".gguf");
    const auto file = gguf::File::open(gguf_path.string());
    OptionDecode run[2];
    for (int on = 0; on < 2; ++on) {
      CudaOptions o;
      o.int8_glu_epilogue = on ? 2 : 0;
      run[on] = decode_with_options(*file, o, prompt);
    }
    EXPECT_EQ(run[1].tokens, run[0].tokens);
    EXPECT_LT(run[1].ops, run[0].ops) << "the epilogue never ran";
    ASSERT_EQ(run[1].logits.size(), run[0].logits.size());
    EXPECT_TRUE(all_equal_bits(run[1].logits, run[0].logits, "logits with the epilogue vs without"));
    std::printf("[ %s ] ops recorded: %lld with the glu epilogue, %lld without\n", name, (long long)run[1].ops,
                (long long)run[0].ops);
  }
}

}  // namespace
}  // namespace kiln::testing
