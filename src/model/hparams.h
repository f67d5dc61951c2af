#pragma once
// Hyper-parameters of a model, read from GGUF metadata (or config.json seen as GGUF keys) (`<arch>.block_count`, ...). Fields
// an architecture fixes rather than stores (rope style, MoE gating) are set by that
// architecture's configure() after the generic read.
#include <string>
#include <vector>

#include "backend/backend.h"

namespace kiln::gguf {
class File;
}

namespace kiln {

class ModelSource;

struct HParams {
  std::string arch;
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0, n_head_kv = 0;
  int head_dim_k = 0, head_dim_v = 0;  // `.attention.key_length` / `.value_length`, else n_embd / n_head
  int n_ff = 0;                        // dense FFN width
  int n_vocab = 0;                     // rows of token_embd
  int n_ctx_train = 0;
  float rms_eps = 1e-5f;

  // Rotary embedding.
  RopeStyle rope_style = RopeStyle::Normal;
  int n_rot = 0;                       // `.rope.dimension_count`, else head_dim_k
  float rope_base = 10000.0f;
  float rope_freq_scale = 1.0f;        // 1 / `.rope.scaling.factor` for linear and YaRN scaling
  YarnParams yarn;

  // Attention.
  float attn_scale = 0.0f;             // 0: 1 / sqrt(head_dim_k)
  float attn_softcap = 0.0f;           // `.attn_logit_softcapping`
  float final_softcap = 0.0f;          // `.final_logit_softcapping`
  int sliding_window = 0;              // `.attention.sliding_window`
  std::vector<bool> layer_uses_window; // per layer: sliding window applies (set by the architecture)

  // Mixture of experts.
  int n_expert = 0, n_expert_used = 0;
  int n_ff_expert = 0;                 // `.expert_feed_forward_length`
  MoeGating expert_gating = MoeGating::Softmax;
  bool expert_weights_norm = false;
  float expert_weights_scale = 1.0f;

  // Hybrid models (GatedDeltaNet linear attention; set by the architecture's configure()).
  struct LinearAttention {
    int conv_kernel = 0;                  // `.ssm.conv_kernel`
    int n_k_heads = 0, n_v_heads = 0;     // `.ssm.group_count`, `.ssm.time_step_rank`
    int head_dim_k = 0, head_dim_v = 0;   // `.ssm.state_size`, `.ssm.inner_size` / n_v_heads
    std::vector<bool> layer_is_recurrent; // empty: no linear-attention layers
  } linear;

  // The generic part: every key under `<arch>.` that the common layers use (GGUF key
  // names; a checkpoint's config.json is translated to them by its source).
  static HParams from_source(const ModelSource& source);
  static HParams from_gguf(const gguf::File& file);

  float attention_scale() const;
  bool uses_window(int layer) const {
    return sliding_window > 0 && size_t(layer) < layer_uses_window.size() && layer_uses_window[size_t(layer)];
  }
};

}  // namespace kiln
