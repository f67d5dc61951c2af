#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace kiln::jinja {

namespace {

bool is_space_char(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// The lexer proper: one pass over the normalized source.
class TemplateLexer {
 public:
  TemplateLexer(std::string source, const LexOptions& options) : src_(std::move(source)), opt_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool strip_leading = false;  // the previous tag ended with '-'
    bool line_starting = true;   // the upcoming text begins a line (for lstrip_blocks)
    while (pos <= src_.size()) {
      size_t open = find_tag_open(pos);
      std::string text = src_.substr(pos, (open == std::string::npos ? src_.size() : open) - pos);
      if (strip_leading) {
        size_t keep = 0;
        while (keep < text.size() && is_space_char(text[keep])) ++keep;
        text.erase(0, keep);
      }
      if (open == std::string::npos) {
        emit_text(text, pos);
        break;
      }
      char kind = src_[open + 1];  // '{', '%' or '#'
      char modifier = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (modifier == '-') {
        while (!text.empty() && is_space_char(text.back())) text.pop_back();
      } else if (opt_.lstrip_blocks && kind != '{' && modifier != '+') {
        size_t line_begin = text.rfind('\n');
        line_begin = line_begin == std::string::npos ? 0 : line_begin + 1;
        bool only_blanks = line_begin < text.size() &&
                           std::all_of(text.begin() + line_begin, text.end(),
                                       [](char c) { return is_space_char(c) && c != '\n'; });
        if ((line_begin > 0 || line_starting) && only_blanks) text.erase(line_begin);
      }
      emit_text(text, pos);

      size_t body = open + 2 + (modifier == '-' || modifier == '+' ? 1 : 0);
      size_t after = 0;
      bool right_strip = false;
      bool right_plus = false;
      if (kind == '#') {
        size_t close = src_.find("#}", body);
        if (close == std::string::npos) error_at(open, "unterminated comment");
        right_strip = close > body && src_[close - 1] == '-';
        right_plus = close > body && src_[close - 1] == '+';
        after = close + 2;
      } else {
        bool block = kind == '%';
        size_t first_token = tokens_.size();
        tokens_.push_back(make(block ? TokenKind::BlockBegin : TokenKind::VarBegin, "", open));
        after = lex_tag_body(body, block, right_strip, right_plus);
        if (block && tokens_.size() > first_token + 1 && tokens_[first_token + 1].kind == TokenKind::Name &&
            tokens_[first_token + 1].value == "raw") {
          tokens_.resize(first_token);
          after = lex_raw(after, right_strip, open, right_strip, right_plus);
          kind = '%';
        }
      }
      // The closing side: '-' strips following whitespace, trim_blocks eats one newline.
      size_t consumed_end = after;
      if (!right_strip && !right_plus && kind != '{' && opt_.trim_blocks && after < src_.size() &&
          src_[after] == '\n')
        consumed_end = after + 1;
      strip_leading = right_strip;
      if (right_strip) {
        size_t p = after;
        while (p < src_.size() && is_space_char(src_[p])) ++p;
        line_starting = p > after ? src_[p - 1] == '\n' : false;
        consumed_end = p;
        strip_leading = false;
      } else {
        line_starting = consumed_end > after;
      }
      pos = consumed_end;
      if (pos == src_.size()) break;
    }
    tokens_.push_back(make(TokenKind::End, "", src_.size()));
    return std::move(tokens_);
  }

 private:
  size_t find_tag_open(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  void emit_text(const std::string& text, size_t offset) {
    if (!text.empty()) tokens_.push_back(make(TokenKind::Text, text, offset));
  }

  Token make(TokenKind kind, std::string value, size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    Token t{kind, std::move(value), static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
    return t;
  }

  [[noreturn]] void error_at(size_t offset, const std::string& what) const {
    Token t = make(TokenKind::End, "", offset);
    fail("chat template syntax error at line {}, column {}: {}", t.line, t.column, what);
  }

  // Lexes expression tokens from `pos` up to the tag's closing delimiter (at bracket depth
  // 0); returns the offset just past it.
  size_t lex_tag_body(size_t pos, bool block, bool& right_strip, bool& right_plus) {
    const char closer = block ? '%' : '}';
    int depth = 0;
    while (true) {
      while (pos < src_.size() && is_space_char(src_[pos])) ++pos;
      if (pos >= src_.size()) error_at(pos, block ? "missing '%}'" : "missing '}}'");
      char c = src_[pos];
      if (depth == 0) {
        if ((c == '-' || c == '+') && src_.compare(pos + 1, 2, std::string(1, closer) + "}") == 0) {
          right_strip = c == '-';
          right_plus = c == '+';
          tokens_.push_back(make(block ? TokenKind::BlockEnd : TokenKind::VarEnd, "", pos));
          return pos + 3;
        }
        if (c == closer && pos + 1 < src_.size() && src_[pos + 1] == '}') {
          tokens_.push_back(make(block ? TokenKind::BlockEnd : TokenKind::VarEnd, "", pos));
          return pos + 2;
        }
      }
      if (is_name_start(c)) {
        size_t end = pos;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        tokens_.push_back(make(TokenKind::Name, src_.substr(pos, end - pos), pos));
        pos = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        pos = lex_number(pos);
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        static const char* const kTwoChar[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* two : kTwoChar)
          if (src_.compare(pos, 2, two) == 0) op = two;
        if (op.size() == 1 && std::string("+-*/%~<>=()[]{},.:|").find(c) == std::string::npos)
          error_at(pos, std::string("unexpected character '") + c + "'");
        if (c == '(' || c == '[' || c == '{') ++depth;
        if (c == ')' || c == ']' || c == '}') {
          if (depth == 0) error_at(pos, std::string("unbalanced '") + c + "'");
          --depth;
        }
        tokens_.push_back(make(TokenKind::Operator, op, pos));
        pos += op.size();
      }
    }
  }

  size_t lex_number(size_t pos) {
    size_t start = pos;
    auto digits = [&] {
      while (pos < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos])) || src_[pos] == '_')) ++pos;
    };
    digits();
    bool is_float = false;
    // "x.0.1" and "foo.0" are attribute access on integers, not floats.
    bool after_dot = start > 0 && src_[start - 1] == '.';
    if (!after_dot && pos + 1 < src_.size() && src_[pos] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos + 1]))) {
      is_float = true;
      ++pos;
      digits();
    }
    if (!after_dot && pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
      size_t p = pos + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        is_float = true;
        pos = p;
        digits();
      }
    }
    std::string text = src_.substr(start, pos - start);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    tokens_.push_back(make(is_float ? TokenKind::Float : TokenKind::Int, text, start));
    return pos;
  }

  // Python string-literal escapes (Jinja decodes literals with "unicode-escape").
  size_t lex_string(size_t pos) {
    size_t start = pos;
    char quote = src_[pos++];
    std::string out;
    while (true) {
      if (pos >= src_.size()) error_at(start, "unterminated string literal");
      char c = src_[pos++];
      if (c == quote) break;
      if (c != '\\' || pos >= src_.size()) {
        out += c;
        continue;
      }
      char e = src_[pos++];
      auto hex = [&](int n) {
        if (pos + n > src_.size()) error_at(pos, "truncated escape in string literal");
        uint32_t v = static_cast<uint32_t>(std::stoul(src_.substr(pos, n), nullptr, 16));
        pos += n;
        return v;
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;  // line continuation
        case 'x': append_utf8(out, hex(2)); break;
        case 'u': append_utf8(out, hex(4)); break;
        case 'U': append_utf8(out, hex(8)); break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && pos < src_.size() && src_[pos] >= '0' && src_[pos] <= '7'; ++k)
              v = v * 8 + static_cast<uint32_t>(src_[pos++] - '0');
            append_utf8(out, v);
          } else {
            out += '\\';  // unknown escapes stay as written, as in Python
            out += e;
          }
      }
    }
    tokens_.push_back(make(TokenKind::String, out, start));
    return pos;
  }

  // After `{% raw %}`: everything up to `{% endraw %}` is text. Returns the offset past the
  // endraw tag; sets the right-side modifiers of that tag.
  size_t lex_raw(size_t pos, bool strip_content_start, size_t raw_open, bool& right_strip, bool& right_plus) {
    for (size_t at = src_.find("{%", pos); at != std::string::npos; at = src_.find("{%", at + 2)) {
      size_t p = at + 2;
      bool left_strip = p < src_.size() && src_[p] == '-';
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
      while (p < src_.size() && is_space_char(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p += 6;
      while (p < src_.size() && is_space_char(src_[p])) ++p;
      right_strip = src_.compare(p, 3, "-%}") == 0;
      right_plus = src_.compare(p, 3, "+%}") == 0;
      if (!right_strip && !right_plus && src_.compare(p, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos, at - pos);
      if (strip_content_start) {
        size_t keep = 0;
        while (keep < text.size() && is_space_char(text[keep])) ++keep;
        text.erase(0, keep);
      }
      if (left_strip)
        while (!text.empty() && is_space_char(text.back())) text.pop_back();
      emit_text(text, pos);
      return p + (right_strip || right_plus ? 3 : 2);
    }
    error_at(raw_open, "'raw' block without 'endraw'");
  }

  std::string src_;
  LexOptions opt_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex_template(const std::string& source, const LexOptions& options) {
  // Jinja reads templates with universal newlines and, by default, without their final
  // newline.
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!options.keep_trailing_newline && !normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return TemplateLexer(std::move(normalized), options).run();
}

}  // namespace kiln::jinja
