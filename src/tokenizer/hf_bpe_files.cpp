// vocab.json + merges.txt (GPT-2 style byte-level BPE), with the added tokens and the
// special-token settings of tokenizer_config.json / added_tokens.json when present.
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/hf_files.h"
#include "tokenizer/pretokenizer.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("tokenizer: cannot open {}", path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json read_json(const fs::path& path) {
  try {
    return json::parse(read_text(path));
  } catch (const json::exception& e) {
    fail("tokenizer: {} is not valid JSON: {}", path.string(), e.what());
  }
}

// A token setting in tokenizer_config.json: a string, {"content": ...} or null.
std::string token_content(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content")) return value.at("content").get<std::string>();
  return {};
}

void place_token(VocabSpec& spec, int64_t id, const std::string& text, TokenType type, const fs::path& from) {
  KILN_CHECK(id >= 0 && id < (int64_t(1) << 24), "tokenizer: {}: token id {} out of range", from.string(), id);
  if (size_t(id) >= spec.tokens.size()) {
    const size_t old = spec.tokens.size();
    spec.tokens.resize(id + 1);
    spec.types.resize(id + 1, TokenType::kUnused);
    for (size_t i = old; i < spec.tokens.size(); ++i) spec.tokens[i] = "[UNUSED" + std::to_string(i) + "]";
  }
  spec.tokens[id] = text;
  spec.types[id] = type;
}

}  // namespace

VocabSpec read_bpe_vocab_files(const fs::path& vocab_json, const fs::path& merges_txt, std::string pre) {
  VocabSpec spec;
  spec.kind = TokenizerKind::kBytePairBpe;
  const json vocab = read_json(vocab_json);
  KILN_CHECK(vocab.is_object(), "tokenizer: {} is not a JSON object of token -> id", vocab_json.string());
  for (const auto& [text, id] : vocab.items()) {
    KILN_CHECK(id.is_number_integer(), "tokenizer: {}: id of '{}' is not an integer", vocab_json.string(), text);
    place_token(spec, id.get<int64_t>(), text, TokenType::kNormal, vocab_json);
  }

  std::istringstream merges(read_text(merges_txt));
  size_t line_number = 0;
  for (std::string line; std::getline(merges, line);) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ', 1);
    KILN_CHECK(space != std::string::npos, "tokenizer: {}:{}: a merge needs two parts", merges_txt.string(),
               line_number);
    spec.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }

  const fs::path dir = vocab_json.parent_path();
  json config = json::object();
  const bool has_config = fs::exists(dir / "tokenizer_config.json");
  if (has_config) config = read_json(dir / "tokenizer_config.json");
  // Added tokens: special ones are control tokens, the others user-defined.
  if (fs::exists(dir / "added_tokens.json")) {
    const json added = read_json(dir / "added_tokens.json");
    for (const auto& [text, id] : added.items()) {
      place_token(spec, id.get<int64_t>(), text, TokenType::kControl, dir / "added_tokens.json");
    }
  }
  if (config.contains("added_tokens_decoder")) {
    for (const auto& [id, token] : config.at("added_tokens_decoder").items()) {
      const bool special = token.value("special", true);
      place_token(spec, std::stoll(id), token_content(token),
                  special ? TokenType::kControl : TokenType::kUserDefined, dir / "tokenizer_config.json");
    }
  }

  if (pre.empty()) {
    const std::string cls = config.value("tokenizer_class", "");
    pre = cls.find("Qwen2") != std::string::npos ? "qwen2" : "gpt-2";
  }
  spec.pre = pre;
  const PreTokenizerFamily& family = pre_tokenizer_family(spec.pre);
  spec.ignore_merges = family.ignore_merges;
  spec.add_bos = family.add_bos;
  spec.clean_spaces = family.clean_spaces;
  if (config.contains("clean_up_tokenization_spaces") && config["clean_up_tokenization_spaces"].is_boolean()) {
    spec.clean_spaces = config["clean_up_tokenization_spaces"].get<bool>();
  }

  const auto id_of = [&](const std::string& text) {
    for (size_t i = 0; i < spec.tokens.size(); ++i) {
      if (spec.tokens[i] == text) return int32_t(i);
    }
    return kNoToken;
  };
  SpecialIds& s = spec.special;
  if (has_config) {
    if (config.contains("bos_token")) s.bos = id_of(token_content(config["bos_token"]));
    if (config.contains("eos_token")) s.eos = id_of(token_content(config["eos_token"]));
    if (config.contains("pad_token")) s.pad = id_of(token_content(config["pad_token"]));
    if (config.contains("unk_token")) s.unk = id_of(token_content(config["unk_token"]));
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
      spec.add_bos = config["add_bos_token"].get<bool>();
    }
    spec.add_bos = spec.add_bos && s.bos != kNoToken;
  } else {
    // GPT-2 style: <|endoftext|> begins and ends text.
    s.bos = s.eos = id_of("<|endoftext|>");
  }
  return spec;
}

}  // namespace kiln
