// Hugging Face tokenizer.json (the "fast" tokenizer file), with the special-token settings
// of tokenizer_config.json beside it. The file's parts map onto kiln's tokenizer:
//   model BPE + ByteLevel pre-tokenizer/decoder -> byte-level BPE (bpe.cpp); the Split
//     regexes become split rules, or the built-in family when they are one (qwen2, llama3,
//     gpt-2 ...)
//   model BPE otherwise (SentencePiece-converted: byte_fallback, U+2581 for spaces)
//     -> SentencePiece BPE ranked by the merge list (spm.cpp)
//   model Unigram -> unigram.cpp;  model WordPiece -> wordpiece.cpp
//   normalizer / pre_tokenizer -> VocabSpec::normalizer / split_rules (hf_json_pipeline.cpp)
//   added_tokens -> control (special) or user-defined tokens, with lstrip/rstrip
//   post_processor (TemplateProcessing, Bert/RobertaProcessing) -> add_bos / add_eos
// tokenizer_config.json's bos/eos/pad/unk tokens and add_bos_token / add_eos_token win over
// the post-processor, as transformers' fast Llama tokenizers rebuild it from them.
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/hf_files.h"
#include "tokenizer/hf_json_pipeline.h"
#include "tokenizer/pretokenizer.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using hf_json::Context;

json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("tokenizer: cannot open {}", path.string());
  std::ostringstream s;
  s << in.rdbuf();
  try {
    return json::parse(s.str());
  } catch (const json::exception& e) {
    fail("tokenizer: {} is not valid JSON: {}", path.string(), e.what());
  }
}

// A token setting in tokenizer_config.json: a string, {"content": ...} or null.
std::string token_content(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return {};
}

void place_token(VocabSpec& spec, int64_t id, const std::string& text, TokenType type, const Context& ctx) {
  KILN_CHECK(id >= 0 && id < (int64_t(1) << 24), "tokenizer: {}: token id {} out of range", ctx.file, id);
  if (size_t(id) >= spec.tokens.size()) {
    const size_t old = spec.tokens.size();
    spec.tokens.resize(id + 1);
    spec.types.resize(id + 1, TokenType::kUnused);
    if (!spec.scores.empty()) spec.scores.resize(id + 1, 0.0f);
    for (size_t i = old; i < spec.tokens.size(); ++i) spec.tokens[i] = "[UNUSED" + std::to_string(i) + "]";
  }
  spec.tokens[id] = text;
  spec.types[id] = type;
}

// Whether text is a SentencePiece byte token "<0xNN>".
bool is_byte_token(std::string_view text) {
  const auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); };
  return text.size() == 6 && text.substr(0, 3) == "<0x" && text[5] == '>' && hex(text[3]) && hex(text[4]);
}

void read_vocab_object(const json& vocab, VocabSpec& spec, const Context& ctx) {
  KILN_CHECK(vocab.is_object(), "tokenizer: {}: model.vocab is not an object of token -> id", ctx.file);
  for (const auto& [text, id] : vocab.items()) {
    KILN_CHECK(id.is_number_integer(), "tokenizer: {}: id of '{}' is not an integer", ctx.file, text);
    place_token(spec, id.get<int64_t>(), text, TokenType::kNormal, ctx);
  }
}

void read_merges(const json& merges, VocabSpec& spec, const Context& ctx) {
  KILN_CHECK(merges.is_array(), "tokenizer: {}: model.merges is not a list", ctx.file);
  spec.merges.reserve(merges.size());
  for (const json& merge : merges) {
    if (merge.is_string()) {  // "left right" (older files)
      const std::string m = merge.get<std::string>();
      const size_t space = m.find(' ', 1);
      KILN_CHECK(space != std::string::npos, "tokenizer: {}: merge '{}' has no space", ctx.file, m);
      spec.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
    } else {  // ["left", "right"] (tokenizers >= 0.20)
      KILN_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
                 "tokenizer: {}: merge {} is neither \"a b\" nor [\"a\", \"b\"]", ctx.file, merge.dump());
      spec.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    }
  }
}

