#pragma once
// What `kiln run`, `chat` and `bench` share: the model options (-m, -c, -t), loading a model
// with its tokenizer onto the CPU backend, the sampling options, and stderr reports.
#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_backend.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "model/source.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace kiln::cli {

struct ModelOptions {
  std::string path;
  int n_ctx = 4096;    // 0: the model's training context
  int threads = 0;     // 0: one per core
  int max_batch = 512; // prompt tokens per forward pass
  std::string device = "auto";  // --device: auto (GPU when present), cpu, cuda
  std::string cache_type = "f16";  // --cache-type: the KV cache's entries, f16 or f32
  std::string cpu_weights = "map";  // --cpu-weights: map (read from the file) or copy (huge pages)
};

// -m/--model, -t/--threads, --device, --cache-type, and (when `with_context`) -c/--ctx-size
// and -b/--batch-size.
void add_model_options(CLI::App* cmd, ModelOptions& options, bool with_context = true);

// --cache-type f16|f32 (default f16), for commands with their own options (kiln logits).
void add_cache_type_option(CLI::App* cmd, std::string& cache_type);
// --cpu-weights map|copy (see ModelOptions::cpu_weights).
void add_cpu_weights_option(CLI::App* cmd, std::string& cpu_weights);
// "f16" -> F16, "f32" -> F32; anything else is refused with the choices.
GgmlType parse_cache_type(const std::string& name);

struct LoadedModel {
  std::unique_ptr<ModelSource> source;  // a GGUF file or a Hugging Face checkpoint directory
  const gguf::File* file = nullptr;     // the GGUF file, when the model is one
  std::unique_ptr<Backend> backend;  // see ModelOptions::device
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;
  int n_ctx = 0;             // the context the caller should allocate
  GgmlType cache_type = GgmlType::F16;  // the KV cache's entries (ModelOptions::cache_type)
  double load_seconds = 0;
};

// Opens the model, checks that a context of options.n_ctx fits in memory (refusing with a
// clear message otherwise), and loads weights and (when asked) the tokenizer.
LoadedModel load_model(const ModelOptions& options, bool with_tokenizer = true);

// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --presence-penalty,
// --frequency-penalty, --seed (default: random); resolved() gives the parameters to use.
struct SamplingOptions {
  SamplerParams params;
  int64_t seed = -1;
  SamplerParams resolved() const;
};
void add_sampling_options(CLI::App* cmd, SamplingOptions& options);

}  // namespace kiln::cli
