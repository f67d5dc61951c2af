#pragma once
// The interpreter: walks parsed statements, evaluating expressions in nested scopes with
// Jinja's rules (a for-loop iteration, a macro call and a with block open a scope; if does
// not; a set inside a loop is invisible after it, hence namespace()).
#include <memory>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"

namespace kiln::jinja {

// An error that already says where in the template it happened (or that the template
// raised itself through raise_exception); enclosing constructs pass it on unchanged.
class TemplateError : public Error {
 public:
  using Error::Error;
};

struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;

  const Value* lookup(const std::string& name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

// Renders `program` with `root` as the outermost scope (globals and caller variables).
std::string render_program(const StmtList& program, ScopePtr root);

}  // namespace kiln::jinja
