// Small fused ops (backend/cuda/ops.h) against double-precision scalar references written
// here from the formulas (those of backend/cpu).
//
// Error bounds: rmsnorm 2e-6 relative (f32 sum of squares, rsqrtf); residual update bit-exact;
// rope 1e-5 relative + 1e-6 absolute (angles in double on both sides, f32 rotation); glu
// 1e-5 relative + 1e-6 absolute (expf / tanhf); argmax exact (first index among equals).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "backend/cuda/ops.h"
#include "cuda_test_support.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

TEST(CudaRmsNorm, PlainAndWithResidual) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(11);
  // 5 rows with odd strides: the general kernels; 12 and 101 rows with 16-byte aligned
  // strides: widths a multiple of 1024 take the prefill kernel that keeps a row in registers,
  // widths of 128..512 a warp per row (8 rows per block; 101 leaves a partial block).
  for (int64_t dim : {1, 7, 64, 128, 256, 384, 512, 1024, 4096, 4097, 8192})
  for (int64_t rows : {int64_t(5), int64_t(12), int64_t(101)})
    for (bool residual : {false, true})
      for (bool weighted : {false, true}) {
        SCOPED_TRACE("dim " + std::to_string(dim) + " rows " + std::to_string(rows) + (residual ? " residual" : "") +
                     (weighted ? " weight" : ""));
        const bool aligned = rows > 8;
        const int64_t xs = dim + (aligned ? 4 : 3), rs = dim + (aligned ? 8 : 5), ys = dim + (aligned ? 12 : 1);
        const std::vector<float> x = random_floats(rng, size_t(rows * xs), -2.0f, 2.0f);
        const std::vector<float> h = random_floats(rng, size_t(rows * rs), -2.0f, 2.0f);
        const std::vector<float> w = random_floats(rng, size_t(dim), 0.5f, 1.5f);
        const DeviceBuffer x_d = to_device(x), h_d = to_device(h), w_d = to_device(w);
        DeviceBuffer y_d(size_t(rows * ys) * 4);
        y_d.poison();
        RmsNormArgs a;
        a.x = x_d.as<float>();
        a.x_stride = xs;
        a.residual = residual ? h_d.as<float>() : nullptr;
        a.residual_stride = rs;
        a.weight = weighted ? w_d.as<float>() : nullptr;
        a.eps = 1e-5f;
        a.rows = rows;
        a.dim = dim;
        a.y = y_d.as<float>();
        a.y_stride = ys;
        KILN_STATUS_OK(rmsnorm(a, nullptr));
        const std::vector<float> y_all = to_host<float>(y_d, size_t(rows * ys));
        const std::vector<float> h_all = to_host<float>(h_d, size_t(rows * rs));
        std::vector<float> got, got_h, want_h;
        std::vector<double> want;
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<float> src(static_cast<size_t>(dim));
          for (int64_t i = 0; i < dim; ++i) {
            src[i] = residual ? h[r * rs + i] + x[r * xs + i] : x[r * xs + i];
            if (residual) got_h.push_back(h_all[r * rs + i]), want_h.push_back(src[i]);
          }
          double ss = 0;
          for (float v : src) ss += double(v) * v;
          const double inv = 1.0 / std::sqrt(ss / double(dim) + 1e-5);
          for (int64_t i = 0; i < dim; ++i) {
            want.push_back(src[i] * inv * (weighted ? w[i] : 1.0));
            got.push_back(y_all[r * ys + i]);
          }
        }
        EXPECT_TRUE(all_close(got, want, 2e-6, 1e-7, "rmsnorm"));
        if (residual) EXPECT_TRUE(all_equal_bits(got_h, want_h, "residual += x"));
      }
}