// The model section. `byte_level`: a ByteLevel pre-tokenizer or decoder is present.
void read_model(const json& model, bool byte_level, VocabSpec& spec, const Context& ctx) {
  KILN_CHECK(model.is_object(), "tokenizer: {} has no \"model\" object", ctx.file);
  std::string type = model.value("type", "");
  if (type.empty()) {  // very old files name no type
    type = model.contains("merges") ? "BPE" : (model.contains("vocab") && model["vocab"].is_array()) ? "Unigram"
                                                                                                     : "WordPiece";
  }
  const auto unk_text = [&] { return model.contains("unk_token") ? token_content(model["unk_token"]) : std::string(); };
  if (type == "BPE") {
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      KILN_CHECK(!model.contains(key) || model[key].is_null() || model[key] == "",
                 "tokenizer: {}: BPE with a {} is not supported", ctx.file, key);
    }
    read_vocab_object(model.value("vocab", json()), spec, ctx);
    read_merges(model.value("merges", json::array()), spec, ctx);
    spec.kind = byte_level ? TokenizerKind::kBytePairBpe : TokenizerKind::kSentencePiece;
    spec.ignore_merges = model.value("ignore_merges", false);
    spec.byte_fallback = model.value("byte_fallback", false);
    const std::string unk = unk_text();
    if (!unk.empty()) {
      const auto it = model["vocab"].find(unk);
      if (it != model["vocab"].end()) spec.special.unk = it->get<int32_t>();
    }
  } else if (type == "Unigram") {
    const json& vocab = model.value("vocab", json());
    KILN_CHECK(vocab.is_array(), "tokenizer: {}: Unigram model.vocab is not a list of [piece, score]", ctx.file);
    spec.kind = TokenizerKind::kUnigram;
    for (const json& entry : vocab) {
      KILN_CHECK(entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_number(),
                 "tokenizer: {}: Unigram entry {} is not [piece, score]", ctx.file, entry.dump());
      spec.tokens.push_back(entry[0].get<std::string>());
      spec.scores.push_back(entry[1].get<float>());
    }
    spec.types.assign(spec.tokens.size(), TokenType::kNormal);
    spec.byte_fallback = model.value("byte_fallback", false);
    if (model.contains("unk_id") && model["unk_id"].is_number_integer()) spec.special.unk = model["unk_id"].get<int32_t>();
  } else if (type == "WordPiece") {
    read_vocab_object(model.value("vocab", json()), spec, ctx);
    spec.kind = TokenizerKind::kWordPiece;
    const std::string unk = unk_text();
    if (!unk.empty()) {
      const auto it = model["vocab"].find(unk);
      if (it != model["vocab"].end()) spec.special.unk = it->get<int32_t>();
    }
  } else {
    fail("tokenizer: {}: model type '{}' is not supported (BPE, Unigram, WordPiece are)", ctx.file, type);
  }
  if (spec.byte_fallback) {
    for (size_t id = 0; id < spec.tokens.size(); ++id) {
      if (is_byte_token(spec.tokens[id])) spec.types[id] = TokenType::kByte;
    }
  }
}

// kiln's WordPiece (as llama.cpp's GGUF) spells a word start "▁word" and a continuation
// bare; HF spells them "word" and "##word". Bracketed and added tokens keep their text.
void respell_wordpiece(VocabSpec& spec, const std::string& prefix) {
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    std::string& t = spec.tokens[id];
    if (spec.types[id] != TokenType::kNormal) continue;
    if (!prefix.empty() && t.size() > prefix.size() && t.compare(0, prefix.size(), prefix) == 0) {
      t.erase(0, prefix.size());
    } else if (!(t.size() >= 2 && t.front() == '[' && t.back() == ']')) {
      t.insert(0, "\xE2\x96\x81");
    }
  }
}

