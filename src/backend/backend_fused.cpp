// Composed fallbacks of the fused ops in backend.h: the same result from the plain ops, so
// a backend without a fused kernel (the CPU backend) needs nothing more.
#include "backend/backend.h"
#include "core/error.h"

namespace kiln {

void Backend::matmul_parts(const Tensor& x, std::span<const MatmulPart> parts) {
  for (const MatmulPart& p : parts) {
    KILN_CHECK(p.w && p.out, "{} matmul_parts: a part lacks its weight or output", name());
    matmul(x, *p.w, p.bias ? *p.bias : Tensor{}, *p.out);
  }
}

bool Backend::prefers_joined_parts(int64_t) const { return false; }

void Backend::rmsnorm_matmul_parts(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                                   std::span<const MatmulPart> parts) {
  rmsnorm(x, norm_weight, eps, normed);
  matmul_parts(normed, parts);
}

void Backend::matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out, Tensor& residual) {
  matmul(x, w, bias, out);
  add(residual, out, residual);
}

void Backend::glu_matmul_add(const Tensor& gate, const Tensor& up, const GluParams& params, Tensor& act,
                             const Tensor& w, const Tensor& bias, Tensor& out, Tensor& residual) {
  glu(gate, up, params, act);
  matmul_add(act, w, bias, out, residual);
}

void Backend::rope_kv_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& positions,
                            const RopeParams& params, KvLayer& cache, const Tensor& slots) {
  rope(q_heads, positions, params);
  rope(k_heads, positions, params);
  kv_store(heads_as_rows(k_heads), v, cache, slots);
}

void Backend::moe_ffn_add(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
                          const GluParams& act, Tensor& out, Tensor& residual) {
  moe_ffn(x, experts, ids, weights, act, out);
  add(residual, out, residual);
}

void Backend::rmsnorm_moe_route(const Tensor& x, const Tensor& norm_weight, float eps, Tensor& normed,
                                const Tensor& router, const Tensor& router_bias, const MoeRouteParams& params,
                                Tensor& logits, Tensor& ids, Tensor& weights) {
  rmsnorm(x, norm_weight, eps, normed);
  matmul(normed, router, router_bias, logits);
  moe_route(logits, params, ids, weights);
}

void Backend::norm_rope_kv_store(Tensor& q_heads, Tensor& k_heads, const Tensor& v, const Tensor& q_norm,
                                 const Tensor& k_norm, float eps, const Tensor& positions, const RopeParams& params,
                                 KvLayer& cache, const Tensor& slots) {
  if (!q_norm.empty()) rmsnorm(q_heads, q_norm, eps, q_heads);
  if (!k_norm.empty()) rmsnorm(k_heads, k_norm, eps, k_heads);
  rope_kv_store(q_heads, k_heads, v, positions, params, cache, slots);
}

}  // namespace kiln
