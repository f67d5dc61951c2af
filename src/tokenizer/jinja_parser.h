#pragma once
// Recursive-descent parser from lexer tokens to statements, following Jinja's grammar and
// operator precedence (or < and < not < comparisons < + - < ~ < * / // % < ** < unary <
// filters and tests < postfix).
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace kiln::jinja {

// Throws kiln::Error naming line and column of the first syntax error.
StmtList parse_template(const std::vector<Token>& tokens);

}  // namespace kiln::jinja
