// `kiln chat -m MODEL`: a conversation on stdin/stdout. Each user line is added to the
// conversation, the model's chat template renders it whole, and the generator prefills only
// the tokens its KV cache does not already hold. Works the same when stdin is a pipe, so a
// chat can be scripted: `printf 'Hi\nWhat is 2+2?\n' | kiln chat -m model.gguf`.
#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/model_session.h"
#include "core/error.h"
#include "runtime/generator.h"
#include "tokenizer/chat_template_files.h"

namespace kiln::cli {
namespace {

// Used when the model ships no template: a plain transcript, stopped at the next "User:".
constexpr const char* kFallbackTemplate =
    "{% for m in messages %}"
    "{% if m.role == 'user' %}{{ 'User: ' + m.content + '\\n' }}"
    "{% elif m.role == 'assistant' %}{{ 'Assistant: ' + m.content + '\\n' }}"
    "{% else %}{{ m.content + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
constexpr const char* kFallbackStop = "\nUser:";

struct ChatCli {
  ModelOptions model;
  SamplingOptions sampling;
  std::string system;
  int n_predict = -1;
  bool timings = false;
};

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

std::string token_text_or_empty(const Tokenizer& t, int32_t id) {
  return id == kNoToken ? std::string() : t.token_text(id);
}

void run(const ChatCli& cli) {
  LoadedModel m = load_model(cli.model);
  const Tokenizer& tokenizer = *m.tokenizer;
  const std::string bos = token_text_or_empty(tokenizer, tokenizer.special().bos);
  const std::string eos = token_text_or_empty(tokenizer, tokenizer.special().eos);
  GenerationOptions options;
  options.max_tokens = cli.n_predict;
  std::optional<ChatTemplate> chat_template = find_chat_template(cli.model.path, &tokenizer);
  if (!chat_template) {
    fmt::print(stderr, "kiln: {} has no chat template; using a plain 'User: ... / Assistant: ...' transcript\n",
               cli.model.path);
    options.stop.push_back(kFallbackStop);
    chat_template.emplace(kFallbackTemplate, bos, eos);
  }

  Generator generator(*m.model, tokenizer, m.n_ctx, cli.model.max_batch, m.cache_type);
  Sampler sampler(cli.sampling.resolved());
  const bool interactive = ::isatty(STDIN_FILENO);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  auto start_conversation = [&] {
    messages = nlohmann::ordered_json::array();
    if (!cli.system.empty()) messages.push_back({{"role", "system"}, {"content", cli.system}});
  };
  start_conversation();
  if (interactive) fmt::print(stderr, "kiln chat: /reset starts over, /exit (or Ctrl-D) quits\n");

  std::string line;
  while (true) {
    if (interactive) fmt::print(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    const std::string text = trim(line);
    if (text.empty()) continue;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/reset") {
      start_conversation();
      generator.reset();
      if (interactive) fmt::print(stderr, "(conversation cleared)\n");
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", text}});
    const std::string rendered = chat_template->render(messages, /*add_generation_prompt=*/true);
    // Most templates write the BOS text themselves; add the token only when one does not.
    const bool add_bos = tokenizer.adds_bos() && (bos.empty() || rendered.rfind(bos, 0) != 0);
    std::vector<int32_t> ids = tokenizer.encode(rendered, /*add_special=*/false, /*parse_special=*/true);
    if (add_bos) ids.insert(ids.begin(), tokenizer.special().bos);
    if (ids.size() >= size_t(m.n_ctx)) {
      fmt::print(stderr, "kiln: the conversation ({} tokens) no longer fits the context of {} tokens; /reset to "
                 "start over, or give a larger context with -c\n", ids.size(), m.n_ctx);
      messages.erase(messages.size() - 1);
      continue;
    }
    const GenerationResult r = generator.generate(ids, sampler, options, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    std::fputs("\n", stdout);
    std::fflush(stdout);
    messages.push_back({{"role", "assistant"}, {"content", trim(r.text)}});
    if (cli.timings)
      fmt::print(stderr, "[prompt {} new + {} cached tokens, {:.1f} tok/s | reply {} tokens, {:.1f} tok/s | {}]\n",
                 r.stats.n_prompt, r.stats.n_reused, r.stats.prompt_tokens_per_second(), r.stats.n_generated,
                 r.stats.decode_tokens_per_second(), stop_reason_name(r.reason));
    if (r.reason == StopReason::ContextFull)
      fmt::print(stderr, "kiln: the context of {} tokens is full; /reset to start over\n", m.n_ctx);
  }
}

}  // namespace

void register_chat(CLI::App& app) {
  auto cli = std::make_shared<ChatCli>();
  auto* cmd = app.add_subcommand("chat", "Chat with a model (lines from stdin; /reset, /exit)");
  add_model_options(cmd, cli->model);
  cmd->add_option("--system", cli->system, "System prompt");
  cmd->add_option("-n,--n-predict", cli->n_predict, "Most tokens per reply (-1: no limit)")->capture_default_str();
  cmd->add_flag("--timings", cli->timings, "Print token counts and speeds after each reply (stderr)");
  add_sampling_options(cmd, cli->sampling);
  cmd->callback([cli] { run(*cli); });
}

}  // namespace kiln::cli