// The id of a token text, or kNoToken.
int32_t find_id(const VocabSpec& spec, const std::string& text) {
  if (text.empty()) return kNoToken;
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.tokens[i] == text) return int32_t(i);
  }
  return kNoToken;
}

}  // namespace

VocabSpec read_tokenizer_json(const fs::path& file) {
  const Context ctx{file.string()};
  const json root = read_json_file(file);
  KILN_CHECK(root.is_object(), "tokenizer: {} is not a JSON object", ctx.file);
  const fs::path config_path = file.parent_path() / "tokenizer_config.json";
  const json config = fs::exists(config_path) ? read_json_file(config_path) : json::object();

  VocabSpec spec;
  spec.hf_pipeline = true;
  spec.model_name = config.value("name_or_path", "");
  const json null;
  const json& model = root.contains("model") ? root["model"] : null;
  const json& normalizer = root.contains("normalizer") ? root["normalizer"] : null;
  const json& pre_tokenizer = root.contains("pre_tokenizer") ? root["pre_tokenizer"] : null;
  const json& decoder = root.contains("decoder") ? root["decoder"] : null;
  const std::string model_type = model.is_object() ? model.value("type", "") : "";

  const hf_json::DecoderFacts decoding = hf_json::read_decoder(decoder, ctx);
  if (model_type == "WordPiece" || (normalizer.is_object() && normalizer.value("type", "") == "BertNormalizer")) {
    // BERT: kiln's WordPiece does BertNormalizer + BertPreTokenizer itself.
    if (normalizer.is_object()) {
      KILN_CHECK(normalizer.value("type", "") == "BertNormalizer",
                 "tokenizer: {}: WordPiece with normalizer '{}' is not supported (BertNormalizer is)", ctx.file,
                 normalizer.value("type", ""));
      spec.lowercase = normalizer.value("lowercase", true);
      const json& strip = normalizer.contains("strip_accents") ? normalizer["strip_accents"] : null;
      spec.strip_accents = strip.is_boolean() ? strip.get<bool>() : spec.lowercase;
    }
    KILN_CHECK(pre_tokenizer.is_null() || pre_tokenizer.value("type", "") == "BertPreTokenizer",
               "tokenizer: {}: WordPiece with pre_tokenizer '{}' is not supported (BertPreTokenizer is)", ctx.file,
               pre_tokenizer.is_object() ? pre_tokenizer.value("type", "") : "");
    read_model(model, false, spec, ctx);
    KILN_CHECK(spec.kind == TokenizerKind::kWordPiece, "tokenizer: {}: BertNormalizer with a {} model is not supported",
               ctx.file, model_type);
    spec.hf_pipeline = false;  // the WordPiece model normalizes by itself
    spec.clean_spaces = decoding.wordpiece_cleanup;
  } else {
    hf_json::read_normalizer(normalizer, spec, ctx);
    const bool byte_level = hf_json::read_pre_tokenizer(pre_tokenizer, spec, ctx) || decoding.byte_level;
    read_model(model, byte_level, spec, ctx);
    if (spec.kind == TokenizerKind::kBytePairBpe) {
      KILN_CHECK(decoding.byte_level || decoder.is_null(),
                 "tokenizer: {}: a byte-level BPE model needs the ByteLevel decoder", ctx.file);
      spec.pre = "tokenizer.json";
      // Without any regex, a run of text is one word.
      if (spec.split_rules.empty()) {
        SplitRule whole;
        whole.pattern = R"([\s\S]+)";
        spec.split_rules.push_back(whole);
      }
      // When the rules are exactly a built-in family's regexes, use that family.
      for (std::string_view name : pre_tokenizer_names()) {
        const PreTokenizerFamily& family = pre_tokenizer_family(name);
        bool same = family.patterns.size() == spec.split_rules.size();
        for (size_t i = 0; same && i < family.patterns.size(); ++i) {
          const SplitRule& r = spec.split_rules[i];
          same = r.pattern == family.patterns[i] && r.behavior == SplitBehavior::kIsolated && !r.invert;
        }
        if (same) {
          spec.pre = std::string(name);
          spec.split_rules.clear();
          break;
        }
      }
    } else {
      KILN_CHECK(!decoding.byte_level, "tokenizer: {}: ByteLevel decoder with a {} model is not supported", ctx.file,
                 model_type);
      spec.add_space_prefix = decoding.strips_first_space;  // decode drops the first space
    }
  }

  // Added tokens: special ones are control tokens, the others user-defined.
  const json& added = root.contains("added_tokens") ? root["added_tokens"] : null;
  if (added.is_array()) {
    for (const json& token : added) {
      KILN_CHECK(token.is_object() && token.contains("id") && token.contains("content"),
                 "tokenizer: {}: added token {} needs an id and a content", ctx.file, token.dump());
      const int64_t id = token["id"].get<int64_t>();
      const std::string content = token["content"].get<std::string>();
      const TokenType type = token.value("special", false) ? TokenType::kControl : TokenType::kUserDefined;
      place_token(spec, id, content, type, ctx);
      if (token.value("lstrip", false)) spec.lstrip_ids.push_back(int32_t(id));
      if (token.value("rstrip", false)) spec.rstrip_ids.push_back(int32_t(id));
    }
  }
  if (spec.kind == TokenizerKind::kWordPiece) {
    const std::string prefix = model.value("continuing_subword_prefix", "##");
    respell_wordpiece(spec, prefix);
  }
  if (spec.kind == TokenizerKind::kUnigram || spec.kind == TokenizerKind::kSentencePiece) {
    if (spec.special.unk != kNoToken && size_t(spec.special.unk) < spec.types.size()) {
      spec.types[spec.special.unk] = TokenType::kUnknown;
    }
  }

  // Special ids: the post-processor's wrapping, then tokenizer_config.json.
  const hf_json::Wrapping wrap =
      hf_json::read_post_processor(root.contains("post_processor") ? root["post_processor"] : null, ctx);
  SpecialIds& s = spec.special;
  const auto config_token = [&](const char* key) {
    return config.contains(key) ? find_id(spec, token_content(config[key])) : kNoToken;
  };
  if (spec.kind == TokenizerKind::kWordPiece) {
    s.cls = find_id(spec, wrap.before.empty() ? "[CLS]" : wrap.before);
    s.sep = find_id(spec, wrap.after.empty() ? "[SEP]" : wrap.after);
    s.bos = s.cls;
    s.pad = find_id(spec, "[PAD]");
    s.mask = find_id(spec, "[MASK]");
    spec.add_bos = spec.add_sep = true;
  } else {
    s.bos = find_id(spec, wrap.before);
    s.eos = find_id(spec, wrap.after);
    spec.add_bos = s.bos != kNoToken;
    spec.add_eos = s.eos != kNoToken;
  }
  for (auto [key, id] : {std::pair{"bos_token", &s.bos}, std::pair{"eos_token", &s.eos},
                         std::pair{"pad_token", &s.pad}, std::pair{"unk_token", &s.unk}}) {
    const int32_t from_config = config_token(key);
    if (from_config != kNoToken) *id = from_config;
  }
  if (spec.kind != TokenizerKind::kWordPiece) {
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
      spec.add_bos = config["add_bos_token"].get<bool>();
    }
    if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean()) {
      spec.add_eos = config["add_eos_token"].get<bool>();
    }
  }
  spec.add_bos = spec.add_bos && s.bos != kNoToken;
  spec.add_eos = spec.add_eos && s.eos != kNoToken;
  if (config.contains("clean_up_tokenization_spaces") && config["clean_up_tokenization_spaces"].is_boolean()) {
    spec.clean_spaces = config["clean_up_tokenization_spaces"].get<bool>();
  }
  return spec;
}

}  // namespace kiln
