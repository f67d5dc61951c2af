// `kiln template -m MODEL --messages FILE.json [--add-generation-prompt]`: renders the
// model's chat template over the messages and prints the prompt exactly as the model
// would see it (no trailing newline is added).
// MODEL: a GGUF file (tokenizer.chat_template, BOS/EOS from its vocabulary) or a Hugging
// Face model directory (chat_template.jinja, else tokenizer_config.json's chat_template;
// bos_token / eos_token from tokenizer_config.json).
// FILE.json: a list of {"role", "content", ...} messages, or an object with "messages";
// its other keys ("tools", "enable_thinking", ...) become template variables.
#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/chat_template_files.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

struct TemplateCli {
  std::string model, messages_file;
  bool add_generation_prompt = false;
};

std::string read_text(const fs::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {} {}", what, path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

ordered_json read_json(const fs::path& path, std::string_view what) {
  try {
    return ordered_json::parse(read_text(path, what));
  } catch (const ordered_json::exception& e) {
    fail("{} {} is not valid JSON: {}", what, path.string(), e.what());
  }
}

void run(const TemplateCli& cli) {
  const std::optional<ChatTemplate> found = find_chat_template(cli.model);
  if (!found)
    fail("{} ships no chat template ({})", cli.model,
         fs::is_directory(cli.model) ? "no chat_template.jinja and no chat_template in tokenizer_config.json"
                                     : "no tokenizer.chat_template in its metadata");
  const ChatTemplate& chat = *found;
  ordered_json input = read_json(cli.messages_file, "messages file");
  ordered_json messages, extra = ordered_json::object();
  if (input.is_array()) {
    messages = std::move(input);
  } else if (input.is_object() && input.contains("messages")) {
    messages = input["messages"];
    for (auto& [key, value] : input.items()) {
      if (key != "messages") extra[key] = value;
    }
  } else {
    fail("messages file {}: expected a list of messages or an object with \"messages\"", cli.messages_file);
  }
  fmt::print("{}", chat.render(messages, cli.add_generation_prompt, extra));
}

}  // namespace

void register_template(CLI::App& app) {
  auto cli = std::make_shared<TemplateCli>();
  auto* cmd = app.add_subcommand("template", "Render the model's chat template over a list of messages");
  cmd->add_option("-m,--model", cli->model, "GGUF file, or Hugging Face model directory")->required();
  cmd->add_option("--messages", cli->messages_file, "JSON: [{\"role\", \"content\"}, ...] or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  cmd->add_flag("--add-generation-prompt", cli->add_generation_prompt, "End with the assistant turn's opening");
  cmd->callback([cli] { run(*cli); });
}

}  // namespace kiln::cli
