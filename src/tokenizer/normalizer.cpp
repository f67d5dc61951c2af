#include "tokenizer/normalizer.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace kiln {

namespace {

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t at; (at = text.find(from, pos)) != std::string_view::npos; pos = at + from.size()) {
    out.append(text, pos, at - pos).append(to);
  }
  out.append(text, pos, std::string_view::npos);
  return out;
}

// Applies a per-code-point mapping to UTF-8 text.
template <typename Map>
std::string map_code_points(std::string_view text, Map map) {
  std::vector<uint32_t> mapped;
  for (size_t pos = 0; pos < text.size();) map(unicode::decode(text, pos), mapped);
  std::string out;
  out.reserve(text.size());
  for (uint32_t cp : mapped) unicode::append_utf8(out, cp);
  return out;
}

}  // namespace

struct TextNormalizer::Step {
  NormalizeStep spec;
  pcre2_code* regex = nullptr;  // kReplaceRegex
  ~Step() {
    if (regex) pcre2_code_free(regex);
  }

  std::string replace_regex(std::string_view text) const {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex, nullptr);
    KILN_CHECK(match != nullptr, "tokenizer: out of memory for regex match data");
    std::string out;
    size_t kept = 0, pos = 0;
    while (pos < text.size()) {
      const int rc = pcre2_match(regex, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0, match,
                                 nullptr);
      if (rc < 0) break;  // no match (or a matching error: leave the rest as it is)
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      const size_t start = ovector[0], end = ovector[1];
      if (end == start) {
        pos = start + unicode::sequence_length(uint8_t(text[start]));
        continue;
      }
      out.append(text, kept, start - kept).append(spec.content);
      kept = pos = end;
    }
    pcre2_match_data_free(match);
    out.append(text, kept, std::string_view::npos);
    return out;
  }

  std::string apply(std::string_view text, bool at_text_start) const {
    switch (spec.kind) {
      case NormalizeStep::Kind::kPrepend:
        if (text.empty() || (spec.only_at_text_start && !at_text_start)) return std::string(text);
        if (spec.unless_already_there && text.substr(0, spec.pattern.size()) == spec.pattern) {
          return std::string(text);
        }
        return spec.pattern + std::string(text);
      case NormalizeStep::Kind::kReplace:
        return replace_all(text, spec.pattern, spec.content);
      case NormalizeStep::Kind::kReplaceRegex:
        return replace_regex(text);
      case NormalizeStep::Kind::kLowercase:
        return map_code_points(text, [](uint32_t cp, std::vector<uint32_t>& out) { unicode::append_lowercase(out, cp); });
      case NormalizeStep::Kind::kNfd:
        return map_code_points(text, [](uint32_t cp, std::vector<uint32_t>& out) { unicode::append_nfd(out, cp); });
      case NormalizeStep::Kind::kStripAccents:
        return map_code_points(text, [](uint32_t cp, std::vector<uint32_t>& out) {
          if (!unicode::is_nonspacing_mark(cp)) out.push_back(cp);
        });
      case NormalizeStep::Kind::kStrip: {
        // Whitespace as Rust's char::is_whitespace (what HF's Strip uses).
        const std::vector<uint32_t> cps = unicode::decode_all(text);
        size_t begin = 0, end = cps.size();
        if (spec.strip_left) {
          while (begin < end && unicode::is_whitespace(cps[begin])) ++begin;
        }
        if (spec.strip_right) {
          while (end > begin && unicode::is_whitespace(cps[end - 1])) --end;
        }
        std::string out;
        for (size_t i = begin; i < end; ++i) unicode::append_utf8(out, cps[i]);
        return out;
      }
    }
    return std::string(text);
  }
};

TextNormalizer::TextNormalizer(const std::vector<NormalizeStep>& steps) {
  for (const NormalizeStep& spec : steps) {
    auto step = std::make_unique<Step>();
    step->spec = spec;
    if (spec.kind == NormalizeStep::Kind::kReplaceRegex) {
      int error = 0;
      PCRE2_SIZE offset = 0;
      step->regex = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(spec.pattern.data()), spec.pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
      if (!step->regex) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(error, message, sizeof(message));
        fail("tokenizer: cannot compile normalizer regex '{}' at offset {}: {}", spec.pattern, offset,
             reinterpret_cast<const char*>(message));
      }
    }
    steps_.push_back(std::move(step));
  }
}

TextNormalizer::~TextNormalizer() = default;

std::string TextNormalizer::normalize(std::string_view text, bool at_text_start) const {
  std::string current(text);
  for (const auto& step : steps_) current = step->apply(current, at_text_start);
  return current;
}

}  // namespace kiln
