// Tokenizer::from_gguf: the tokenizer.ggml.* metadata of a GGUF file, with llama.cpp's
// defaults where a key is absent (they are what the converters rely on).
#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

namespace {

std::vector<std::string> read_strings(const gguf::File& file, std::string_view key) {
  const auto& items = file.get(key).as_array(key);
  std::vector<std::string> out;
  out.reserve(items.size());
  for (const auto& item : items) out.emplace_back(item.as_string(key));
  return out;
}

// A special id, or `fallback` when absent or out of range (llama.cpp keeps its default
// then; converters write 0xFFFFFFFF for "none").
int32_t read_id(const gguf::File& file, std::string_view key, int32_t fallback, size_t vocab) {
  const gguf::Value* v = file.find(key);
  if (!v) return fallback;
  const int64_t id = v->as_int(key);
  return (id >= 0 && size_t(id) < vocab) ? int32_t(id) : fallback;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const std::string& path) {
  const auto file = gguf::File::open(path);
  return from_gguf(*file);
}

Tokenizer Tokenizer::from_gguf(const gguf::File& file) {
  const std::string_view model = file.get_string("tokenizer.ggml.model", "");
  KILN_CHECK(!model.empty(), "tokenizer: {} has no tokenizer.ggml.model", file.paths().front());
  VocabSpec spec;
  spec.model_name = std::string(file.get_string("general.name", ""));
  spec.tokens = read_strings(file, "tokenizer.ggml.tokens");
  const size_t n = spec.tokens.size();

  if (const gguf::Value* scores = file.find("tokenizer.ggml.scores")) {
    const auto& items = scores->as_array("tokenizer.ggml.scores");
    KILN_CHECK(items.size() == n, "tokenizer: {} scores for {} tokens", items.size(), n);
    spec.scores.reserve(n);
    for (const auto& s : items) spec.scores.push_back(float(s.is_float() ? s.as_float() : double(s.as_int())));
  }
  if (const gguf::Value* types = file.find("tokenizer.ggml.token_type")) {
    const auto& items = types->as_array("tokenizer.ggml.token_type");
    KILN_CHECK(items.size() == n, "tokenizer: {} token types for {} tokens", items.size(), n);
    spec.types.reserve(n);
    for (const auto& t : items) {
      const int64_t v = t.as_int("tokenizer.ggml.token_type");
      spec.types.push_back(v >= 0 && v <= 6 ? TokenType(v) : TokenType::kUndefined);
    }
  }

  SpecialIds& s = spec.special;
  if (model == "llama") {
    spec.kind = TokenizerKind::kSentencePiece;
    s.bos = 1, s.eos = 2, s.unk = 0;
    spec.add_space_prefix = true;
    spec.add_bos = true;
  } else if (model == "gpt2") {
    spec.kind = TokenizerKind::kBytePairBpe;
    spec.pre = std::string(file.get_string("tokenizer.ggml.pre", "default"));
    const PreTokenizerFamily& family = pre_tokenizer_family(spec.pre);
    spec.ignore_merges = family.ignore_merges;
    spec.add_bos = family.add_bos;
    spec.clean_spaces = family.clean_spaces;
    s.bos = 11, s.eos = 11;  // llama.cpp's historical defaults
    for (std::string& merge : read_strings(file, "tokenizer.ggml.merges")) {
      // "left right": split at the first space after the first byte (a part may be " ").
      const size_t space = merge.find(' ', 1);
      KILN_CHECK(space != std::string::npos, "tokenizer: merge '{}' has no space", merge);
      spec.merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
    }
  } else if (model == "bert") {
    spec.kind = TokenizerKind::kWordPiece;
    s.bos = 101, s.unk = 100, s.sep = 102, s.pad = 0, s.mask = 103, s.cls = 101;
    spec.add_bos = true;
    spec.add_sep = true;
    spec.clean_spaces = true;
  } else {
    fail("tokenizer: {}: tokenizer.ggml.model '{}' is not supported (llama, gpt2, bert are)",
         file.paths().front(), model);
  }
  for (int32_t* id : {&s.bos, &s.eos, &s.unk, &s.sep, &s.pad, &s.mask, &s.cls}) {
    if (*id >= 0 && size_t(*id) >= n) *id = kNoToken;
  }

  s.bos = read_id(file, "tokenizer.ggml.bos_token_id", s.bos, n);
  s.eos = read_id(file, "tokenizer.ggml.eos_token_id", s.eos, n);
  s.eot = read_id(file, "tokenizer.ggml.eot_token_id", s.eot, n);
  s.eom = read_id(file, "tokenizer.ggml.eom_token_id", s.eom, n);
  s.unk = read_id(file, "tokenizer.ggml.unknown_token_id", s.unk, n);
  s.sep = read_id(file, "tokenizer.ggml.seperator_token_id", s.sep, n);  // sic: GGUF's spelling
  s.pad = read_id(file, "tokenizer.ggml.padding_token_id", s.pad, n);
  s.cls = read_id(file, "tokenizer.ggml.cls_token_id", s.cls, n);
  s.mask = read_id(file, "tokenizer.ggml.mask_token_id", s.mask, n);
  spec.add_bos = file.get_bool("tokenizer.ggml.add_bos_token", spec.add_bos);
  spec.add_eos = file.get_bool("tokenizer.ggml.add_eos_token", spec.add_eos);
  spec.add_sep = file.get_bool("tokenizer.ggml.add_sep_token", spec.add_sep);
  spec.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix", spec.add_space_prefix);
  spec.lowercase = file.get_bool("tokenizer.ggml.normalizer.lowercase", true);
  spec.strip_accents = file.get_bool("tokenizer.ggml.normalizer.strip_accents", spec.lowercase);
  // Like llama.cpp: a BOS the model asks for but does not have is not added.
  if (spec.add_bos && s.bos == kNoToken) spec.add_bos = false;
  if (spec.add_eos && s.eos == kNoToken) spec.add_eos = false;
  return Tokenizer(std::move(spec));
}

}  // namespace kiln