// The prefill norm's half copy (RmsNormArgs::y_half, the next product's rounded input): every
// value the f32 output's bits rounded to f16 / bf16 (round to nearest even, as gemm() rounds
// x), rows packed; refused where the row kernel does not run.
TEST(CudaRmsNorm, HalfCopyIsTheRoundedOutput) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(12);
  for (int64_t dim : {1024, 2048, 4096, 8192})
    for (int64_t rows : {int64_t(12), int64_t(101)})
      for (bool bf16 : {false, true}) {
        SCOPED_TRACE("dim " + std::to_string(dim) + " rows " + std::to_string(rows) + (bf16 ? " bf16" : " f16"));
        const int64_t xs = dim + 4, rs = dim + 8, ys = dim + 12;
        const std::vector<float> x = random_floats(rng, size_t(rows * xs), -2.0f, 2.0f);
        const std::vector<float> h = random_floats(rng, size_t(rows * rs), -2.0f, 2.0f);
        const std::vector<float> w = random_floats(rng, size_t(dim), 0.5f, 1.5f);
        const DeviceBuffer x_d = to_device(x), h_d = to_device(h), w_d = to_device(w);
        DeviceBuffer y_d(size_t(rows * ys) * 4), half_d(size_t(rows * dim) * 2);
        y_d.poison(), half_d.poison();
        RmsNormArgs a;
        a.x = x_d.as<float>(), a.x_stride = xs;
        a.residual = h_d.as<float>(), a.residual_stride = rs;
        a.weight = w_d.as<float>(), a.eps = 1e-5f;
        a.rows = rows, a.dim = dim;
        a.y = y_d.as<float>(), a.y_stride = ys;
        a.y_half = half_d.as(), a.y_half_bf16 = bf16;
        ASSERT_TRUE(rmsnorm_writes_half(a));
        KILN_STATUS_OK(rmsnorm(a, nullptr));
        const std::vector<float> y_all = to_host<float>(y_d, size_t(rows * ys));
        const std::vector<uint16_t> half_all = to_host<uint16_t>(half_d, size_t(rows * dim));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < dim; ++i) {
            const float v = y_all[size_t(r * ys + i)];
            ASSERT_EQ(half_all[size_t(r * dim + i)], bf16 ? f32_to_bf16(v) : f32_to_f16(v))
                << "row " << r << " [" << i << "] = " << v;
          }
      }
  // A width the row kernel does not take: the copy is refused, nothing runs.
  const DeviceBuffer x_d(size_t(12 * 4097) * 4), y_d(size_t(12 * 4097) * 4), half_d(size_t(12 * 4097) * 2);
  RmsNormArgs a;
  a.x = x_d.as<float>(), a.x_stride = 4097, a.rows = 12, a.dim = 4097, a.y = y_d.as<float>(), a.y_stride = 4097;
  a.y_half = half_d.as();
  EXPECT_FALSE(rmsnorm_writes_half(a));
  EXPECT_FALSE(rmsnorm(a, nullptr).ok());
}

struct RopeCase {
  bool neox;
  int head_dim, n_rot;
  bool factors, yarn;
};

