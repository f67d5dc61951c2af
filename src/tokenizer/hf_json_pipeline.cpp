#include "tokenizer/hf_json_pipeline.h"

#include "core/error.h"

namespace kiln::hf_json {

namespace {

using nlohmann::json;

std::string type_of(const json& node, const Context& ctx, std::string_view section) {
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
    fail("tokenizer: {}: a {} entry has no \"type\"", ctx.file, section);
  }
  return node["type"].get<std::string>();
}

// A Split / Replace pattern: {"String": "..."} or {"Regex": "..."}; returns it as a regex.
std::string pattern_regex(const json& pattern, const Context& ctx, bool* is_regex = nullptr) {
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
    if (is_regex) *is_regex = false;
    return regex_quote(pattern["String"].get<std::string>());
  }
  if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    if (is_regex) *is_regex = true;
    std::string regex = pattern["Regex"].get<std::string>();
    // The contractions group of the GPT-4-style patterns, spelled out without case
    // folding as llama.cpp does (PCRE2's caseless mode would also fold e.g. U+017F to s).
    static constexpr std::string_view kCaseless = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
    static constexpr std::string_view kSpelled = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
    for (size_t at; (at = regex.find(kCaseless)) != std::string::npos;) regex.replace(at, kCaseless.size(), kSpelled);
    return regex;
  }
  fail("tokenizer: {}: a pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", ctx.file, pattern.dump());
}

SplitBehavior behavior_of(const json& node, const Context& ctx) {
  const std::string b = node.value("behavior", "Isolated");
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  fail("tokenizer: {}: unknown split behavior '{}'", ctx.file, b);
}

// Metaspace's prepend_scheme, or the older add_prefix_space flag.
std::string prepend_scheme(const json& node) {
  if (node.contains("prepend_scheme") && node["prepend_scheme"].is_string()) {
    return node["prepend_scheme"].get<std::string>();
  }
  return node.value("add_prefix_space", true) ? "always" : "never";
}

NormalizeStep make_step(NormalizeStep::Kind kind, std::string pattern = {}, std::string content = {}) {
  NormalizeStep step{};
  step.kind = kind;
  step.pattern = std::move(pattern);
  step.content = std::move(content);
  return step;
}

SplitRule make_rule(std::string pattern, SplitBehavior behavior = SplitBehavior::kIsolated, bool invert = false) {
  SplitRule rule;
  rule.pattern = std::move(pattern);
  rule.behavior = behavior;
  rule.invert = invert;
  return rule;
}

// The GPT-2 regex ByteLevel(use_regex=true) splits with.
constexpr std::string_view kByteLevelRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

std::string regex_quote(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    const unsigned char u = static_cast<unsigned char>(c);
    const bool alnum = (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z');
    if (u < 0x80 && !alnum) out.push_back('\\');  // backslash + non-alphanumeric is literal
    out.push_back(c);
  }
  return out;
}

void read_normalizer(const json& node, VocabSpec& spec, const Context& ctx) {
  if (node.is_null()) return;
  const std::string type = type_of(node, ctx, "normalizer");
  using Kind = NormalizeStep::Kind;
  if (type == "Sequence") {
    for (const json& child : node.value("normalizers", json::array())) read_normalizer(child, spec, ctx);
  } else if (type == "Prepend") {
    spec.normalizer.push_back(make_step(Kind::kPrepend, node.value("prepend", "")));
  } else if (type == "Replace") {
    bool is_regex = false;
    std::string regex = pattern_regex(node.value("pattern", json()), ctx, &is_regex);
    NormalizeStep step = make_step(is_regex ? Kind::kReplaceRegex : Kind::kReplace, std::move(regex), node.value("content", ""));
    if (!is_regex) step.pattern = node["pattern"]["String"].get<std::string>();
    spec.normalizer.push_back(std::move(step));
  } else if (type == "Lowercase") {
    spec.normalizer.push_back(make_step(Kind::kLowercase));
  } else if (type == "NFD") {
    spec.normalizer.push_back(make_step(Kind::kNfd));
  } else if (type == "StripAccents") {
    spec.normalizer.push_back(make_step(Kind::kStripAccents));
  } else if (type == "Strip") {
    NormalizeStep step = make_step(Kind::kStrip);
    step.strip_left = node.value("strip_left", true);
    step.strip_right = node.value("strip_right", true);
    spec.normalizer.push_back(step);
  } else if (type == "NFC") {
    // Not applied: see the header. Qwen2 and many byte-level BPE models name it.
  } else if (type == "Precompiled" && (!node.contains("precompiled_charsmap") || node["precompiled_charsmap"].is_null() ||
                                       node["precompiled_charsmap"] == "")) {
    // An empty charsmap maps nothing.
  } else {
    fail("tokenizer: {}: normalizer '{}' is not supported (supported: Sequence, Prepend, Replace, Lowercase, "
         "NFD, StripAccents, Strip, NFC (not applied))",
         ctx.file, type);
  }
}

