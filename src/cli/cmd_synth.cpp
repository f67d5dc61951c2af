// `kiln synth --preset NAME --type TYPE -o FILE.gguf`: a random-weight model with a real
// model's shape, for benchmarks (see runtime/synthetic_model.h).
#include <fmt/core.h>

#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "cli/format.h"
#include "cli/progress.h"
#include "core/error.h"
#include "runtime/synthetic_model.h"

namespace kiln::cli {
namespace {

struct SynthCli {
  std::string preset, type, vocab, output;
  uint64_t seed = 42;
  int threads = 0;
  bool fast = false;
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

void run(const SynthCli& cli) {
  const SyntheticShape shape = synthetic_preset(cli.preset);
  SynthOptions options;
  options.seed = cli.seed;
  options.threads = cli.threads;
  options.row_pool = cli.fast;
  options.vocab_path = cli.vocab;
  if (cli.type == "q4_K_M" || cli.type == "Q4_K_M" || cli.type == "q4_k_m") {
    options.q4_k_m = true;
  } else {
    const auto type = type_from_name(cli.type);
    KILN_CHECK(type.has_value(), "unknown tensor type '{}' (e.g. f32, f16, q8_0, q4_0, q4_K, q6_K, or q4_K_M)",
               cli.type);
    options.type = *type;
  }
  ProgressBar bar(fmt::format("synth {} {}", cli.preset, cli.type));
  options.progress = [&](uint64_t done, uint64_t total, const std::string& name) { bar.update(done, total, name); };
  const auto start = std::chrono::steady_clock::now();
  const SynthReport r = write_synthetic_model(shape, options, cli.output);
  bar.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(stderr, "{}: {} tensors, {} parameters, {} in {:.1f}s\n", cli.output, r.n_tensors,
             human_count(int64_t(r.n_params)), human_bytes(r.bytes), seconds);
}

}  // namespace

void register_synth(CLI::App& app) {
  auto cli = std::make_shared<SynthCli>();
  auto* cmd = app.add_subcommand("synth", "Write a random-weight GGUF with a real model's shape (for benchmarks)");
  cmd->add_option("--preset", cli->preset, "Shape: " + join(synthetic_preset_names()))->required();
  cmd->add_option("--type", cli->type, "Weight type: f32, f16, q8_0, q4_0, q4_K, ... or q4_K_M (llama.cpp's mix)")
      ->required();
  cmd->add_option("--vocab", cli->vocab, "GGUF whose tokenizer to copy (its size sets the vocabulary)");
  cmd->add_option("--seed", cli->seed, "Random seed")->capture_default_str();
  cmd->add_option("-t,--threads", cli->threads, "Threads (default: all cores)");
  cmd->add_flag("--fast", cli->fast,
                "Quantized matrices repeat a pool of 256 random rows quantized once per tensor: the same types, "
                "sizes and value distribution in seconds (quantizing every row into a K-quant takes minutes)");
  cmd->add_option("-o,--output", cli->output, "Output GGUF file")->required();
  cmd->callback([cli] { run(*cli); });
}

}  // namespace kiln::cli
