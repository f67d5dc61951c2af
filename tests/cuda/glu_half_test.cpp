// The prefill FFN tail with the glu writing the down product's rounded input:
//   - glu_to_half (glu_half.h) against the gated activation in double: within the half
//     type's rounding (2^-10 relative for f16, 2^-7 for bf16) plus the f32 formula's own
//     error, 2^-22 |gate * up| (gelu-tanh near 1 + tanh = 0 cancels), plus 1e-7 for f16's
//     subnormals; rows strided, n a multiple of 4 (16-byte path) or not; the output
//     poisoned first (NaN never passes);
//   - CudaBackend::glu_matmul_add over a prefill batch against glu + matmul_add on the same
//     backend: out and the residual equal bit for bit (the same f32 glu values, the same
//     rounding, the same product), for f16, bf16 and q4_0 weights and the three
//     activations, one op fewer recorded; with a bias; a decode batch takes the two ops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cuda/glu_half.h"
#include "fused_ops_fixture.h"
#include "quant/quant.h"

namespace kiln::testing {
namespace {

using cuda::testing::DeviceBuffer;
using cuda::testing::to_device;
using cuda::testing::to_host;

double glu_double(cuda::GluKind kind, double g, double u, double alpha, double limit) {
  if (kind == cuda::GluKind::Silu) return g / (1 + std::exp(-g)) * u;
  if (kind == cuda::GluKind::GeluTanh)
    return 0.5 * g * (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
  const double gc = std::min(g, limit), uc = std::min(std::max(u, -limit), limit);
  return gc / (1 + std::exp(-alpha * gc)) * (uc + 1);
}

TEST(GluToHalf, MatchesRoundedDoubleReference) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(4242);
  for (bool bf16 : {false, true})
    for (cuda::GluKind kind : {cuda::GluKind::Silu, cuda::GluKind::GeluTanh, cuda::GluKind::SwigluOai})
      for (int64_t n : {1000, 1002}) {
        SCOPED_TRACE(std::string(bf16 ? "bf16" : "f16") + " kind " + std::to_string(int(kind)) + " n " +
                     std::to_string(n));
        const int64_t rows = 37, gs = n + 8, us = n + 4;
        const std::vector<float> gate = cuda::testing::random_floats(rng, size_t(rows * gs), -6.0f, 6.0f);
        const std::vector<float> up = cuda::testing::random_floats(rng, size_t(rows * us), -9.0f, 9.0f);
        const DeviceBuffer g_d = to_device(gate), u_d = to_device(up);
        DeviceBuffer out_d(size_t(rows * n) * 2);
        out_d.poison();
        cuda::GluHalfArgs a;
        a.kind = kind, a.gate = g_d.as<float>(), a.gate_stride = gs, a.up = u_d.as<float>(), a.up_stride = us;
        a.rows = rows, a.n = n, a.out = out_d.as(), a.bf16 = bf16;
        KILN_STATUS_OK(cuda::glu_to_half(a, nullptr));
        ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
        const std::vector<uint16_t> bits = to_host<uint16_t>(out_d, size_t(rows * n));
        std::vector<float> got;
        std::vector<double> ref, tol;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < n; ++i) {
            const uint16_t h = bits[size_t(r * n + i)];
            const double g = gate[size_t(r * gs + i)], u = up[size_t(r * us + i)];
            got.push_back(bf16 ? bf16_to_f32(h) : f16_to_f32(h));
            ref.push_back(glu_double(kind, g, u, a.alpha, a.limit));
            tol.push_back((bf16 ? 0x1p-7 : 0x1p-10) * std::fabs(ref.back()) + 0x1p-22 * std::fabs(g * u) + 1e-7);
          }
        EXPECT_TRUE(cuda::testing::all_close(got, ref, tol, "glu_to_half vs double"));
      }
}

class GluMatmulAdd : public FusedOps {};

TEST_F(GluMatmulAdd, PrefillEqualsGluThenMatmulAddBitForBit) {
  for (GgmlType type : {GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0})
    for (Activation act : {Activation::Silu, Activation::GeluTanh, Activation::SwigluOai})
      for (int64_t T : {3, 37, 100}) {
        SCOPED_TRACE(std::string(type_name(type)) + " act " + std::to_string(int(act)) + " T " + std::to_string(T));
        const int64_t n = 512, N = 96;
        const bool with_bias = act == Activation::GeluTanh;
        // gate and up as neighbouring column ranges of one buffer (as a prefill lays them out)
        Tensor both = floats({2 * n, T}, random_floats(rng_, size_t(2 * n * T), -4.0f, 4.0f));
        Tensor gate = both, up = both;
        gate.ne[0] = up.ne[0] = n;
        up.data = both.as<float>() + n;
        const Tensor w = weight(type, n, N);
        const Tensor bias = with_bias ? random({N}) : Tensor{};
        const std::vector<float> residual_host = random_floats(rng_, size_t(N * T), -3.0f, 3.0f);
        Tensor residual_a = floats({N, T}, residual_host), residual_b = floats({N, T}, residual_host);
        Tensor out_a = poisoned(N, T), out_b = poisoned(N, T), act_a = poisoned(n, T), act_b = poisoned(n, T);
        GluParams params{act};

        gpu_->synchronize();
        const int64_t before = gpu_->recorded_ops();
        gpu_->glu_matmul_add(gate, up, params, act_a, w, bias, out_a, residual_a);
        gpu_->synchronize();
        const int64_t fused_ops = gpu_->recorded_ops() - before;
        gpu_->glu(gate, up, params, act_b);
        gpu_->matmul_add(act_b, w, bias, out_b, residual_b);
        gpu_->synchronize();
        const int64_t apart_ops = gpu_->recorded_ops() - before - fused_ops;
        EXPECT_EQ(fused_ops, T > 8 ? apart_ops - 1 : apart_ops) << "ops recorded: fused " << fused_ops << ", apart "
                                                                 << apart_ops;
        EXPECT_TRUE(all_equal_bits(host(out_a), host(out_b), "out"));
        EXPECT_TRUE(all_equal_bits(host(residual_a), host(residual_b), "residual"));
      }
}

}  // namespace
}  // namespace kiln::testing
