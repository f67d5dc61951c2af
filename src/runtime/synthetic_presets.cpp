// The shapes `kiln synth` knows, from the models' published configurations.
#include <algorithm>

#include "core/error.h"
#include "runtime/synthetic_model.h"

namespace kiln {

namespace {

SyntheticShape llama3(std::string name, int n_layer, int n_embd, int n_ff, int n_ctx) {
  SyntheticShape s;
  s.arch = "llama";
  s.name = std::move(name);
  s.n_layer = n_layer;
  s.n_embd = n_embd;
  s.n_head = 32;
  s.n_head_kv = 8;
  s.head_dim = n_embd / 32;
  s.n_ff = n_ff;
  s.n_vocab = 128256;
  s.n_ctx_train = n_ctx;
  s.rope_base = 500000.0f;
  s.rms_eps = 1e-5f;
  return s;
}

// Llama-2-13B (HF config): 40 layers of width 5120, 40 heads of 128 without grouping, a
// 32000-token vocabulary. Rows wider than 4096, which the 8B shapes never take.
SyntheticShape llama2_13b() {
  SyntheticShape s;
  s.arch = "llama";
  s.name = "Llama-2-13B shape (random)";
  s.n_layer = 40;
  s.n_embd = 5120;
  s.n_head = 40;
  s.n_head_kv = 40;
  s.head_dim = 128;
  s.n_ff = 13824;
  s.n_vocab = 32000;
  s.n_ctx_train = 4096;
  s.rope_base = 10000.0f;
  s.rms_eps = 1e-5f;
  return s;
}

// Qwen3-30B-A3B (HF config): 48 layers, 128 experts of width 768, 8 used, q/k norms.
SyntheticShape qwen3_30b_a3b() {
  SyntheticShape s;
  s.arch = "qwen3moe";
  s.name = "Qwen3-30B-A3B (random)";
  s.n_layer = 48;
  s.n_embd = 2048;
  s.n_head = 32;
  s.n_head_kv = 4;
  s.head_dim = 128;
  s.n_ff = 6144;
  s.n_vocab = 151936;
  s.n_ctx_train = 40960;
  s.rope_base = 1000000.0f;
  s.rms_eps = 1e-6f;
  s.qk_norm = true;
  s.n_expert = 128;
  s.n_expert_used = 8;
  s.n_ff_expert = 768;
  return s;
}

// Qwen3-Next-80B-A3B (HF config): 48 layers in groups of four, three GatedDeltaNet layers
// (16 key heads, 32 value heads, 128 dims each, convolution of 4) and one gated attention
// layer (16 heads, 2 KV heads, 256 dims, a quarter of each head rotated); every layer has
// 512 experts of width 512, 10 used, and a shared expert of width 512.
SyntheticShape qwen3_next_80b_a3b() {
  SyntheticShape s;
  s.arch = "qwen3next";
  s.name = "Qwen3-Next-80B-A3B (random)";
  s.n_layer = 48;
  s.n_embd = 2048;
  s.n_head = 16;
  s.n_head_kv = 2;
  s.head_dim = 256;
  s.n_ff = 5120;
  s.n_vocab = 151936;
  s.n_ctx_train = 262144;
  s.rope_base = 10000000.0f;
  s.rms_eps = 1e-6f;
  s.qk_norm = true;
  s.n_expert = 512;
  s.n_expert_used = 10;
  s.n_ff_expert = 512;
  s.n_ff_shared_expert = 512;
  s.full_attention_interval = 4;
  s.linear_k_heads = 16;
  s.linear_v_heads = 32;
  s.linear_head_dim_k = 128;
  s.linear_head_dim_v = 128;
  s.conv_kernel = 4;
  s.partial_rotary = 0.25f;
  return s;
}

// Small enough for unit tests, with rows of 256 so that every block type fits.
SyntheticShape test_tiny() {
  SyntheticShape s;
  s.arch = "llama";
  s.name = "test-tiny (random)";
  s.n_layer = 2;
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.head_dim = 64;
  s.n_ff = 512;
  s.n_vocab = 512;
  s.n_ctx_train = 256;
  s.rope_base = 10000.0f;
  return s;
}

}  // namespace

std::vector<std::string> synthetic_preset_names() {
  return {"llama3-1b", "llama3-8b", "llama2-13b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "test-tiny"};
}

SyntheticShape synthetic_preset(std::string_view name) {
  // Llama-3.2-1B's shape with an untied output matrix (about 1.5 B parameters).
  if (name == "llama3-1b") return llama3("Llama-3.2-1B shape (random)", 16, 2048, 8192, 131072);
  if (name == "llama3-8b") return llama3("Llama-3-8B shape (random)", 32, 4096, 14336, 8192);
  if (name == "llama2-13b") return llama2_13b();
  if (name == "qwen3-30b-a3b") return qwen3_30b_a3b();
  if (name == "qwen3-next-80b-a3b") return qwen3_next_80b_a3b();
  if (name == "test-tiny") return test_tiny();
  std::string known;
  for (const std::string& n : synthetic_preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown preset '{}' (known: {})", name, known);
}

}  // namespace kiln
