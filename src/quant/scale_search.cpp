#include "quant/scale_search.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln {
// File-local helpers, in a named namespace: the library is a unity build.
namespace search_util {

// Groups whose largest magnitude is below this are stored as all zeros.
constexpr float kZeroGroup = 1e-15f;

int clamp_int(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// Weight of x under fit_symmetric's built-in modes.
float mode_weight(int mode, float x) {
  switch (mode) {
    case 1: return x * x;
    case 2: return 1.0f;
    case 3: return std::fabs(x);
    default: return std::sqrt(std::fabs(x));
  }
}

}  // namespace search_util

int round_to_int(float x) {
  // Adding 1.5 * 2^23 puts the rounded integer in the low mantissa bits.
  const float shifted = x + 12582912.f;
  int bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  return (bits & 0x007fffff) - 0x00400000;
}

float fit_symmetric(int n, int nmax, const float* x, int8_t* L, int mode, const float* weights) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < search_util::kZeroGroup) {
    std::memset(L, 0, size_t(n));
    return 0.f;
  }
  float iscale = -nmax / max;
  if (mode == 0) {
    for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + search_util::clamp_int(round_to_int(iscale * x[i]), -nmax, nmax - 1));
    return 1 / iscale;
  }
  const bool return_early = mode < 0;
  if (return_early) mode = -mode;
  auto weight = [&](int i) { return weights ? weights[i] : search_util::mode_weight(mode, x[i]); };

  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = search_util::clamp_int(round_to_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = int8_t(l + nmax);
    const float w = weight(i);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  if (return_early) return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
  float best = scale * sumlx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(nmax + 0.1f * step) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = search_util::clamp_int(round_to_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = weight(i);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i)
        L[i] = int8_t(nmax + search_util::clamp_int(round_to_int(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

float fit_symmetric_refined(int n, int nmax, const float* x, int8_t* L, bool refine) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < search_util::kZeroGroup) {
    std::memset(L, 0, size_t(n));
    return 0.f;
  }
  const float iscale = -nmax / max;
  if (!refine) {
    for (int i = 0; i < n; ++i) L[i] = int8_t(search_util::clamp_int(round_to_int(iscale * x[i]), -nmax, nmax - 1) + nmax);
    return 1 / iscale;
  }
  // Work with signed levels, then shift to [0, 2*nmax) at the end.
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = search_util::clamp_int(round_to_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = int8_t(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int sweep = 0; sweep < 5; ++sweep) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        const int new_l = search_util::clamp_int(round_to_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          // Keep the move when it raises sumlx^2 / suml2 (the fit's explained energy).
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = int8_t(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

namespace search_util {

// The search both fit_scale_min variants run: levels over [min(0, min x), max x], then
// nstep + 1 trial inverse scales, each giving levels whose weighted least-squares
// (scale, min <= 0) is kept when its error is lower. `weight(i)` is the weight of x[i];
// `trial_level(v)` turns a trial's iscale * (x[i] - min) into a level in [0, nmax].
template <class WeightOf, class TrialLevel>
float search_scale_min(int n, int nmax, const float* x, WeightOf weight, TrialLevel trial_level, uint8_t* L,
                       float* neg_min, uint8_t* scratch, float rmin, float rdelta, int nstep, bool absolute_error) {
  float min = x[0], max = x[0];
  float sum_w = weight(0);
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weight(i);
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  // min <= max here (or a NaN, which no comparison catches): a flat block is max == min.
  if (max == min) {
    std::memset(L, 0, size_t(n));
    *neg_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = uint8_t(clamp_int(round_to_int(iscale * (x[i] - min)), 0, nmax));
    float diff = scale * L[i] + min - x[i];
    diff = absolute_error ? std::fabs(diff) : diff * diff;
    best_error += weight(i) * diff;
  }
  if (nstep < 1) {
    *neg_min = -min;
    return scale;
  }
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * step + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = trial_level(iscale * (x[i] - min));
      scratch[i] = uint8_t(l);
      const float w = weight(i);
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    // Weighted least squares for (scale, min) with these levels.
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * scratch[i] + this_min - x[i];
        diff = absolute_error ? std::fabs(diff) : diff * diff;
        error += weight(i) * diff;
      }
      if (error < best_error) {
        std::memcpy(L, scratch, size_t(n));
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

}  // namespace search_util

float fit_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                    float* neg_min, uint8_t* scratch, float rmin, float rdelta, int nstep,
                    bool absolute_error) {
  auto weight = [&](int i) { return weights[i]; };
  auto trial_level = [&](float v) { return search_util::clamp_int(round_to_int(v), 0, nmax); };
  return search_util::search_scale_min(n, nmax, x, weight, trial_level, L, neg_min, scratch, rmin, rdelta, nstep,
                                       absolute_error);
}

float fit_scale_min_weighted(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                             float* neg_min, uint8_t* scratch, float rmin, float rdelta,
                             int nstep, bool absolute_error) {
  auto weight = [&](int i) { return weights ? weights[i] : x[i] * x[i]; };
  // Once min is a fitted value it may sit near max: v can be huge, so clamp first.
  auto trial_level = [&](float v) { return v > 0 ? round_to_int(std::min(v, float(nmax))) : 0; };
  return search_util::search_scale_min(n, nmax, x, weight, trial_level, L, neg_min, scratch, rmin, rdelta, nstep,
                                       absolute_error);
}

float fit_positive(int n, int nmax, const float* x, uint8_t* L, const float* weights) {
  float max = 0;
  for (int i = 0; i < n; ++i) max = std::max(max, x[i]);
  if (max < search_util::kZeroGroup) {
    std::memset(L, 0, size_t(n));
    return 0.f;
  }
  float iscale = nmax / max;
  for (int i = 0; i < n; ++i) L[i] = uint8_t(round_to_int(iscale * x[i]));
  float scale = 1 / iscale;
  float best_mse = 0;
  for (int i = 0; i < n; ++i) {
    const float diff = x[i] - scale * L[i];
    best_mse += weights[i] * diff * diff;
  }
  for (int step = -4; step <= 4; ++step) {
    if (step == 0) continue;
    const float iscale_try = (0.1f * step + nmax) / max;
    const float scale_try = 1 / iscale_try;
    float mse = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::min(nmax, round_to_int(iscale_try * x[i]));
      const float diff = x[i] - scale_try * l;
      mse += weights[i] * diff * diff;
    }
    if (mse < best_mse) {
      best_mse = mse;
      iscale = iscale_try;
    }
  }
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::min(nmax, round_to_int(iscale * x[i]));
    L[i] = uint8_t(l);
    const float w = weights[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int sweep = 0; sweep < 5; ++sweep) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = weights[i];
      float slx = sumlx - w * x[i] * L[i];
      float sl2 = suml2 - w * L[i] * L[i];
      if (slx > 0 && sl2 > 0) {
        const int new_l = std::min(nmax, round_to_int(x[i] * sl2 / slx));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = uint8_t(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

}  // namespace kiln
