#include "cli/model_session.h"

#include <fmt/core.h>

#include <chrono>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "model/hf_checkpoint.h"
#include "runtime/memory_estimate.h"
#include "tokenizer/hf_files.h"

namespace kiln::cli {

void add_model_options(CLI::App* cmd, ModelOptions& o, bool with_context) {
  cmd->add_option("-m,--model", o.path, "Model: a GGUF file or a Hugging Face checkpoint directory")->required();
  cmd->add_option("-t,--threads", o.threads, "Threads (default: one per core)");
  cmd->add_option("--device", o.device, "auto (the GPU when one is usable), cpu or cuda")->capture_default_str();
  add_cache_type_option(cmd, o.cache_type);
  add_cpu_weights_option(cmd, o.cpu_weights);
  if (!with_context) return;
  cmd->add_option("-c,--ctx-size", o.n_ctx, "Context length in tokens (0: the model's training context)")
      ->capture_default_str();
  cmd->add_option("-b,--batch-size", o.max_batch, "Most prompt tokens run in one forward pass")->capture_default_str();
}

void add_cpu_weights_option(CLI::App* cmd, std::string& cpu_weights) {
  cmd->add_option("--cpu-weights", cpu_weights,
                  "CPU device: map (weights read from the mapped file, resident as they are touched) or copy "
                  "(copied at load into anonymous memory with 2 MiB pages where granted: faster decode, the "
                  "weights' size in extra memory)")
      ->check(CLI::IsMember({"map", "copy"}))
      ->capture_default_str();
}

void add_cache_type_option(CLI::App* cmd, std::string& cache_type) {
  cmd->add_option("--cache-type", cache_type,
                  "KV cache entries: f16 (half the memory; keys, values and queries are rounded to f16 in "
                  "attention, as llama.cpp does by default) or f32 (exact: what the reference tests use)")
      ->check(CLI::IsMember({"f16", "f32"}))
      ->capture_default_str();
}

GgmlType parse_cache_type(const std::string& name) {
  if (name == "f16") return GgmlType::F16;
  if (name == "f32") return GgmlType::F32;
  fail("--cache-type '{}': use f16 or f32", name);
}

// The tokenizer files beside a checkpoint (tokenizer.json, tokenizer.model, vocab.json +
// merges.txt). A checkpoint may have none: the model still runs on token ids (kiln logits).
Tokenizer checkpoint_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  try {
    return load_tokenizer(dir);
  } catch (const Error& e) {
    fail("{}\n(this command needs a tokenizer to read text; `kiln logits -m {} --ids ...` runs the model on token "
         "ids without one)", e.what(), path);
  }
}

// Bytes of every tensor the source stores: what `--cpu-weights copy` may copy (a checkpoint's
// tensors that load transformed are copies anyway; counting them too errs on the safe side).
static size_t stored_weight_bytes(const ModelSource& source) {
  size_t bytes = 0;
  if (const gguf::File* file = source.gguf_file()) {
    for (const gguf::TensorInfo& t : file->tensors()) bytes += t.bytes;
  } else if (const auto* hf = dynamic_cast<const HfCheckpointSource*>(&source)) {
    for (const safetensors::Tensor* t : hf->checkpoint().tensors()) bytes += t->bytes;
  }
  return bytes;
}

LoadedModel load_model(const ModelOptions& o, bool with_tokenizer) {
  namespace fs = std::filesystem;
  const auto start = std::chrono::steady_clock::now();
  LoadedModel m;
  m.source = open_model_source(o.path);  // a GGUF file, or a checkpoint directory
  m.file = m.source->gguf_file();
  const HParams hp = HParams::from_source(*m.source);
  KILN_CHECK(o.n_ctx >= 0, "context size {} is negative", o.n_ctx);
  m.n_ctx = o.n_ctx > 0 ? o.n_ctx : (hp.n_ctx_train > 0 ? hp.n_ctx_train : 4096);
  m.cache_type = parse_cache_type(o.cache_type);
  BackendOptions bo;
  bo.threads = o.threads;
  const std::string device = o.device == "auto" ? auto_device() : o.device;
  bo.cpu_copy_weights = device == "cpu" && o.cpu_weights == "copy";
  MemoryEstimate estimate = estimate_memory(hp, m.n_ctx, o.max_batch, m.cache_type);
  if (bo.cpu_copy_weights) estimate.weight_copy_bytes = stored_weight_bytes(*m.source);
  check_memory_fits(estimate, m.n_ctx);

  m.backend = make_backend(device, bo);
  m.model = Model::load(*m.source, *m.backend);
  if (with_tokenizer) m.tokenizer.emplace(m.file ? Tokenizer::from_gguf(*m.file) : checkpoint_tokenizer(o.path));
  m.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

void add_sampling_options(CLI::App* cmd, SamplingOptions& o) {
  SamplerParams& p = o.params;
  cmd->add_option("--temp", p.temperature, "Temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", p.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
  cmd->add_option("--top-p", p.top_p, "Keep the smallest set of tokens with this much probability (1: off)")
      ->capture_default_str();
  cmd->add_option("--min-p", p.min_p, "Drop tokens less likely than min-p times the most likely (0: off)")
      ->capture_default_str();
  cmd->add_option("--repeat-penalty", p.repeat_penalty, "Penalize repeated tokens (1: off)")->capture_default_str();
  cmd->add_option("--repeat-last-n", p.penalty_last_n, "Tokens the penalties look back over (-1: all)")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", p.presence_penalty, "Subtract from tokens seen (0: off)")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", p.frequency_penalty, "Subtract per occurrence (0: off)")
      ->capture_default_str();
  cmd->add_option("-s,--seed", o.seed, "Random seed (-1: a random one)")->capture_default_str();
}

SamplerParams SamplingOptions::resolved() const {
  SamplerParams p = params;
  p.seed = seed >= 0 ? uint64_t(seed) : (uint64_t(std::random_device{}()) << 32) ^ uint64_t(std::random_device{}());
  return p;
}

}  // namespace kiln::cli
