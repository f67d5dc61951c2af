// `kiln logits -m MODEL --ids "1 2 3" -o OUT.f32`: runs the token ids through the model (a
// GGUF file or a checkpoint directory, which needs no tokenizer files for this) as
// one sequence and writes the logits of every position as raw float32 (n_ids x n_vocab,
// row-major, little-endian) — the format of the reference dumps in testdata, so the two
// can be compared directly.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "cli/model_session.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "model/source.h"

namespace kiln::cli {

namespace logits_cmd {

struct Options {
  std::string model, ids, output;
  int threads = 0;
  int batch = 0;  // tokens per forward pass; 0: all at once
  std::string device = "auto";
  std::string cache_type = "f16";
  std::string cpu_weights = "map";
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string clean = text;
  for (char& c : clean)
    if (c == ',') c = ' ';
  std::istringstream in(clean);
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILN_CHECK(used == word.size() && v >= 0 && v <= INT32_MAX, "--ids: '{}' is not a token id", word);
    ids.push_back(int32_t(v));
  }
  KILN_CHECK(!ids.empty(), "--ids: no token ids given");
  return ids;
}

void run(const Options& o) {
  const std::vector<int32_t> ids = parse_ids(o.ids);
  auto source = open_model_source(o.model);  // a GGUF file, or a checkpoint directory
  BackendOptions bo;
  bo.threads = o.threads;
  const std::string device_name = o.device == "auto" ? auto_device() : o.device;
  bo.cpu_copy_weights = device_name == "cpu" && o.cpu_weights == "copy";
  const std::unique_ptr<Backend> device = make_backend(device_name, bo);
  Backend& backend = *device;
  auto model = Model::load(*source, backend);
  const int n_vocab = model->hparams().n_vocab;
  KvCacheConfig cache_config = model->cache_config(int(ids.size()));
  cache_config.dtype = parse_cache_type(o.cache_type);
  KvCache cache(backend, cache_config);
  const int seq = cache.add_sequence();

  std::vector<float> logits(ids.size() * size_t(n_vocab));
  const size_t chunk = o.batch > 0 ? size_t(o.batch) : ids.size();
  Batch batch;
  for (size_t start = 0; start < ids.size(); start += chunk) {
    batch.clear();
    for (size_t i = start; i < std::min(ids.size(), start + chunk); ++i) batch.add(ids[i], int32_t(i), seq, true);
    model->forward(batch, cache, logits.data() + start * size_t(n_vocab));
  }

  std::FILE* out = std::fopen(o.output.c_str(), "wb");
  KILN_CHECK(out, "cannot open {} for writing", o.output);
  const size_t written = std::fwrite(logits.data(), sizeof(float), logits.size(), out);
  const bool closed = std::fclose(out) == 0;
  KILN_CHECK(written == logits.size() && closed, "{}: write failed", o.output);
  fmt::print(stderr, "kiln logits: {} positions x {} vocabulary -> {}\n", ids.size(), n_vocab, o.output);
}

}  // namespace logits_cmd

void register_logits(CLI::App& app) {
  auto options = std::make_shared<logits_cmd::Options>();
  CLI::App* cmd = app.add_subcommand("logits", "Write the logits of every position of a token sequence (raw f32)");
  cmd->add_option("-m,--model", options->model, "GGUF model file or Hugging Face checkpoint directory")->required();
  cmd->add_option("--ids", options->ids, "token ids, separated by spaces or commas")->required();
  cmd->add_option("-o,--output", options->output, "output file: n_ids x n_vocab float32")->required();
  cmd->add_option("-t,--threads", options->threads, "CPU threads (0: one per core)");
  cmd->add_option("-b,--batch-size", options->batch, "tokens per forward pass (0: all in one)");
  cmd->add_option("--device", options->device, "auto (the GPU when one is usable), cpu or cuda");
  add_cache_type_option(cmd, options->cache_type);
  add_cpu_weights_option(cmd, options->cpu_weights);
  cmd->callback([options] { logits_cmd::run(*options); });
}

}  // namespace kiln::cli