bool read_pre_tokenizer(const json& node, VocabSpec& spec, const Context& ctx) {
  if (node.is_null()) return false;
  const std::string type = type_of(node, ctx, "pre_tokenizer");
  using Kind = NormalizeStep::Kind;
  // Prefixes (Metaspace, ByteLevel) are done as normalizer steps on the whole run, which
  // is what HF does only when no split came before them.
  const auto require_first = [&](std::string_view what) {
    KILN_CHECK(spec.split_rules.empty(), "tokenizer: {}: a {} prefix after a split is not supported", ctx.file, what);
  };
  if (type == "Sequence") {
    bool byte_level = false;
    for (const json& child : node.value("pretokenizers", json::array())) {
      byte_level = read_pre_tokenizer(child, spec, ctx) || byte_level;
    }
    return byte_level;
  }
  if (type == "Split") {
    spec.split_rules.push_back(make_rule(pattern_regex(node.value("pattern", json()), ctx), behavior_of(node, ctx),
                                        node.value("invert", false)));
    return false;
  }
  if (type == "ByteLevel") {
    if (node.value("add_prefix_space", false)) {
      require_first("ByteLevel");
      NormalizeStep prefix = make_step(Kind::kPrepend, " ");
      prefix.unless_already_there = true;
      spec.normalizer.push_back(prefix);
    }
    if (node.value("use_regex", true)) spec.split_rules.push_back(make_rule(std::string(kByteLevelRegex)));
    return true;
  }
  if (type == "Metaspace") {
    const std::string mark = node.value("replacement", "\xE2\x96\x81");
    const std::string scheme = prepend_scheme(node);
    spec.normalizer.push_back(make_step(Kind::kReplace, " ", mark));
    if (scheme != "never") {
      require_first("Metaspace");
      NormalizeStep prefix = make_step(Kind::kPrepend, mark);
      prefix.unless_already_there = true;
      prefix.only_at_text_start = scheme == "first";
      spec.normalizer.push_back(prefix);
    }
    if (node.value("split", true)) spec.split_rules.push_back(make_rule(regex_quote(mark), SplitBehavior::kMergedWithNext));
    return false;
  }
  if (type == "Digits") {
    spec.split_rules.push_back(make_rule(R"(\p{N})", node.value("individual_digits", false)
                                                          ? SplitBehavior::kIsolated
                                                          : SplitBehavior::kContiguous));
    return false;
  }
  if (type == "Whitespace") {
    spec.split_rules.push_back(make_rule(R"(\w+|[^\w\s]+)", SplitBehavior::kRemoved, true));
    return false;
  }
  if (type == "WhitespaceSplit") {
    spec.split_rules.push_back(make_rule(R"(\s+)", SplitBehavior::kRemoved));
    return false;
  }
  if (type == "Punctuation") {
    spec.split_rules.push_back(make_rule(R"([\p{P}!-/:-@\[-`{-~])", behavior_of(node, ctx)));
    return false;
  }
  if (type == "CharDelimiterSplit") {
    spec.split_rules.push_back(make_rule(regex_quote(node.value("delimiter", " ")), SplitBehavior::kRemoved));
    return false;
  }
  fail("tokenizer: {}: pre_tokenizer '{}' is not supported (supported: Sequence, Split, ByteLevel, Metaspace, "
       "Digits, Whitespace, WhitespaceSplit, Punctuation, CharDelimiterSplit; BertPreTokenizer with WordPiece)",
       ctx.file, type);
}

DecoderFacts read_decoder(const json& node, const Context& ctx) {
  DecoderFacts facts;
  if (node.is_null()) return facts;
  const std::string type = type_of(node, ctx, "decoder");
  if (type == "Sequence") {
    for (const json& child : node.value("decoders", json::array())) {
      const DecoderFacts f = read_decoder(child, ctx);
      facts.byte_level |= f.byte_level;
      facts.strips_first_space |= f.strips_first_space;
      facts.wordpiece_cleanup |= f.wordpiece_cleanup;
    }
  } else if (type == "ByteLevel") {
    facts.byte_level = true;
  } else if (type == "Metaspace") {
    facts.strips_first_space = prepend_scheme(node) != "never";
  } else if (type == "Strip") {
    facts.strips_first_space = node.value("content", " ") == " " && node.value("start", 0) > 0;
  } else if (type == "WordPiece") {
    facts.wordpiece_cleanup = node.value("cleanup", true);
  } else if (type == "Replace" || type == "ByteFallback" || type == "Fuse") {
    // kiln's decode does these by itself: U+2581 -> space, <0xNN> -> byte, concatenation.
  } else {
    fail("tokenizer: {}: decoder '{}' is not supported", ctx.file, type);
  }
  return facts;
}

Wrapping read_post_processor(const json& node, const Context& ctx) {
  Wrapping w;
  if (node.is_null()) return w;
  const std::string type = type_of(node, ctx, "post_processor");
  if (type == "Sequence") {
    for (const json& child : node.value("processors", json::array())) {
      const Wrapping c = read_post_processor(child, ctx);
      if (!c.before.empty()) w.before = c.before;
      if (!c.after.empty()) w.after = c.after;
    }
  } else if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    for (const json& item : node.value("single", json::array())) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      KILN_CHECK(item.contains("SpecialToken") && item["SpecialToken"].contains("id"),
                 "tokenizer: {}: TemplateProcessing item {} is neither a Sequence nor a SpecialToken", ctx.file,
                 item.dump());
      std::string& slot = seen_sequence ? w.after : w.before;
      KILN_CHECK(slot.empty(), "tokenizer: {}: TemplateProcessing with two special tokens on one side is not supported",
                 ctx.file);
      slot = item["SpecialToken"]["id"].get<std::string>();
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    // {"cls": ["[CLS]", 101], "sep": ["[SEP]", 102]}
    if (node.contains("cls") && node["cls"].is_array() && !node["cls"].empty()) w.before = node["cls"][0].get<std::string>();
    if (node.contains("sep") && node["sep"].is_array() && !node["sep"].empty()) w.after = node["sep"][0].get<std::string>();
  } else if (type != "ByteLevel") {  // ByteLevel only adjusts offsets
    fail("tokenizer: {}: post_processor '{}' is not supported", ctx.file, type);
  }
  return w;
}

}  // namespace kiln::hf_json
