#pragma once
// The scale searches behind ggml's quantizers, shared by the legacy and K-quant families.
// Each one picks, for a group of n values x, integer levels L and a scale (and for the
// asymmetric ones a min) that minimize a weighted squared (or absolute) error. They follow
// ggml's reference algorithms step for step, in the same float arithmetic order, so kiln's
// quantized bytes come out the same as ggml's.
#include <cstdint>

namespace kiln {

// Rounds to the nearest integer, ties to even (the float magic-number trick ggml uses;
// valid for |x| < 2^22, which every caller guarantees for finite inputs).
int round_to_int(float x);

// Symmetric levels: L[i] in [0, 2*nmax), value = scale * (L[i] - nmax). The scale's sign
// follows the value of largest magnitude so that value maps to level 0 (-nmax).
// mode 0: one pass from the max; mode 1..4: least squares with weights x^2, 1, |x|, sqrt|x|
// (or `weights` when given), trying 18 nearby scales; a negative mode returns early with
// the average of the first fit and the max-based scale. (ggml: make_qx_quants)
float fit_symmetric(int n, int nmax, const float* x, int8_t* L, int mode, const float* weights);

// Symmetric 3-bit-style levels with x^2 weights, refined by moving one level at a time when
// that improves the fit (up to 5 sweeps). L[i] in [0, 2*nmax). (ggml: make_q3_quants)
float fit_symmetric_refined(int n, int nmax, const float* x, int8_t* L, bool refine);

// Asymmetric levels: value = scale * L[i] - *neg_min, L[i] in [0, nmax], the min <= 0
// (returned negated). Tries nstep+1 scales (rmin + rdelta*k + nmax)/(max - min) and keeps
// the weighted least-squares fit of lowest error. (ggml: make_qkx2_quants)
float fit_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                    float* neg_min, uint8_t* scratch, float rmin, float rdelta, int nstep,
                    bool absolute_error);

// As fit_scale_min, for importance-weighted quantization (weights null = x^2), guarded
// against a fitted min that lands near the max. (ggml: make_qkx3_quants)
float fit_scale_min_weighted(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                             float* neg_min, uint8_t* scratch, float rmin, float rdelta,
                             int nstep, bool absolute_error);

// Non-negative values (scales, mins) to levels L[i] in [0, nmax], value = scale * L[i],
// weighted by `weights`. (ggml: make_qp_quants)
float fit_positive(int n, int nmax, const float* x, uint8_t* L, const float* weights);

}  // namespace kiln
