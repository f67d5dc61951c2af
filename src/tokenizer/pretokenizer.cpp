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
constexpr std::string_view kDeepseekLetters =
    R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)";

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
  ~Compiled() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::RegexSplitter(const std::vector<std::string_view>& patterns) {
  for (std::string_view pattern : patterns) {
    auto compiled = std::make_unique<Compiled>();
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
}

RegexSplitter::~RegexSplitter() = default;

void RegexSplitter::split(std::string_view text, std::vector<TextSpan>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  KILN_CHECK(text.size() < (size_t{1} << 32), "tokenizer: text of {} bytes is too long", text.size());
  pieces.push_back({0, static_cast<uint32_t>(text.size())});
  std::vector<TextSpan> next;
  pcre2_match_context* context = thread_match_context();
  for (const auto& compiled : compiled_) {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(compiled->code, nullptr);
    KILN_CHECK(match != nullptr, "tokenizer: out of memory for regex match data");
    next.clear();
    for (const TextSpan piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.offset);
      size_t kept = 0;  // end of the last emitted span, relative to the piece
      size_t pos = 0;
      while (pos < piece.length) {
        const int rc = pcre2_match(compiled->code, subject, piece.length, pos, 0, match, context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
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
        if (start > kept) next.push_back({piece.offset + uint32_t(kept), uint32_t(start - kept)});
        next.push_back({piece.offset + uint32_t(start), uint32_t(end - start)});
        kept = pos = end;
      }
      if (kept < piece.length) next.push_back({piece.offset + uint32_t(kept), uint32_t(piece.length - kept)});
    }
    pcre2_match_data_free(match);
    pieces.swap(next);
  }
}

}  // namespace kiln
