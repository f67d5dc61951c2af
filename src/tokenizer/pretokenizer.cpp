#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <utility>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace kiln {

namespace {

// The regular expressions, as the model families' tokenizer.json files state them (case-
// insensitive contractions spelled out as [sS] so no Unicode case folding applies).
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM's letter class: Latin, Greek, Cyrillic, ... ranges listed explicitly.
// (Written with \x{...} escapes: several of these code points have canonical
// equivalents that text tools like to substitute.)
constexpr std::string_view kDeepseekLetters =
    R"(\s?[)"
    R"(A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386})"
    R"(\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F})"
    R"(\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA})"
    R"(\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15})"
    R"(\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59})"
    R"(\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE})"
    R"(\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC})"
    R"(\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115})"
    R"(\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B})"
    R"(\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B})"
    R"(\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06})"
    R"(\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
    R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943})"
    R"(]+)";

const std::vector<PreTokenizerFamily>& families() {
  static const std::vector<PreTokenizerFamily> kFamilies = {
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de",
        "jina-v1-en", "jina-v2-code", "roberta-bpe", "gigachat", "a.x-4.0", "mellum",
        "modern-bert", "exaone4"},
       {kGpt2}},
      {{"trillion", "granite-docling"}, {kGpt2}, false, false, false},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       {kLlama3}, true, true},
      {{"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"}, {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "hunyuan"}, {kQwen2}, false, false, false},
      {{"stablelm2", "megrez"}, {kQwen2}},
      {{"deepseek-llm"},
       {R"([\r\n])", kDeepseekLetters, R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)", R"(\s+$)",
        R"([一-龥ࠀ-一가-퟿]+)", R"(\p{N}+)"},
       false, false, false},
      {{"deepseek-coder"},
       {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", R"([一-龥ࠀ-一가-퟿]+)", R"(\p{N})"},
       false, false, false},
      {{"deepseek-v3"},
       {R"(\p{N}{1,3})", R"([一-龥぀-ゟ゠-ヿ]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       false, false, false},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}},
      {{"starcoder", "refact", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2}},
      {{"command-r", "smollm"}, {R"(\p{N})", kGpt2}, false, false, false},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {R"( ?[^(\s|.,!?…。，、।۔،)]+)"}, false, false, false},
      {{"gpt-4o", "llama4"}, {kGpt4o}, false, false, false},
      {{"tekken"}, {kTekken}, true, true, false},
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
  };
  return kFamilies;
}

// PCRE2's JIT needs a stack of its own for deep backtracking (long whitespace runs);
// one per thread, made on first use.
struct JitContext {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* context = nullptr;
  JitContext() {
    stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (stack && context) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~JitContext() {
    if (context) pcre2_match_context_free(context);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

pcre2_match_context* thread_match_context() {
  thread_local JitContext jit;
  return jit.context;
}

}  // namespace

const PreTokenizerFamily& pre_tokenizer_family(std::string_view name) {
  for (const auto& family : families()) {
    for (std::string_view n : family.names) {
      if (n == name) return family;
    }
  }
  std::string known;
  for (std::string_view n : pre_tokenizer_names()) {
    if (!known.empty()) known += ", ";
    known += n;
  }
  fail("tokenizer: unknown pre-tokenizer '{}' (tokenizer.ggml.pre); known: {}", name, known);
}

std::vector<std::string_view> pre_tokenizer_names() {
  std::vector<std::string_view> names;
  for (const auto& family : families()) names.insert(names.end(), family.names.begin(), family.names.end());
  return names;
}

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  ~Compiled() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::RegexSplitter(const std::vector<std::string_view>& patterns) {
  for (std::string_view pattern : patterns) compile(pattern, SplitBehavior::kIsolated, false);
}

RegexSplitter::RegexSplitter(const std::vector<SplitRule>& rules) {
  for (const SplitRule& rule : rules) compile(rule.pattern, rule.behavior, rule.invert);
}

void RegexSplitter::compile(std::string_view pattern, SplitBehavior behavior, bool invert) {
  auto compiled = std::make_unique<Compiled>();
  compiled->behavior = behavior;
  compiled->invert = invert;
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  compiled->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error,
                                 &error_offset, nullptr);
  if (!compiled->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("tokenizer: cannot compile pre-tokenizer regex '{}' at offset {}: {}", pattern,
         error_offset, reinterpret_cast<const char*>(message));
  }
  // Without JIT (unsupported platform) pcre2_match falls back to the interpreter.
  pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE);
  compiled_.push_back(std::move(compiled));
}