TEST(CudaRope, NormalNeoxPartialFactorsYarn) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(12);
  const RopeCase cases[] = {{false, 128, 128, false, false}, {true, 128, 128, false, false},
                            {true, 64, 32, false, false},    {false, 128, 128, true, false},
                            {true, 80, 64, true, true},      {false, 256, 200, false, true}};
  // 9 tokens: a block per token (prefill's grid); 3: blocks of 4 heads (decode's).
  for (const RopeCase& c : cases)
  for (const int64_t tokens : {int64_t(9), int64_t(3)}) {
    SCOPED_TRACE(std::string(c.neox ? "neox" : "normal") + " head_dim " + std::to_string(c.head_dim) + " n_rot " +
                 std::to_string(c.n_rot) + (c.factors ? " factors" : "") + (c.yarn ? " yarn" : "") + " tokens " +
                 std::to_string(tokens));
    const int64_t heads = 5, head_stride = c.head_dim + 2, token_stride = heads * head_stride + 7;
    std::vector<float> x = random_floats(rng, size_t(tokens * token_stride), -1.0f, 1.0f);
    std::vector<int32_t> pos = {0, 1, 2, 17, 100, 4095, 8191, 32768, 131071};
    pos.resize(size_t(tokens));
    const std::vector<float> factors = random_floats(rng, size_t(c.n_rot / 2), 1.0f, 8.0f);
    const DeviceBuffer x_d = to_device(x), pos_d = to_device(pos), f_d = to_device(factors);
    RopeArgs a;
    a.x = x_d.as<float>();
    a.token_stride = token_stride;
    a.head_stride = head_stride;
    a.n_tokens = tokens;
    a.n_heads = heads;
    a.head_dim = c.head_dim;
    a.positions = pos_d.as<int32_t>();
    a.n_rot = c.n_rot;
    a.neox = c.neox;
    a.freq_base = 500000.0f;
    a.freq_scale = c.yarn ? 0.25f : 1.0f;
    a.freq_factors = c.factors ? f_d.as<float>() : nullptr;
    if (c.yarn) {
      a.ext_factor = 1.0f;
      a.attn_factor = 1.0f;
      a.n_ctx_orig = 8192;
    }
    KILN_STATUS_OK(rope(a, nullptr));
    const std::vector<float> got = to_host<float>(x_d, x.size());

    // Reference: ggml's formulation, angles in double.
    const int half = c.n_rot / 2;
    float corr_low = 0, corr_high = 0;
    auto corr_dim = [&](float rotations) {
      return float(c.n_rot) * std::log(float(a.n_ctx_orig) / (rotations * 2.0f * std::numbers::pi_v<float>)) /
             (2.0f * std::log(a.freq_base));
    };
    if (c.yarn) {
      corr_low = std::max(0.0f, std::floor(corr_dim(a.beta_fast)));
      corr_high = std::min(float(c.n_rot - 1), std::ceil(corr_dim(a.beta_slow)));
    }
    std::vector<double> want(x.begin(), x.end());
    for (int64_t t = 0; t < tokens; ++t)
      for (int i = 0; i < half; ++i) {
        double theta_extrap = double(pos[t]) * std::pow(double(a.freq_base), -2.0 * i / c.n_rot);
        if (c.factors) theta_extrap /= double(factors[i]);
        double theta = theta_extrap * a.freq_scale, mscale = a.attn_factor;
        if (c.yarn) {
          const float y = (float(i) - corr_low) / std::max(0.001f, corr_high - corr_low);
          const double mix = double(1.0f - std::min(1.0f, std::max(0.0f, y))) * a.ext_factor;
          theta = theta * (1.0 - mix) + theta_extrap * mix;
          mscale *= 1.0 + 0.1 * std::log(1.0 / a.freq_scale);
        }
        const double co = std::cos(theta) * mscale, si = std::sin(theta) * mscale;
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t base = t * token_stride + h * head_stride;
          const int64_t p = base + (c.neox ? i : 2 * i), q = base + (c.neox ? i + half : 2 * i + 1);
          want[p] = x[p] * co - x[q] * si;
          want[q] = x[p] * si + x[q] * co;
        }
      }
    EXPECT_TRUE(all_close(got, want, 1e-5, 1e-6, "rope"));
  }
}

TEST(CudaGlu, SiluGeluSwigluOai) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(13);
  for (GluKind kind : {GluKind::Silu, GluKind::GeluTanh, GluKind::SwigluOai})
  for (int64_t n : {14337, 14336}) {  // odd: one element at a time; multiple of 4: 16-byte accesses
    SCOPED_TRACE("kind " + std::to_string(int(kind)) + " n " + std::to_string(n));
    const int64_t rows = 3, gs = n + 4, us = n + 8, os = n + 12;
    const std::vector<float> g = random_floats(rng, size_t(rows * gs), -9.0f, 9.0f);
    const std::vector<float> u = random_floats(rng, size_t(rows * us), -9.0f, 9.0f);
    const DeviceBuffer g_d = to_device(g), u_d = to_device(u);
    DeviceBuffer o_d(size_t(rows * os) * 4);
    o_d.poison();
    GluArgs a;
    a.kind = kind;
    a.gate = g_d.as<float>();
    a.gate_stride = gs;
    a.up = u_d.as<float>();
    a.up_stride = us;
    a.rows = rows;
    a.n = n;
    a.out = o_d.as<float>();
    a.out_stride = os;
    KILN_STATUS_OK(glu(a, nullptr));
    const std::vector<float> o_all = to_host<float>(o_d, size_t(rows * os));
    std::vector<float> got;
    std::vector<double> want;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < n; ++i) {
        const double gv = g[r * gs + i], uv = u[r * us + i];
        double y;
        if (kind == GluKind::Silu) {
          y = gv / (1.0 + std::exp(-gv)) * uv;
        } else if (kind == GluKind::GeluTanh) {
          y = 0.5 * gv * (1.0 + std::tanh(0.7978845608028654 * (gv + 0.044715 * gv * gv * gv))) * uv;
        } else {
          const double gc = std::min(gv, 7.0), uc = std::clamp(uv, -7.0, 7.0);
          y = gc / (1.0 + std::exp(-1.702 * gc)) * (uc + 1.0);
        }
        want.push_back(y);
        got.push_back(o_all[r * os + i]);
      }
    EXPECT_TRUE(all_close(got, want, 1e-5, 1e-6, "glu"));
  }
}

