#pragma once
// Layer helpers shared by the architectures: each builds one familiar block from backend
// ops, reads the weights of layer `il` from pass.w, writes into named scratch buffers
// (reused by every layer) and reports its result to the debug hook under the name given.
// What varies between architectures is passed in or read from the weights present
// (biases, q/k norms, sinks) and from HParams (window, soft-capping, rope).
#include "model/forward.h"

namespace kiln {

// Token embeddings of the batch: {n_embd, T} ("inp_embd").
Tensor build_embedding(ForwardPass& pass);

// out = rmsnorm(x) * weight ("name", layer il).
void build_norm(ForwardPass& pass, const Tensor& x, const Tensor& weight, Tensor& out, std::string_view name, int il);

// Self-attention of layer il on the normed input: q/k/v projections (+ biases), optional
// per-head q/k norms, rope, store into the cache, attention, output projection.
// Returns {n_embd, T} ("attn_out").
Tensor build_attention(ForwardPass& pass, int il, const Tensor& x);

// Gated FFN: down(act(gate(x)) * up(x)). Returns {n_embd, T} ("ffn_out").
Tensor build_ffn(ForwardPass& pass, int il, const Tensor& x, const GluParams& act);

// Routed experts over x: router logits, top-k choice, weighted sum of the experts' gated
// FFNs. Returns {n_embd, T} ("ffn_moe_out"); with `residual`, also residual += the result
// (one op, so that a backend can fold the add into the experts' kernels).
Tensor build_moe(ForwardPass& pass, int il, const Tensor& x, const MoeRouteParams& route, const GluParams& act,
                 Tensor* residual = nullptr);
// The same over normed = rmsnorm(x) * ffn_norm ("ffn_norm"), the norm and the routing as one
// op (rmsnorm_moe_route) so that a backend can run them as one kernel.
Tensor build_norm_moe(ForwardPass& pass, int il, const Tensor& x, Tensor& normed, const MoeRouteParams& route,
                      const GluParams& act, Tensor* residual = nullptr);

// The head: picks the rows whose logits are wanted, final norm, output projection,
// final soft-capping when the model has it; writes pass.logits ("result_output").
void build_output(ForwardPass& pass, const Tensor& x);

// The pre-norm stack of llama and qwen, the residual stream x updated in place:
//   x += attention(norm(x));  x += ffn(norm(x)),
// ffn a gated MLP with activation `act`, or routed experts (`route`) on layers that have a
// router. Each norm goes with the products that read it (rmsnorm_matmul_parts) and each
// residual add with the product before it (matmul_add), so that a backend can fuse them.
void build_prenorm_layers(ForwardPass& pass, Tensor& x, const GluParams& act, const MoeRouteParams& route);

// The whole pass of the llama and qwen families: the embedding, the pre-norm stack with SiLU
// gates (experts routed as the hyperparameters say), the head.
void forward_prenorm_silu(ForwardPass& pass);

}  // namespace kiln
