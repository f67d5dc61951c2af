// The AVX-512 SiLU-gate loop against the formula evaluated in double, over ordinary values
// and the ends of the range (exp overflow / underflow must give 0 and x * u, not NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/activations_avx512.h"
#include "core/cpu_features.h"

namespace kiln {
namespace {

TEST(Activations, SiluMulMatchesFormula) {
  if (!cpu_features().avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::vector<float> g, u;
  for (int i = -4000; i <= 4000; ++i) {  // -40 .. 40 in steps of 0.01, odd length: a scalar tail
    g.push_back(float(i) * 0.01f);
    u.push_back(1.0f + float(i % 7) * 0.25f);
  }
  for (float x : {-200.0f, -104.0f, -88.5f, -87.0f, 87.0f, 88.5f, 200.0f, 1e-30f, -1e-30f, 0.0f}) {
    g.push_back(x);
    u.push_back(-1.5f);
  }
  std::vector<float> y(g.size());
  cpu::avx512::silu_mul(g.data(), u.data(), y.data(), int64_t(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const double want = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * double(u[i]);
    ASSERT_FALSE(std::isnan(y[i])) << "index " << i << " g " << g[i];
    ASSERT_NEAR(y[i], want, 4e-7 * std::abs(want) + 1e-30) << "index " << i << " g " << g[i] << " u " << u[i];
  }
}

}  // namespace
}  // namespace kiln
