#pragma once
// Model weights, and the declarative tables that map GGUF tensor names onto them.
//
// Each architecture lists the tensors it reads, once, as a table of (GGUF name, field,
// need). The loader walks the table; a required tensor that is missing, or a tensor in the
// file that no table entry claims, is a load error naming the tensor — so a converter
// change or a misdetected architecture cannot silently drop weights.
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/hparams.h"

namespace kiln::gguf {
class File;
}

namespace kiln {

class ModelSource;

// Every per-layer weight any architecture uses; fields an architecture does not list stay
// empty views. Add fields here when a new architecture needs them.
struct LayerWeights {
  // attention
  Tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, bo;
  Tensor q_norm, k_norm;          // per-head RMSNorm of q and k (qwen3)
  Tensor post_attn_norm;          // norm of the attention output before the residual (gemma2)
  Tensor attn_sinks;              // per-head sink logits (gpt-oss)
  // dense feed-forward
  Tensor ffn_norm, ffn_gate, ffn_up, ffn_down, ffn_gate_b, ffn_up_b, ffn_down_b;
  Tensor post_ffn_norm;           // norm of the FFN output before the residual (gemma2)
  // mixture of experts: router and stacked experts
  Tensor moe_router, moe_router_b;
  Tensor exp_gate, exp_up, exp_down, exp_gate_b, exp_up_b, exp_down_b;
  // shared expert (qwen-next style)
  Tensor shexp_gate, shexp_up, shexp_down, shexp_router;
  // GatedDeltaNet linear attention (qwen3next, qwen35): q|k|v projection, output gate z,
  // short convolution, decay (ssm_a = -exp(A_log), dt bias), beta/alpha projections
  // (joint `ba` or separate), gated norm, output projection
  Tensor ssm_qkv, ssm_z, ssm_conv, ssm_a, ssm_dt_bias, ssm_ba, ssm_beta, ssm_alpha, ssm_norm, ssm_out;
};

struct ModelWeights {
  Tensor tok_embd, output_norm, output, rope_freqs;
  std::vector<LayerWeights> layers;
  // The output projection: `output`, or the token embedding when the file ties them.
  const Tensor& lm_head() const { return output.empty() ? tok_embd : output; }
};

enum class Need : uint8_t {
  Required,
  Optional,
  Dense,  // required when the model has no experts, ignored (so: an error if present) otherwise
  Moe,    // required when the model has experts
};

struct GlobalWeightSpec {
  const char* name;  // e.g. "token_embd.weight"
  Tensor ModelWeights::*field;
  Need need;
};

struct LayerWeightSpec {
  const char* name;  // without "blk.N.", e.g. "attn_q.weight"
  Tensor LayerWeights::*field;
  Need need;
};

// Loads the weights the tables name; throws for a missing required tensor or a tensor in
// the source no table entry uses.
ModelWeights load_weights(const ModelSource& source, Backend& backend, const HParams& hp,
                          std::span<const GlobalWeightSpec> globals, std::span<const LayerWeightSpec> per_layer);
ModelWeights load_weights(const gguf::File& file, Backend& backend, const HParams& hp,
                          std::span<const GlobalWeightSpec> globals, std::span<const LayerWeightSpec> per_layer);

}  // namespace kiln
