#pragma once
// A compiled Jinja template: parse once, render many times with different variables.
// This is the subset of Jinja2 that model chat templates use; see chat_template.h for the
// transformers-compatible front end.
#include <string>
#include <unordered_map>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace kiln::jinja {

struct TemplateOptions {
  bool trim_blocks = false;            // drop the newline after a block tag
  bool lstrip_blocks = false;          // drop the indentation before a block tag
  bool keep_trailing_newline = false;  // Jinja's default drops one trailing newline
};

class Template {
 public:
  // Throws kiln::Error ("chat template syntax error at line L, column C: ...").
  explicit Template(const std::string& source, const TemplateOptions& options = {});

  // Renders with `variables` on top of the builtin globals (range, namespace, dict).
  // Throws kiln::Error naming the line and construct of a runtime failure.
  std::string render(const std::unordered_map<std::string, Value>& variables) const;

 private:
  StmtList program_;
};

}  // namespace kiln::jinja
