#pragma once
// The parsed form of a template: expressions and statements as small tagged nodes. One node
// type per family keeps the interpreter a pair of switches.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace kiln::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,   // literal
  Name,      // text = variable name
  List,      // args = items
  Tuple,     // args = items
  Dict,      // args = key0, value0, key1, value1, ...
  Unary,     // text = "-", "+" or "not"; args[0]
  Binary,    // text = operator ("+", "-", "~", "and", "or", ...); args[0], args[1]
  Compare,   // args[0] ops[0] args[1] ops[1] args[2] ...: chained as in Python (a < b < c)
  Cond,      // args = then, condition, else (else may be null)
  GetAttr,   // target.text
  GetItem,   // target[args[0]]
  Slice,     // target[args[0]:args[1]:args[2]] (each may be null)
  Call,      // target(args..., kwargs...)
  Filter,    // target | text(args..., kwargs...); target is null inside {% filter %}
  Test,      // target is [not] text(args...)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int column = 0;
  std::string text;
  Value literal;
  ExprPtr target;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // Compare: "==", "!=", "<", "<=", ">", ">=", "in", "not in"
  bool negated = false;          // Test: "is not"
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

enum class StmtKind {
  Text,       // text
  Output,     // {{ expr }}
  If,         // condition, body, else_body (an elif is an If inside else_body)
  For,        // targets in iterable [if condition], body, else_body
  Set,        // targets / attribute target = value
  SetBlock,   // {% set name | filters %}body{% endset %}
  Macro,      // name(params) body
  FilterBlock,  // {% filter f %}body{% endfilter %}: filter chain in `value`
  With,       // {% with a = 1 %}body{% endwith %}: assignments in params
  Do,         // {% do expr %}
  Break,
  Continue,
  CallBlock,  // {% call macro(...) %}body{% endcall %}: body becomes caller()
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                  // Text; name for Macro/SetBlock
  ExprPtr condition;                 // If condition, For filter
  ExprPtr value;                     // Output/Set/Do value, For iterable, filter chain, call
  ExprPtr attribute_target;          // Set: `ns.attr = ...` (a GetAttr node)
  std::vector<std::string> targets;  // For/Set names (several: tuple unpacking)
  std::vector<MacroParam> params;    // Macro parameters; With assignments
  StmtList body;
  StmtList else_body;
};

}  // namespace kiln::jinja
