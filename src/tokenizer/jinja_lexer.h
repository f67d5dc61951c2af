#pragma once
// Splits a Jinja template into text and tag tokens, applying Jinja's whitespace rules as it
// goes: `-` on a tag side strips the neighbouring whitespace, trim_blocks drops the newline
// after a block tag, lstrip_blocks drops the indentation before one, `+` opts out of both.
// Comments vanish here and raw blocks become text.
#include <string>
#include <vector>

namespace kiln::jinja {

struct LexOptions {
  bool trim_blocks = false;
  bool lstrip_blocks = false;
  bool keep_trailing_newline = false;  // Jinja drops one trailing newline by default
};

enum class TokenKind {
  Text,        // literal template text (value = the text)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,        // identifier or keyword
  String,      // string literal, value already unescaped
  Int,         // integer literal (value = digits, underscores removed)
  Float,       // float literal
  Operator,    // punctuation: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  End,         // end of the template
};

struct Token {
  TokenKind kind;
  std::string value;
  int line = 0;    // 1-based
  int column = 0;  // 1-based
};

// Throws kiln::Error naming the line and column of the first malformed construct.
std::vector<Token> lex_template(const std::string& source, const LexOptions& options);

}  // namespace kiln::jinja
