// The CUDA backend's GatedDeltaNet ops (hybrid models): short convolution, gated delta
// rule, gated RMS norm and the sigmoid gate. Checks as the CPU backend's; kernels in
// ops_sequence.cu and ops_rows.cu.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_checks.h"
#include "backend/cuda/ops_extra.h"

namespace kiln {

using cuda_ops::hash_tensor;
using cuda_ops::layout_of;
using cuda_ops::require_f32;

void CudaBackend::causal_conv_silu(const Tensor& x, const Tensor& weight, Tensor& state, const BatchIndex& batch,
                                   Tensor& out) {
  require_f32(x, "causal_conv_silu", "x");
  require_f32(weight, "causal_conv_silu", "weight");
  require_f32(state, "causal_conv_silu", "state");
  require_f32(out, "causal_conv_silu", "out");
  const int64_t channels = x.ne[0], T = x.ne[1], kernel = weight.ne[0];
  KILN_CHECK(kernel >= 2 && weight.ne[1] == channels && weight.is_contiguous(),
             "cuda causal_conv_silu: weight {} {} is not a contiguous {{K >= 2, {}}}", weight.name, weight.describe(),
             channels);
  KILN_CHECK(x.ne[2] == 1 && out.ne[0] == channels && out.ne[1] == T && out.ne[2] == 1,
             "cuda causal_conv_silu: x {} and out {} must both be {{{}, T}}", x.describe(), out.describe(), channels);
  KILN_CHECK(state.ne[0] == kernel - 1 && state.ne[1] == channels && state.ne[3] == 1 && state.is_contiguous(),
             "cuda causal_conv_silu: state {} {} is not a contiguous {{{}, {}, n_seqs}}", state.name, state.describe(),
             kernel - 1, channels);
  KILN_CHECK(batch.positions.elements() == T && batch.seq_rows.elements() == T,
             "cuda causal_conv_silu: the batch index describes {} tokens, x has {}", batch.positions.elements(), T);
  cuda::ConvSiluArgs a;
  a.x = x.as<float>(), a.x_stride = int64_t(x.nb[1] / 4), a.channels = channels, a.n_tokens = T;
  a.weight = weight.as<float>(), a.kernel = int(kernel);
  a.state = state.as<float>(), a.n_state_rows = state.ne[2];
  a.positions = batch.positions.as<int32_t>(), a.seq_rows = batch.seq_rows.as<int32_t>();
  a.out = out.as<float>(), a.out_stride = int64_t(out.nb[1] / 4);
  cuda::SignatureHash h;
  h.pod(Op::CausalConvSilu);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &weight, &state, &batch.positions, &batch.seq_rows, &out}) hash_tensor(h, *t);
  record(h, T, [=](cudaStream_t s) { return cuda::causal_conv_silu(a, s); }, "causal_conv_silu");
}

void CudaBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& alpha,
                                   const Tensor& beta, const Tensor& ssm_a, const Tensor& dt_bias, Tensor& state,
                                   const BatchIndex& batch, const DeltaRuleParams& p, Tensor& out) {
  const char* op = "gated_delta_rule";
  for (const auto& [t, what] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&alpha, "alpha"}, {&beta, "beta"},
                                {&ssm_a, "ssm_a"}, {&dt_bias, "dt_bias"}, {&state, "state"}, {&out, "out"}})
    require_f32(*t, op, what);
  KILN_CHECK(p.n_k_heads > 0 && p.n_v_heads > 0 && p.n_v_heads % p.n_k_heads == 0 && p.head_dim_k > 0 &&
                 p.head_dim_v > 0,
             "cuda {}: {} value heads over {} key heads of {} / {} dims", op, p.n_v_heads, p.n_k_heads, p.head_dim_k,
             p.head_dim_v);
  const int64_t T = q.ne[1];
  const int64_t key_width = int64_t(p.n_k_heads) * p.head_dim_k, value_width = int64_t(p.n_v_heads) * p.head_dim_v;
  KILN_CHECK(q.ne[0] == key_width && k.ne[0] == key_width && v.ne[0] == value_width && out.ne[0] == value_width &&
                 k.ne[1] == T && v.ne[1] == T && out.ne[1] == T,
             "cuda {}: q {} k {} v {} out {} do not fit the heads", op, q.describe(), k.describe(), v.describe(),
             out.describe());
  for (const Tensor* g : {&alpha, &beta})
    KILN_CHECK(g->ne[0] * g->ne[1] == p.n_v_heads && g->ne[2] == T && g->ne[0] == alpha.ne[0],
               "cuda {}: {} {} is not a {{n0, n1, {}}} view of {} value heads", op, g->name, g->describe(), T,
               p.n_v_heads);
  KILN_CHECK(ssm_a.elements() == p.n_v_heads && dt_bias.elements() == p.n_v_heads,
             "cuda {}: ssm_a / dt_bias hold {} / {} values for {} value heads", op, ssm_a.elements(),
             dt_bias.elements(), p.n_v_heads);
  KILN_CHECK(state.ne[0] == p.head_dim_v && state.ne[1] == p.head_dim_k && state.ne[2] == p.n_v_heads &&
                 state.is_contiguous(),
             "cuda {}: state {} {} is not a contiguous {{{}, {}, {}, n_seqs}}", op, state.name, state.describe(),
             p.head_dim_v, p.head_dim_k, p.n_v_heads);
  KILN_CHECK(batch.positions.elements() == T && batch.seq_rows.elements() == T,
             "cuda {}: the batch index describes {} tokens, q has {}", op, batch.positions.elements(), T);
  cuda::DeltaRuleArgs a;
  a.q = q.as<float>(), a.k = k.as<float>(), a.v = v.as<float>();
  a.q_stride = int64_t(q.nb[1] / 4), a.k_stride = int64_t(k.nb[1] / 4), a.v_stride = int64_t(v.nb[1] / 4);
  a.alpha = alpha.as<float>(), a.beta = beta.as<float>(), a.gate_n0 = alpha.ne[0];
  a.alpha_s0 = int64_t(alpha.nb[0] / 4), a.alpha_s1 = int64_t(alpha.nb[1] / 4), a.alpha_s2 = int64_t(alpha.nb[2] / 4);
  a.beta_s0 = int64_t(beta.nb[0] / 4), a.beta_s1 = int64_t(beta.nb[1] / 4), a.beta_s2 = int64_t(beta.nb[2] / 4);
  a.ssm_a = ssm_a.as<float>(), a.dt_bias = dt_bias.as<float>();
  a.state = state.as<float>(), a.n_state_rows = state.ne[3];
  a.positions = batch.positions.as<int32_t>(), a.seq_rows = batch.seq_rows.as<int32_t>(), a.n_tokens = T;
  a.n_k_heads = p.n_k_heads, a.n_v_heads = p.n_v_heads, a.head_dim_k = p.head_dim_k, a.head_dim_v = p.head_dim_v;
  a.tiled_heads = p.tiled_heads, a.l2_eps = p.l2_eps;
  a.out = out.as<float>(), a.out_stride = int64_t(out.nb[1] / 4);
  cuda::SignatureHash h;
  h.pod(Op::GatedDeltaRule);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&q, &k, &v, &alpha, &beta, &ssm_a, &dt_bias, &state,
                                                           &batch.positions, &batch.seq_rows, &out})
    hash_tensor(h, *t);
  h.pod(p.n_k_heads), h.pod(p.n_v_heads), h.pod(p.head_dim_k), h.pod(p.head_dim_v), h.pod(p.tiled_heads);
  h.pod(p.l2_eps);
  record(h, T, [=](cudaStream_t s) { return cuda::gated_delta_rule(a, s); }, op);
}

void CudaBackend::rmsnorm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out) {
  require_f32(x, "rmsnorm_gated", "x");
  require_f32(z, "rmsnorm_gated", "z");
  require_f32(weight, "rmsnorm_gated", "weight");
  require_f32(out, "rmsnorm_gated", "out");
  const int64_t n = x.ne[0], rows = x.rows();
  KILN_CHECK(z.ne[0] == n && out.ne[0] == n && z.rows() == rows && out.rows() == rows && weight.elements() == n,
             "cuda rmsnorm_gated: x {} z {} out {} weight {} do not match", x.describe(), z.describe(),
             out.describe(), weight.describe());
  const cuda::RowLayout lx = layout_of(x), lz = layout_of(z), lo = layout_of(out);
  const float* w = weight.as<float>();
  cuda::SignatureHash h;
  h.pod(Op::RmsNormGated);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &z, &weight, &out}) hash_tensor(h, *t);
  h.pod(eps);
  record(h, rows, [=](cudaStream_t s) { return cuda::rmsnorm_gated(lx, lz, w, eps, lo, rows, n, s); },
         "rmsnorm_gated");
}

void CudaBackend::sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) {
  require_f32(x, "sigmoid_mul", "x");
  require_f32(gate, "sigmoid_mul", "gate");
  require_f32(out, "sigmoid_mul", "out");
  const int64_t n = x.ne[0];
  const bool per_row = gate.ne[0] == 1 && n != 1;
  KILN_CHECK((gate.ne[0] == n || per_row) && gate.rows() == x.rows() && out.ne[0] == n && out.rows() == x.rows(),
             "cuda sigmoid_mul: x {} gate {} out {} do not match", x.describe(), gate.describe(), out.describe());
  cuda::EltwiseArgs e;
  e.kind = cuda::EltwiseKind::SigmoidMul;
  e.a = layout_of(x), e.b = layout_of(gate), e.out = layout_of(out);
  e.rows = x.rows(), e.n = n, e.b_one_value = per_row;
  cuda::SignatureHash h;
  h.pod(Op::SigmoidMul);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &gate, &out}) hash_tensor(h, *t);
  record(h, x.rows(), [=](cudaStream_t s) { return cuda::eltwise(e, s); }, "sigmoid_mul");
}

}  // namespace kiln
