// config.json -> kiln architecture and GGUF metadata keys, the way llama.cpp's converter
// writes them, so that HParams::from_source and each architecture's configure() read a
// checkpoint exactly as they read a converted file.
#include <cmath>
#include <numbers>

#include "model/hf_checkpoint.h"

namespace kiln {

void Metadata::set_int(const std::string& key, int64_t v) {
  gguf::Value value;
  value.type = gguf::ValueType::I64;
  value.num.i = v;
  values_.insert_or_assign(key, std::move(value));
}

void Metadata::set_float(const std::string& key, double v) {
  gguf::Value value;
  value.type = gguf::ValueType::F64;
  value.num.f = v;
  values_.insert_or_assign(key, std::move(value));
}

void Metadata::set_bool(const std::string& key, bool v) {
  gguf::Value value;
  value.type = gguf::ValueType::BOOL;
  value.num.u = v ? 1 : 0;
  values_.insert_or_assign(key, std::move(value));
}

void Metadata::set_string(const std::string& key, std::string v) {
  strings_.push_back(std::move(v));
  gguf::Value value;
  value.type = gguf::ValueType::STRING;
  value.str = strings_.back();
  values_.insert_or_assign(key, std::move(value));
}

const gguf::Value* Metadata::find(std::string_view key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::vector<float> llama3_rope_factors(double rope_theta, int n_rot, double factor, double low_freq_factor,
                                       double high_freq_factor, double original_context) {
  // Frequencies whose wavelength is short next to the original context are kept, long
  // ones are divided by `factor`, and those between are blended smoothly.
  const double low_freq_wavelen = original_context / low_freq_factor;
  const double high_freq_wavelen = original_context / high_freq_factor;
  std::vector<float> factors;
  for (int i = 0; i < n_rot; i += 2) {
    const double freq = 1.0 / std::pow(rope_theta, double(i) / n_rot);
    const double wavelen = 2 * std::numbers::pi / freq;
    double f = 1.0;
    if (wavelen > low_freq_wavelen) {
      f = factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      f = 1.0 / ((1 - smooth) / factor + smooth);
    }
    factors.push_back(float(f));
  }
  return factors;
}

namespace hf_config {

struct ModelType {
  const char* model_type;
  const char* arch;
};

// The model types kiln loads from a checkpoint (each needs a table in hf_tensors.cpp).
constexpr ModelType kModelTypes[] = {
    {"llama", "llama"},   {"mixtral", "llama"},      {"qwen2", "qwen2"},
    {"qwen3", "qwen3"},   {"qwen3_moe", "qwen3moe"}, {"qwen3_next", "qwen3next"},
};

// config.json reads: null counts as absent.
struct Reader {
  const nlohmann::json& j;
  const std::string& source;

  const nlohmann::json* at(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t integer(const char* key) const {
    const nlohmann::json* v = at(key);
    if (!v) fail("{}: config.json lacks \"{}\"", source, key);
    if (!v->is_number_integer()) fail("{}: config.json \"{}\" is {}, not an integer", source, key, v->dump());
    return v->get<int64_t>();
  }
  int64_t integer(const char* key, int64_t fallback) const { return at(key) ? integer(key) : fallback; }
  double number(const nlohmann::json& obj, const char* key, double fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_number()) fail("{}: config.json \"{}\" is {}, not a number", source, key, it->dump());
    return it->get<double>();
  }
  double number(const char* key, double fallback) const { return number(j, key, fallback); }
  bool boolean(const char* key, bool fallback) const {
    const nlohmann::json* v = at(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail("{}: config.json \"{}\" is {}, not a boolean", source, key, v->dump());
    return v->get<bool>();
  }
  std::string string(const nlohmann::json& obj, const char* key, const char* fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_string()) fail("{}: config.json \"{}\" is {}, not a string", source, key, it->dump());
    return it->get<std::string>();
  }
};

// Rope: transformers 5 writes "rope_parameters" {rope_theta, rope_type, ...}; older files
// have "rope_theta" and "rope_scaling" {type or rope_type, factor, ...} at the top.
void translate_rope(const Reader& r, HfModelConfig& out, int head_dim) {
  const std::string prefix = out.arch + ".";
  nlohmann::json params = nlohmann::json::object();
  if (const nlohmann::json* p = r.at("rope_scaling")) params = *p;
  if (const nlohmann::json* p = r.at("rope_parameters")) params = *p;
  KILN_CHECK(params.is_object(), "{}: config.json rope parameters are {}, not an object", r.source, params.dump());
  const double theta = r.number(params, "rope_theta", r.number("rope_theta", 10000.0));
  out.metadata.set_float(prefix + "rope.freq_base", theta);

  const double partial = r.number(params, "partial_rotary_factor", r.number("partial_rotary_factor", 1.0));
  KILN_CHECK(partial > 0 && partial <= 1, "{}: partial_rotary_factor {} outside (0, 1]", r.source, partial);
  const int n_rot = int(head_dim * partial);
  out.metadata.set_int(prefix + "rope.dimension_count", n_rot);

  std::string type = r.string(params, "rope_type", "");
  if (type.empty()) type = r.string(params, "type", "default");
  if (type == "default") return;
  const double factor = r.number(params, "factor", 1.0);
  if (type == "linear") {
    out.metadata.set_string(prefix + "rope.scaling.type", "linear");
    out.metadata.set_float(prefix + "rope.scaling.factor", factor);
    return;
  }
  if (type == "llama3") {
    // The converter turns Llama 3.1's scaling into a tensor of per-pair divisors.
    out.computed["rope_freqs.weight"] = llama3_rope_factors(
        theta, n_rot, factor, r.number(params, "low_freq_factor", 1.0), r.number(params, "high_freq_factor", 4.0),
        r.number(params, "original_max_position_embeddings", 8192.0));
    return;
  }
  fail("{}: rope_type \"{}\" is not implemented for checkpoints (default, linear and llama3 are)", r.source, type);
}

void translate_moe(const Reader& r, HfModelConfig& out) {
  const std::string prefix = out.arch + ".";
  const int64_t n_expert = r.integer("num_experts", r.integer("num_local_experts", 0));
  if (n_expert == 0) return;
  out.metadata.set_int(prefix + "expert_count", n_expert);
  out.metadata.set_int(prefix + "expert_used_count", r.integer("num_experts_per_tok"));
  if (r.at("moe_intermediate_size")) out.metadata.set_int(prefix + "expert_feed_forward_length", r.integer("moe_intermediate_size"));
  if (r.at("norm_topk_prob")) out.metadata.set_bool(prefix + "expert_weights_norm", r.boolean("norm_topk_prob", true));
  if (r.at("shared_expert_intermediate_size"))
    out.metadata.set_int(prefix + "expert_shared_feed_forward_length", r.integer("shared_expert_intermediate_size"));
  // kiln (like llama.cpp) runs experts on every layer.
  const nlohmann::json* dense_layers = r.at("mlp_only_layers");
  KILN_CHECK(!dense_layers || dense_layers->empty(), "{}: mlp_only_layers {} (dense layers among MoE layers) is "
             "not implemented", r.source, dense_layers ? dense_layers->dump() : "");
  KILN_CHECK(r.integer("decoder_sparse_step", 1) == 1, "{}: decoder_sparse_step {} is not implemented (experts on "
             "every layer only)", r.source, r.integer("decoder_sparse_step", 1));
}

// Qwen3-Next's GatedDeltaNet layers.
void translate_linear_attention(const Reader& r, HfModelConfig& out) {
  const std::string prefix = out.arch + ".";
  const int64_t n_v = r.integer("linear_num_value_heads");
  out.metadata.set_int(prefix + "ssm.conv_kernel", r.integer("linear_conv_kernel_dim"));
  out.metadata.set_int(prefix + "ssm.state_size", r.integer("linear_key_head_dim"));
  out.metadata.set_int(prefix + "ssm.group_count", r.integer("linear_num_key_heads"));
  out.metadata.set_int(prefix + "ssm.time_step_rank", n_v);
  out.metadata.set_int(prefix + "ssm.inner_size", r.integer("linear_value_head_dim") * n_v);
  const int64_t interval = r.integer("full_attention_interval", 4);
  KILN_CHECK(interval > 0, "{}: full_attention_interval {}", r.source, interval);
  out.metadata.set_int(prefix + "full_attention_interval", interval);
  // kiln places full attention on every interval-th layer; an explicit list must agree.
  if (const nlohmann::json* types = r.at("layer_types")) {
    KILN_CHECK(types->is_array(), "{}: layer_types is not a list", r.source);
    for (size_t il = 0; il < types->size(); ++il) {
      const bool full = (il + 1) % size_t(interval) == 0;
      const std::string want = full ? "full_attention" : "linear_attention";
      KILN_CHECK((*types)[il] == want, "{}: layer_types[{}] is {}; kiln needs {} there (full attention every {} "
                 "layers)", r.source, il, (*types)[il].dump(), want, interval);
    }
  }
}

}  // namespace hf_config

HfModelConfig translate_hf_config(const nlohmann::json& config, const std::string& source) {
  using namespace hf_config;
  KILN_CHECK(config.is_object(), "{}: config.json is not a JSON object", source);
  const Reader r{config, source};
  HfModelConfig out;
  out.model_type = r.string(config, "model_type", "");
  KILN_CHECK(!out.model_type.empty(), "{}: config.json has no model_type", source);
  for (const ModelType& m : kModelTypes)
    if (out.model_type == m.model_type) out.arch = m.arch;
  if (out.arch.empty()) {
    std::string known;
    for (const ModelType& m : kModelTypes) known += fmt::format("{}{}", known.empty() ? "" : ", ", m.model_type);
    fail("{}: model_type \"{}\" cannot be loaded from a checkpoint yet (known: {}); convert it to GGUF", source,
         out.model_type, known);
  }
  const std::string act = r.string(config, "hidden_act", "silu");
  KILN_CHECK(act == "silu", "{}: hidden_act \"{}\" is not implemented for {} (silu is)", source, act, out.model_type);

  const std::string prefix = out.arch + ".";
  Metadata& md = out.metadata;
  md.set_string("general.architecture", out.arch);
  const int64_t n_embd = r.integer("hidden_size"), n_head = r.integer("num_attention_heads");
  KILN_CHECK(n_embd > 0 && n_head > 0, "{}: hidden_size {}, num_attention_heads {} must be positive", source,
             n_embd, n_head);
  KILN_CHECK(n_embd % n_head == 0 || r.at("head_dim"),
             "{}: hidden_size {} is not a multiple of num_attention_heads {} and head_dim is not given", source,
             n_embd, n_head);
  const int64_t head_dim = r.integer("head_dim", n_embd / n_head);
  md.set_int(prefix + "block_count", r.integer("num_hidden_layers"));
  md.set_int(prefix + "embedding_length", n_embd);
  md.set_int(prefix + "attention.head_count", n_head);
  md.set_int(prefix + "attention.head_count_kv", r.integer("num_key_value_heads", n_head));
  md.set_int(prefix + "attention.key_length", head_dim);
  md.set_int(prefix + "attention.value_length", head_dim);
  if (r.at("intermediate_size")) md.set_int(prefix + "feed_forward_length", r.integer("intermediate_size"));
  if (r.at("max_position_embeddings")) md.set_int(prefix + "context_length", r.integer("max_position_embeddings"));
  md.set_float(prefix + "attention.layer_norm_rms_epsilon", r.number("rms_norm_eps", 1e-6));
  if (r.at("vocab_size")) md.set_int(prefix + "vocab_size", r.integer("vocab_size"));
  // Qwen2/3 configs carry a window that use_sliding_window switches off (llama.cpp ignores it).
  if (r.boolean("use_sliding_window", true) && r.at("sliding_window"))
    md.set_int(prefix + "attention.sliding_window", r.integer("sliding_window"));
  out.tie_stated = r.at("tie_word_embeddings") != nullptr;
  out.tied_embeddings = r.boolean("tie_word_embeddings", false);

  translate_rope(r, out, int(head_dim));
  translate_moe(r, out);
  if (out.arch == "qwen3next") translate_linear_attention(r, out);
  return out;
}

}  // namespace kiln
