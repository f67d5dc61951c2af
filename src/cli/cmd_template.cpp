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
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

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

ChatTemplate template_from_gguf(const std::string& path) {
  const auto file = gguf::File::open(path);
  const std::string_view source = file->get_string("tokenizer.chat_template", "");
  if (source.empty()) fail("{} has no tokenizer.chat_template", path);
  std::string bos, eos;
  if (file->has("tokenizer.ggml.model")) {
    const Tokenizer tokenizer = Tokenizer::from_gguf(*file);
    if (tokenizer.special().bos != kNoToken) bos = tokenizer.token_text(tokenizer.special().bos);
    if (tokenizer.special().eos != kNoToken) eos = tokenizer.token_text(tokenizer.special().eos);
  }
  return ChatTemplate(std::string(source), bos, eos);
}

ChatTemplate template_from_directory(const fs::path& dir) {
  const fs::path config_path = dir / "tokenizer_config.json";
  ordered_json config = fs::exists(config_path) ? read_json(config_path, "tokenizer config") : ordered_json::object();
  // Newer models ship the template as a file of its own; it wins over the config's.
  if (fs::exists(dir / "chat_template.jinja")) config["chat_template"] = read_text(dir / "chat_template.jinja", "template");
  if (!config.contains("chat_template")) {
    fail("{} has no chat_template.jinja and no chat_template in tokenizer_config.json", dir.string());
  }
  return ChatTemplate::from_tokenizer_config(config);
}

void run(const TemplateCli& cli) {
  const ChatTemplate chat = fs::is_directory(cli.model) ? template_from_directory(cli.model) : template_from_gguf(cli.model);
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
