#pragma once
// Random-weight GGUF models with the shapes of real ones (`kiln synth`), for benchmarks
// and tests: the speed of a forward pass depends on shapes and weight types, not values.
//
// The files use llama.cpp's tensor names and metadata keys, so other GGUF tools load them.
// Matrices are random normal (std 0.02, from a fast seeded generator: the same seed gives
// the same bytes whatever the thread count), norms are 1. Tensors are generated, quantized
// and written a slice at a time, so a multi-GB model never sits in memory.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/types.h"

namespace kiln {

namespace gguf {
class File;
}

// The shape of a model. Zero fields are features the model does not have.
struct SyntheticShape {
  std::string arch;          // general.architecture: llama, qwen3, qwen3moe, qwen3next
  std::string name;          // general.name
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0, n_head_kv = 0;
  int head_dim = 0;          // per attention head
  int n_ff = 0;              // dense FFN width
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_output = false;  // no output.weight: the head reuses token_embd
  bool qk_norm = false;      // per-head RMSNorm of q and k (qwen3)
  // Mixture of experts.
  int n_expert = 0, n_expert_used = 0, n_ff_expert = 0;
  int n_ff_shared_expert = 0;  // qwen3next: one always-on expert with a sigmoid gate
  // qwen3next: GatedDeltaNet layers, with full (gated) attention every `full_attention_interval`-th layer.
  int full_attention_interval = 0;
  int linear_k_heads = 0, linear_v_heads = 0;
  int linear_head_dim_k = 0, linear_head_dim_v = 0;
  int conv_kernel = 0;
  float partial_rotary = 1.0f;  // fraction of each head that rotates
};

// Presets by name: llama3-1b, llama3-8b, qwen3-30b-a3b, qwen3-next-80b-a3b, and test-tiny
// (a llama of 2 layers and 64 wide, for tests).
SyntheticShape synthetic_preset(std::string_view name);
std::vector<std::string> synthetic_preset_names();

// Rows in the pool of SynthOptions::row_pool.
inline constexpr int64_t kSynthPoolRows = 256;

struct SynthOptions {
  GgmlType type = GgmlType::Q4_0;
  // llama.cpp's Q4_K_M mix: q4_K, with q6_K for output.weight and for attn_v / ffn_down in
  // the layers llama.cpp gives more bits (first and last eighth, every third between).
  bool q4_k_m = false;
  std::string vocab_path;    // a GGUF whose tokenizer.* metadata is copied ("" : placeholder)
  uint64_t seed = 42;
  int threads = 0;           // 0: all cores
  // Quantized matrices take each row from a pool of kSynthPoolRows random rows quantized
  // once per tensor (the pool row picked by a hash of the seed, tensor and row): the same
  // types, sizes and value distribution, made in seconds where quantizing every row into a
  // K-quant takes minutes (8B q4_K_M: ~1 min on 16 cores). For benchmarks, whose speed does
  // not depend on the values.
  bool row_pool = false;
  std::function<void(uint64_t done, uint64_t total, const std::string& tensor)> progress;
};

struct SynthReport {
  int n_tensors = 0;
  uint64_t n_params = 0;
  uint64_t bytes = 0;        // tensor data written
};

// One tensor of the model, in file order.
struct SyntheticTensor {
  std::string name;
  std::vector<int64_t> shape;  // innermost first
  GgmlType type = GgmlType::F32;
  float fill = 0.0f;           // value of every element when not random (norms: 1)
  bool random = true;
};

// The tensors a model of `shape` has, with the types `options` gives them.
std::vector<SyntheticTensor> synthetic_tensors(const SyntheticShape& shape, const SynthOptions& options);

// Writes the model to `path`. With options.vocab_path, the vocabulary's size replaces
// shape.n_vocab.
SynthReport write_synthetic_model(SyntheticShape shape, const SynthOptions& options, const std::string& path);

}  // namespace kiln