TEST(CudaArgmax, FirstIndexOfTheMaximumPerRow) {
  KILN_REQUIRE_GPU();
  std::mt19937_64 rng(14);
  const int64_t rows = 6, n = 128256, stride = n + 16;
  std::vector<float> x = random_floats(rng, size_t(rows * stride), -10.0f, 10.0f);
  x[0 * stride + 77] = 50.0f;                             // row 0: one maximum
  x[1 * stride + 128255] = 60.0f;                         // row 1: the last element
  x[2 * stride + 5000] = 70.0f, x[2 * stride + 9] = 70.0f;  // row 2: tie -> first index (9)
  x[3 * stride + 0] = 80.0f;                              // row 3: the first element
  x[4 * stride + 3] = std::numeric_limits<float>::quiet_NaN(), x[4 * stride + 400] = 90.0f;  // NaN skipped
  const DeviceBuffer x_d = to_device(x);
  DeviceBuffer out(size_t(rows) * 4), scratch(argmax_scratch_bytes(rows, n));
  out.poison();
  scratch.poison();
  // With a host copy too, in mapped memory (a greedy step's token, step_io.h).
  int32_t* host_out = nullptr;
  KILN_CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&host_out), size_t(rows) * 4, cudaHostAllocMapped));
  std::fill(host_out, host_out + rows, -7);
  KILN_STATUS_OK(argmax_rows(x_d.as<float>(), stride, rows, n, out.as<int32_t>(), scratch.as(), scratch.bytes(), nullptr,
                             host_out));
  KILN_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<int32_t> got = to_host<int32_t>(out, size_t(rows));
  EXPECT_EQ(std::vector<int32_t>(host_out, host_out + rows), got) << "the host copy";
  cudaFreeHost(host_out);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[r * stride + i];
      if (!std::isnan(v) && (best < 0 || v > x[r * stride + best])) best = i;
    }
    EXPECT_EQ(got[r], best) << "row " << r;
  }
  EXPECT_EQ(got[2], 9);

  // Short rows (one piece, fewer elements than threads).
  for (int64_t small_n : {1, 5, 300}) {
    std::vector<float> xs = random_floats(rng, size_t(3 * small_n), -1.0f, 1.0f);
    const DeviceBuffer xs_d = to_device(xs);
    DeviceBuffer out2(12), scratch2(argmax_scratch_bytes(3, small_n));
    out2.poison();
    KILN_STATUS_OK(argmax_rows(xs_d.as<float>(), small_n, 3, small_n, out2.as<int32_t>(), scratch2.as(),
                               scratch2.bytes(), nullptr));
    const std::vector<int32_t> g2 = to_host<int32_t>(out2, 3);
    for (int64_t r = 0; r < 3; ++r) {
      const auto first = xs.begin() + r * small_n;
      EXPECT_EQ(g2[r], std::max_element(first, first + small_n) - first) << "n " << small_n << " row " << r;
    }
  }
}

}  // namespace
}  // namespace kiln::cuda
