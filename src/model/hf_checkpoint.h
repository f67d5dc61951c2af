#pragma once
// A Hugging Face checkpoint (config.json + *.safetensors, as transformers saves it) seen
// as a ModelSource: config.json becomes GGUF metadata, checkpoint tensors get GGUF names,
// and where llama.cpp's converter would change a tensor's layout, the same change is made
// here, once, at load (docs/model-framework.md lists each).
//
// Three pieces:
//   - hf_config.cpp:  config.json -> architecture + GGUF keys (+ tensors computed from the
//                     config, e.g. Llama 3 rope frequency factors);
//   - hf_tensors.cpp: per model_type, the declarative table from checkpoint names to GGUF
//                     names and the transform each needs;
//   - hf_checkpoint.cpp: this class, which checks that every checkpoint tensor is claimed
//                     and runs the transforms when a tensor is loaded.
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "model/source.h"

namespace kiln {

// GGUF-style metadata built in memory (strings are owned here). Not copyable: values'
// string views point into `strings_`.
class Metadata {
 public:
  Metadata() = default;
  Metadata(Metadata&&) = default;
  Metadata& operator=(Metadata&&) = default;
  Metadata(const Metadata&) = delete;
  Metadata& operator=(const Metadata&) = delete;

  void set_int(const std::string& key, int64_t v);
  void set_float(const std::string& key, double v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, std::string v);
  const gguf::Value* find(std::string_view key) const;

 private:
  std::map<std::string, gguf::Value, std::less<>> values_;
  std::deque<std::string> strings_;
};

// What config.json says, in kiln's terms.
struct HfModelConfig {
  std::string model_type;  // config.json "model_type"
  std::string arch;        // kiln architecture (general.architecture)
  Metadata metadata;
  // Tensors the converter computes from the config (e.g. "rope_freqs.weight"), f32.
  std::map<std::string, std::vector<float>> computed;
  bool tied_embeddings = false;  // tie_word_embeddings (the model's default when absent)
  bool tie_stated = false;       // whether config.json states it
};

// Translates a parsed config.json; `source` names it in errors. Throws for a model_type
// kiln cannot load from a checkpoint, or a setting it does not implement.
HfModelConfig translate_hf_config(const nlohmann::json& config, const std::string& source);

// Llama 3.1's rope scaling as llama.cpp's converter stores it (the `rope_freqs` tensor):
// one divisor per rotated pair, n_rot / 2 values.
std::vector<float> llama3_rope_factors(double rope_theta, int n_rot, double factor, double low_freq_factor,
                                       double high_freq_factor, double original_context);

// How a checkpoint tensor becomes a GGUF one.
enum class HfTransform : uint8_t {
  None,          // same data (1-D tensors of another float type are widened to f32)
  AddOne,        // w + 1: HF's "(1 + w)" RMSNorm weight as a plain scale (f32)
  NegExp,        // -exp(w): Qwen3-Next's A_log as the decay rate ssm_a (f32)
  ConvKernel,    // depthwise conv1d weight [C, 1, K] as GGUF's {K, C} (f32)
  QkvzToQkv,     // Qwen3-Next in_proj_qkvz: the q | k | v rows, regrouped (see hf_tensors.cpp)
  QkvzToZ,       // ... and the z (output gate) rows
};

// One line of a model_type's table. `hf` may hold "{L}" (layer) and "{E}" (expert);
// `gguf` may hold "{L}". A rule with "{E}" stacks experts 0..n_expert-1 into one tensor
// {.., .., n_expert} (GGUF's *_exps layout).
struct HfTensorRule {
  const char* hf;
  const char* gguf;
  HfTransform transform = HfTransform::None;
};

struct HfTensorTable {
  std::span<const HfTensorRule> rules;
  std::span<const char* const> ignored;  // checkpoint tensors that hold nothing kiln uses
};

// The table for a kiln architecture (as translate_hf_config names it), or null.
const HfTensorTable* find_hf_tensor_table(std::string_view arch);

// Rows of Qwen3-Next's in_proj_qkvz that make GGUF's attn_qkv (want_z false) or
// attn_gate (want_z true), in order.
std::vector<int64_t> qwen3next_qkvz_rows(int n_k_heads, int n_v_heads, int head_dim_k, int head_dim_v, bool want_z);

class HfCheckpointSource final : public ModelSource {
 public:
  // `path`: a checkpoint directory, a .safetensors file (config.json beside it) or an index.
  static std::unique_ptr<HfCheckpointSource> open(const std::string& path);

  SourceFormat format() const override { return SourceFormat::HfCheckpoint; }
  const std::string& path() const override { return path_; }
  const gguf::Value* find(std::string_view key) const override { return config_.metadata.find(key); }
  std::vector<std::string> tensor_names() const override;
  const std::vector<int64_t>* tensor_shape(std::string_view name) const override;
  Tensor load_tensor(std::string_view name, Backend& backend) const override;
  std::string native_name(std::string_view name) const override;

  const HfModelConfig& config() const { return config_; }
  const safetensors::Checkpoint& checkpoint() const { return *checkpoint_; }

  // How one GGUF-named tensor is made.
  struct Recipe {
    std::string name;  // GGUF name (backs the loaded tensor's name)
    HfTransform transform = HfTransform::None;
    std::vector<const safetensors::Tensor*> sources;  // one, or one per expert
    bool stacked = false;                              // sources are experts 0..E-1
    const std::vector<float>* computed = nullptr;      // tensors computed from the config
    std::vector<int64_t> rows;                         // QkvzTo*: source rows, in order
    GgmlType type = GgmlType::F32;
    std::vector<int64_t> shape;                        // GGUF order
    bool is_view = false;                              // used as it lies in the file:
    gguf::TensorInfo view;                             // ... described for Backend::weight
  };

 private:
  HfCheckpointSource() = default;
  void build_recipes();
  void add_rule_match(const HfTensorRule& rule, const safetensors::Tensor& t, int layer, int expert);
  void finish_recipe(Recipe& r);

  std::string path_;
  std::unique_ptr<safetensors::Checkpoint> checkpoint_;
  HfModelConfig config_;
  std::map<std::string, Recipe, std::less<>> recipes_;
};

}  // namespace kiln
