#pragma once
// AVX-512 activation loops of the CPU ops (activations_avx512.cpp, compiled with AVX-512
// flags: call only when cpu_features().avx512).
#include <cstdint>

namespace kiln::cpu::avx512 {

// y[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i]; y may alias g or u.
void silu_mul(const float* g, const float* u, float* y, int64_t n);

}  // namespace kiln::cpu::avx512
