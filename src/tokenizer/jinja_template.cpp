#include "tokenizer/jinja_template.h"

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_eval.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_parser.h"

namespace kiln::jinja {

Template::Template(const std::string& source, const TemplateOptions& options) {
  LexOptions lex;
  lex.trim_blocks = options.trim_blocks;
  lex.lstrip_blocks = options.lstrip_blocks;
  lex.keep_trailing_newline = options.keep_trailing_newline;
  program_ = parse_template(lex_template(source, lex));
}

std::string Template::render(const std::unordered_map<std::string, Value>& variables) const {
  auto root = std::make_shared<Scope>();
  add_builtin_globals(root->vars);
  for (const auto& [name, value] : variables) root->vars[name] = value;
  return render_program(program_, root);
}

}  // namespace kiln::jinja
