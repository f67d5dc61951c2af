#pragma once
// The MoE tests' double reference of the experts' GLU (silu(g) * u, or gpt-oss's clamped
// SwiGLU with alpha 1.702 and limit 7) and its slopes, from which they bound how far the
// kernels' rounding of g and u may move it.
#include <algorithm>
#include <cmath>
#include <utility>

namespace kiln::cuda::testing {

inline double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

inline double moe_glu_reference(bool oai, double g, double u) {
  if (!oai) return g * sigmoid(g) * u;
  const double gc = std::min(g, 7.0), uc = std::clamp(u, -7.0, 7.0);
  return gc * sigmoid(1.702 * gc) * (uc + 1.0);
}

// |dglu/dg| and |dglu/du| at (g, u); for the clamped SwiGLU, taken as if the clamps were
// not there (at the clamped values): an upper bound on how far a small change can move it.
inline std::pair<double, double> moe_glu_slopes(bool oai, double g, double u) {
  if (!oai) {
    const double s = sigmoid(g);
    return {std::fabs(u * (s + g * s * (1 - s))), std::fabs(g * s)};
  }
  const double gc = std::min(g, 7.0), uc = std::clamp(u, -7.0, 7.0), s = sigmoid(1.702 * gc);
  return {std::fabs((s + 1.702 * gc * s * (1 - s)) * (uc + 1.0)), std::fabs(gc * s)};
}

}  // namespace kiln::cuda::testing
