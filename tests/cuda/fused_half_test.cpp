// The CUDA backend's decode products with f16 / bf16 weights, which run on the grouped
// 16-bit float kernel (matvec_f16_grouped.h), against double-precision references computed
// from the host data, for 1 and 3 tokens:
//   - rmsnorm_matmul_parts (q/k/v with a bias on k): the products and the normed vector;
//   - matmul_parts over a plain x;
//   - matmul_add: the product, and the residual holding residual + product bit for bit;
//   - matmul (the lm_head's path).
// And one whole model: tiny256-F16 (reference data) decoded greedily with the fused ops and
// graphs, and with the fused ops off (separate norms, products and adds): same tokens,
// logits within 1e-5 relative L2 per step.
//
// Bounds as in matvec_f16_grouped_test.cpp: |y - ref| <= 1e-5 * (sum_i |w_i x_i| + |bias|);
// the normed vector within 2e-6 relative of the double rmsnorm. Outputs are poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "fused_ops_fixture.h"
#include "model/model_test_util.h"
#include "option_decode.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

constexpr float kEps = 1e-5f;

// Host weights and their device copy.
struct HostWeight {
  GgmlType type;
  int64_t K = 0, N = 0;
  std::vector<uint8_t> bytes;
  Tensor t;
  double at(int64_t r, int64_t i) const {
    uint16_t h;
    std::memcpy(&h, bytes.data() + (r * K + i) * 2, 2);
    return type == GgmlType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
};

// The fused-op fixture with weights kept on the host too, for the double references.
class FusedHalfOps : public FusedOps {
 protected:
  HostWeight host_weight(GgmlType type, int64_t K, int64_t N) {
    HostWeight w{type, K, N, random_rows(rng_, type, N, K, K * 2), {}};
    w.bytes.resize(size_t(N * K * 2));  // random_rows leaves 16 bytes of slack
    buffers_.push_back(gpu_->allocate(w.bytes.size()));
    w.t = buffers_.back()->view(type, {K, N});
    gpu_->upload(w.bytes.data(), w.t, w.bytes.size());
    return w;
  }
  // w x_t (+ bias) for every token t of x ([K, T] as doubles), with the error bound.
  static void reference(const HostWeight& w, const std::vector<double>& x, int64_t T, const std::vector<float>* bias,
                        std::vector<double>* ref, std::vector<double>* tol) {
    ref->assign(size_t(w.N * T), 0.0);
    tol->assign(size_t(w.N * T), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < w.N; ++r) {
        double sum = 0, magnitude = 0;
        for (int64_t i = 0; i < w.K; ++i) {
          const double term = w.at(r, i) * x[size_t(t * w.K + i)];
          sum += term, magnitude += std::fabs(term);
        }
        if (bias) sum += (*bias)[size_t(r)], magnitude += std::fabs((*bias)[size_t(r)]);
        (*ref)[size_t(t * w.N + r)] = sum;
        (*tol)[size_t(t * w.N + r)] = 1e-5 * magnitude;
      }
  }
  ::testing::AssertionResult matches(const Tensor& y, const HostWeight& w, const std::vector<double>& x, int64_t T,
                                     const std::vector<float>* bias, const std::string& what) {
    std::vector<double> ref, tol;
    reference(w, x, T, bias, &ref, &tol);
    return all_close(host(y), ref, tol, what);
  }

};

std::vector<double> as_doubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

TEST_F(FusedHalfOps, NormAndQkvProducts) {
  for (GgmlType type : {GgmlType::F16, GgmlType::BF16}) {
    for (int64_t K : {256, 4096 + 8}) {
      for (int64_t T : {1, 3}) {
        SCOPED_TRACE(std::string(type_name(type)) + " K " + std::to_string(K) + " T " + std::to_string(T));
        const std::vector<float> x_host = random_floats(rng_, size_t(K * T), -1.5f, 1.5f);
        const std::vector<float> norm_host = random_floats(rng_, size_t(K), 0.5f, 1.5f);
        const std::vector<float> bias_host = random_floats(rng_, 40, -1.0f, 1.0f);
        const Tensor x = floats({K, T}, x_host), norm_w = floats({K}, norm_host), bias = floats({40}, bias_host);
        const HostWeight wq = host_weight(type, K, 130), wk = host_weight(type, K, 40), wv = host_weight(type, K, 40);
        Tensor normed = poisoned(K, T), q = poisoned(130, T), k = poisoned(40, T), v = poisoned(40, T);
        const Tensor none;
        const Backend::MatmulPart parts[] = {{&wq.t, &none, &q}, {&wk.t, &bias, &k}, {&wv.t, nullptr, &v}};
        gpu_->rmsnorm_matmul_parts(x, norm_w, kEps, normed, parts);

        const std::vector<double> xn = double_rmsnorm(x_host, norm_host, K, T, kEps);
        EXPECT_TRUE(all_close(host(normed), xn, 2e-6, 0.0, "normed vs double rmsnorm"));
        EXPECT_TRUE(matches(q, wq, xn, T, nullptr, "q"));
        EXPECT_TRUE(matches(k, wk, xn, T, &bias_host, "k (with bias)"));
        EXPECT_TRUE(matches(v, wv, xn, T, nullptr, "v"));

        // The same weights over a plain x: matmul_parts.
        Tensor q2 = poisoned(130, T), v2 = poisoned(40, T);
        const Backend::MatmulPart two[] = {{&wq.t, &none, &q2}, {&wv.t, nullptr, &v2}};
        gpu_->matmul_parts(x, two);
        EXPECT_TRUE(matches(q2, wq, as_doubles(x_host), T, nullptr, "matmul_parts q"));
        EXPECT_TRUE(matches(v2, wv, as_doubles(x_host), T, nullptr, "matmul_parts v"));
      }
    }
  }
}

TEST_F(FusedHalfOps, MatmulAddAndMatmul) {
  for (GgmlType type : {GgmlType::F16, GgmlType::BF16}) {
    for (int64_t T : {1, 3}) {
      SCOPED_TRACE(std::string(type_name(type)) + " T " + std::to_string(T));
      const int64_t K = 1032, N = 300;
      const std::vector<float> x_host = random_floats(rng_, size_t(K * T), -1.5f, 1.5f);
      const std::vector<float> bias_host = random_floats(rng_, size_t(N), -1.0f, 1.0f);
      const std::vector<float> residual_host = random_floats(rng_, size_t(N * T), -3.0f, 3.0f);
      const Tensor x = floats({K, T}, x_host), bias = floats({N}, bias_host);
      const HostWeight w = host_weight(type, K, N);
      Tensor residual = floats({N, T}, residual_host), out = poisoned(N, T);
      gpu_->matmul_add(x, w.t, bias, out, residual);
      const std::vector<float> got_out = host(out);
      EXPECT_TRUE(matches(out, w, as_doubles(x_host), T, &bias_host, "out"));
      std::vector<float> want_residual(residual_host.size());
      for (size_t i = 0; i < want_residual.size(); ++i) want_residual[i] = residual_host[i] + got_out[i];
      EXPECT_TRUE(all_equal_bits(host(residual), want_residual, "residual += out"));

      Tensor y = poisoned(N, T);
      gpu_->matmul(x, w.t, bias, y);
      EXPECT_TRUE(matches(y, w, as_doubles(x_host), T, &bias_host, "matmul"));
    }
  }
}

TEST(FusedHalfModel, Tiny256F16DecodesAsTheUnfusedOps) {
  KILN_REQUIRE_GPU();
  KILN_REQUIRE_TESTDATA(gguf_path, "quant/models/tiny256-F16.gguf");
  KILN_REQUIRE_TESTDATA(ids_path, "quant/models/ids.json");
  const nlohmann::json ref = read_json(ids_path);
  const int64_t vocab = ref["logits_shape"][1];
  const std::vector<int32_t> prompt = tiny256_prompt(ref);
  const auto file = gguf::File::open(gguf_path.string());
  std::vector<float> logits[2];
  std::vector<int32_t> tokens[2];
  for (int fused = 0; fused < 2; ++fused) {
    CudaOptions o;
    o.fused = fused == 1;
    o.graphs = fused == 1;
    OptionDecode run = decode_with_options(*file, o, prompt);
    tokens[fused] = std::move(run.tokens), logits[fused] = std::move(run.logits);
  }
  EXPECT_EQ(tokens[1], tokens[0]);
  ASSERT_EQ(logits[1].size(), logits[0].size());
  ASSERT_EQ(logits[0].size() % size_t(vocab), 0u);
  double worst = 0;
  for (size_t step = 0; step < logits[0].size() / size_t(vocab); ++step) {
    const double err = relative_l2(logits[1].data() + step * vocab, logits[0].data() + step * vocab, vocab);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-5) << "step " << step;
  }
  std::printf("[ tiny256-F16 ] fused vs unfused decode: max relative L2 %.3g over %zu steps\n", worst,
              logits[0].size() / size_t(vocab));
}

}  // namespace
}  // namespace kiln::testing
