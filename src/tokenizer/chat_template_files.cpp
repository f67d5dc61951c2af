#include "tokenizer/chat_template_files.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

std::string read_text(const fs::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {} {}", what, path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string token_text_or_empty(const Tokenizer& t, int32_t id) { return id == kNoToken ? std::string() : t.token_text(id); }

std::optional<ChatTemplate> from_gguf(const std::string& path, const Tokenizer* tokenizer) {
  const auto file = gguf::File::open(path);
  const std::string_view source = file->get_string("tokenizer.chat_template", "");
  if (source.empty()) return std::nullopt;
  std::optional<Tokenizer> own;
  if (!tokenizer && file->has("tokenizer.ggml.model")) {
    own.emplace(Tokenizer::from_gguf(*file));
    tokenizer = &*own;
  }
  std::string bos, eos;
  if (tokenizer) {
    bos = token_text_or_empty(*tokenizer, tokenizer->special().bos);
    eos = token_text_or_empty(*tokenizer, tokenizer->special().eos);
  }
  return ChatTemplate(std::string(source), bos, eos);
}

std::optional<ChatTemplate> from_directory(const fs::path& dir) {
  const fs::path config_path = dir / "tokenizer_config.json";
  ordered_json config = ordered_json::object();
  if (fs::exists(config_path)) {
    try {
      config = ordered_json::parse(read_text(config_path, "tokenizer config"));
    } catch (const ordered_json::exception& e) {
      fail("tokenizer config {} is not valid JSON: {}", config_path.string(), e.what());
    }
  }
  // Newer models ship the template as a file of its own; it wins over the config's.
  if (fs::exists(dir / "chat_template.jinja")) config["chat_template"] = read_text(dir / "chat_template.jinja", "template");
  if (!config.contains("chat_template")) return std::nullopt;
  return ChatTemplate::from_tokenizer_config(config);
}

}  // namespace

std::optional<ChatTemplate> find_chat_template(const std::string& model_path, const Tokenizer* tokenizer) {
  if (fs::is_directory(model_path)) return from_directory(model_path);
  return from_gguf(model_path, tokenizer);
}

}  // namespace kiln
