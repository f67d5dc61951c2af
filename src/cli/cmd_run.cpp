// `kiln run -m MODEL -p PROMPT`: continues a prompt, streaming only the continuation to
// stdout; the timings go to stderr, so `kiln run ... > out.txt` captures just the text.
#include <fmt/core.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_session.h"
#include "core/error.h"
#include "runtime/generator.h"

namespace kiln::cli {
namespace {

struct RunCli {
  ModelOptions model;
  SamplingOptions sampling;
  std::string prompt, prompt_file;
  int n_predict = -1;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "cannot read prompt file {}", path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void print_timings(const LoadedModel& m, const GenerationResult& r, int n_ctx) {
  const GenerationStats& s = r.stats;
  fmt::print(stderr, "\n\nkiln: load {:.0f} ms | prompt {} tokens, {:.1f} tok/s | generation {} tokens, {:.1f} tok/s | "
             "stopped: {}\n",
             m.load_seconds * 1e3, s.n_prompt, s.prompt_tokens_per_second(), s.n_generated,
             s.decode_tokens_per_second(), stop_reason_name(r.reason));
  if (r.reason == StopReason::ContextFull)
    fmt::print(stderr, "kiln: the context of {} tokens is full; give a larger one with -c\n", n_ctx);
}

void run(const RunCli& cli) {
  KILN_CHECK(cli.prompt.empty() || cli.prompt_file.empty(), "give the prompt with -p or -f, not both");
  const std::string prompt = cli.prompt_file.empty() ? cli.prompt : read_text_file(cli.prompt_file);
  LoadedModel m = load_model(cli.model);
  const std::vector<int32_t> ids = m.tokenizer->encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  KILN_CHECK(!ids.empty(), "the prompt is empty and the model adds no start token; give one with -p");

  Generator generator(*m.model, *m.tokenizer, m.n_ctx, cli.model.max_batch, m.cache_type);
  Sampler sampler(cli.sampling.resolved());
  GenerationOptions options;
  options.max_tokens = cli.n_predict;
  options.stop = cli.stop;
  options.stop_at_end_of_generation = !cli.ignore_eos;
  const GenerationResult r = generator.generate(ids, sampler, options, [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  print_timings(m, r, m.n_ctx);
}

}  // namespace

void register_run(CLI::App& app) {
  auto cli = std::make_shared<RunCli>();
  auto* cmd = app.add_subcommand("run", "Continue a prompt (the continuation streams to stdout)");
  add_model_options(cmd, cli->model);
  cmd->add_option("-p,--prompt", cli->prompt, "Prompt text");
  cmd->add_option("-f,--file", cli->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", cli->n_predict, "Tokens to generate (-1: until the end or a full context)")
      ->capture_default_str();
  cmd->add_option("--stop", cli->stop, "Stop when the text contains this string (repeatable; not printed)");
  cmd->add_flag("--ignore-eos", cli->ignore_eos, "Keep going past end-of-generation tokens");
  add_sampling_options(cmd, cli->sampling);
  cmd->footer("Sampling chain (llama.cpp's order): penalties -> top-k -> top-p -> min-p -> temperature -> draw.");
  cmd->callback([cli] { run(*cli); });
}

}  // namespace kiln::cli
