#pragma once
// Quantizers of the K-quant family (QuantizeFn signature, see quant/codec.h). Without an
// importance vector they are ggml's reference quantizers; with one, its importance-weighted
// searches.
#include <cstdint>

namespace kiln {

void quantize_q2_K(const float* src, void* dst, int64_t n, const float* importance);
void quantize_q3_K(const float* src, void* dst, int64_t n, const float* importance);
void quantize_q4_K(const float* src, void* dst, int64_t n, const float* importance);
void quantize_q5_K(const float* src, void* dst, int64_t n, const float* importance);
void quantize_q6_K(const float* src, void* dst, int64_t n, const float* importance);
void quantize_q8_K(const float* src, void* dst, int64_t n, const float* importance);

}  // namespace kiln
