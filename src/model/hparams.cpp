#include "model/hparams.h"

#include <cmath>

#include "formats/gguf.h"
#include "model/source.h"

namespace kiln {

HParams HParams::from_gguf(const gguf::File& file) { return from_source(GgufSource(file)); }

HParams HParams::from_source(const ModelSource& source) {
  HParams hp;
  hp.arch = std::string(source.architecture());
  KILN_CHECK(!hp.arch.empty(), "{}: no general.architecture", source.path());
  auto key = [&](const char* suffix) { return hp.arch + "." + suffix; };
  auto get_int = [&](const char* suffix, int64_t fallback) { return int(source.get_int(key(suffix), fallback)); };
  auto get_float = [&](const char* suffix, double fallback) { return float(source.get_float(key(suffix), fallback)); };
  auto require_int = [&](const char* suffix) { return int(source.get_int(key(suffix))); };

  hp.n_layer = require_int("block_count");
  hp.n_embd = require_int("embedding_length");
  hp.n_head = require_int("attention.head_count");
  hp.n_head_kv = get_int("attention.head_count_kv", hp.n_head);
  KILN_CHECK(hp.n_layer > 0 && hp.n_embd > 0 && hp.n_head > 0 && hp.n_head_kv > 0,
             "{}: block_count {}, embedding_length {}, head_count {} / {} must be positive", hp.arch, hp.n_layer,
             hp.n_embd, hp.n_head, hp.n_head_kv);
  hp.head_dim_k = get_int("attention.key_length", hp.n_embd / hp.n_head);
  hp.head_dim_v = get_int("attention.value_length", hp.head_dim_k);
  hp.n_ff = get_int("feed_forward_length", 0);
  hp.n_ctx_train = get_int("context_length", 0);
  hp.rms_eps = get_float("attention.layer_norm_rms_epsilon", 1e-5);

  hp.n_rot = get_int("rope.dimension_count", hp.head_dim_k);
  hp.rope_base = get_float("rope.freq_base", 10000.0);
  const std::string scaling(source.get_string(key("rope.scaling.type"), "none"));
  const float factor = get_float("rope.scaling.factor", 0.0);
  if ((scaling == "linear" || scaling == "yarn") && factor > 0) hp.rope_freq_scale = 1.0f / factor;
  if (scaling == "yarn") {
    hp.yarn.ext_factor = get_float("rope.scaling.yarn_ext_factor", 1.0);
    hp.yarn.attn_factor = get_float("rope.scaling.attn_factor", 1.0);
    hp.yarn.beta_fast = get_float("rope.scaling.yarn_beta_fast", 32.0);
    hp.yarn.beta_slow = get_float("rope.scaling.yarn_beta_slow", 1.0);
    hp.yarn.n_ctx_orig = get_int("rope.scaling.original_context_length", hp.n_ctx_train);
  }

  hp.attn_scale = get_float("attention.scale", 0.0);
  hp.attn_softcap = get_float("attn_logit_softcapping", 0.0);
  hp.final_softcap = get_float("final_logit_softcapping", 0.0);
  hp.sliding_window = get_int("attention.sliding_window", 0);
  hp.layer_uses_window.assign(size_t(hp.n_layer), hp.sliding_window > 0);

  hp.n_expert = get_int("expert_count", 0);
  hp.n_expert_used = get_int("expert_used_count", 0);
  hp.n_ff_expert = get_int("expert_feed_forward_length", hp.n_ff);
  hp.expert_weights_norm = source.get_bool(key("expert_weights_norm"), false);
  hp.expert_weights_scale = get_float("expert_weights_scale", 1.0);
  KILN_CHECK(hp.n_expert == 0 || (hp.n_expert_used > 0 && hp.n_expert_used <= hp.n_expert),
             "{}: expert_used_count {} of expert_count {}", hp.arch, hp.n_expert_used, hp.n_expert);

  const std::vector<int64_t>* embd = source.tensor_shape("token_embd.weight");
  hp.n_vocab = embd && embd->size() == 2 ? int((*embd)[1]) : get_int("vocab_size", 0);
  return hp;
}

float HParams::attention_scale() const {
  return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(float(head_dim_k));
}

}  // namespace kiln