RegexSplitter::~RegexSplitter() = default;

namespace {

// A run of a piece: a match of the rule's pattern or the text between two matches.
struct Segment {
  TextSpan span;
  bool delimiter;  // a match (or, inverted, an in-between run)
};

// Appends the pieces HF's SplitDelimiterBehavior makes of one piece's segments.
void apply_behavior(const std::vector<Segment>& segments, SplitBehavior behavior,
                    std::vector<TextSpan>& out) {
  const auto extend_last = [&](TextSpan s) { out.back().length = s.offset + s.length - out.back().offset; };
  const size_t first = out.size();  // pieces before this one are never merged into
  bool previous_delimiter = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Segment& s : segments) out.push_back(s.span);
      return;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.delimiter) out.push_back(s.span);
      }
      return;
    case SplitBehavior::kContiguous:
      for (const Segment& s : segments) {
        if (s.delimiter && previous_delimiter && out.size() > first) extend_last(s.span);
        else out.push_back(s.span);
        previous_delimiter = s.delimiter;
      }
      return;
    case SplitBehavior::kMergedWithPrevious:
      // A delimiter joins the piece before it, unless that piece is itself a delimiter.
      for (const Segment& s : segments) {
        if (s.delimiter && !previous_delimiter && out.size() > first) extend_last(s.span);
        else out.push_back(s.span);
        previous_delimiter = s.delimiter;
      }
      return;
    case SplitBehavior::kMergedWithNext: {
      // Mirror image: walk backwards, a delimiter joins the piece after it.
      std::vector<TextSpan> reversed;
      for (size_t i = segments.size(); i-- > 0;) {
        const Segment& s = segments[i];
        if (s.delimiter && !previous_delimiter && !reversed.empty()) {
          reversed.back().length += reversed.back().offset - s.span.offset;
          reversed.back().offset = s.span.offset;
        } else {
          reversed.push_back(s.span);
        }
        previous_delimiter = s.delimiter;
      }
      out.insert(out.end(), reversed.rbegin(), reversed.rend());
      return;
    }
  }
}

}  // namespace

void RegexSplitter::split(std::string_view text, std::vector<TextSpan>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  KILN_CHECK(text.size() < (size_t{1} << 32), "tokenizer: text of {} bytes is too long", text.size());
  pieces.push_back({0, static_cast<uint32_t>(text.size())});
  std::vector<TextSpan> next;
  std::vector<Segment> segments;
  pcre2_match_context* context = thread_match_context();
  for (const auto& compiled : compiled_) {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(compiled->code, nullptr);
    KILN_CHECK(match != nullptr, "tokenizer: out of memory for regex match data");
    next.clear();
    for (const TextSpan piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.offset);
      segments.clear();
      const auto add = [&](size_t start, size_t end, bool matched) {
        segments.push_back({{piece.offset + uint32_t(start), uint32_t(end - start)}, matched != compiled->invert});
      };
      size_t kept = 0;  // end of the last segment, relative to the piece
      size_t pos = 0;
      while (pos < piece.length) {
        const int rc = pcre2_match(compiled->code, subject, piece.length, pos, 0, match, context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          pcre2_match_data_free(match);
          PCRE2_UCHAR message[256];
          pcre2_get_error_message(rc, message, sizeof(message));
          fail("tokenizer: regex match failed: {}", reinterpret_cast<const char*>(message));
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
        const size_t start = ovector[0], end = ovector[1];
        if (end == start) {  // an empty match cuts nothing; step over one character
          pos = start + unicode::sequence_length(static_cast<uint8_t>(subject[start]));
          continue;
        }
        if (start > kept) add(kept, start, false);
        add(start, end, true);
        kept = pos = end;
      }
      if (kept < piece.length) add(kept, piece.length, false);
      apply_behavior(segments, compiled->behavior, next);
    }
    pcre2_match_data_free(match);
    pieces.swap(next);
  }
}

}  // namespace kiln
