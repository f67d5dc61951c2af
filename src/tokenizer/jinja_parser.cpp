#include "tokenizer/jinja_parser.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace kiln::jinja {

namespace {

const char* token_kind_label(TokenKind kind) {
  switch (kind) {
    case TokenKind::Text: return "text";
    case TokenKind::VarBegin: return "'{{'";
    case TokenKind::VarEnd: return "'}}'";
    case TokenKind::BlockBegin: return "'{%'";
    case TokenKind::BlockEnd: return "'%}'";
    case TokenKind::Name: return "name";
    case TokenKind::String: return "string";
    case TokenKind::Int: return "integer";
    case TokenKind::Float: return "float";
    case TokenKind::Operator: return "operator";
    case TokenKind::End: return "end of template";
  }
  return "?";
}

class TemplateParser {
 public:
  explicit TemplateParser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  StmtList parse_all() {
    std::string found;
    return parse_until({}, found);
  }

 private:
  // ---- token helpers ----
  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool at_op(const char* op) const { return peek().kind == TokenKind::Operator && peek().value == op; }
  bool at_name(const char* name) const { return peek().kind == TokenKind::Name && peek().value == name; }
  bool accept_op(const char* op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }

  [[noreturn]] void error(const Token& at, const std::string& what) const {
    fail("chat template syntax error at line {}, column {}: {}", at.line, at.column, what);
  }
  static std::string describe(const Token& t) {
    if (t.kind == TokenKind::Name || t.kind == TokenKind::Operator) return "'" + t.value + "'";
    return token_kind_label(t.kind);
  }

  void expect_op(const char* op) {
    if (!accept_op(op)) error(peek(), std::string("expected '") + op + "', got " + describe(peek()));
  }
  void expect_name(const char* name) {
    if (!accept_name(name)) error(peek(), std::string("expected '") + name + "', got " + describe(peek()));
  }
  std::string expect_identifier(const char* what) {
    if (peek().kind != TokenKind::Name) error(peek(), std::string("expected ") + what + ", got " + describe(peek()));
    return next().value;
  }
  void expect_block_end(const std::string& tag) {
    if (peek().kind != TokenKind::BlockEnd)
      error(peek(), "expected '%}' to close '" + tag + "', got " + describe(peek()));
    next();
  }

  ExprPtr make_expr(ExprKind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  StmtPtr make_stmt(StmtKind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    return s;
  }

  // ---- statements ----

  // Parses statements until a block tag whose keyword is in `stops` (consumed up to and
  // including the keyword; `found` receives it). With no stops, parses to the end.
  StmtList parse_until(const std::vector<std::string>& stops, std::string& found) {
    StmtList out;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::End) {
        if (!stops.empty()) error(t, "unexpected end of template, expected '" + stops.back() + "'");
        return out;
      }
      if (t.kind == TokenKind::Text) {
        auto s = make_stmt(StmtKind::Text, t);
        s->text = next().value;
        out.push_back(std::move(s));
      } else if (t.kind == TokenKind::VarBegin) {
        next();
        auto s = make_stmt(StmtKind::Output, t);
        s->value = parse_tuple(true);
        if (peek().kind != TokenKind::VarEnd) error(peek(), "expected '}}', got " + describe(peek()));
        next();
        out.push_back(std::move(s));
      } else if (t.kind == TokenKind::BlockBegin) {
        const Token& keyword = peek(1);
        if (keyword.kind != TokenKind::Name) error(keyword, "expected a statement keyword after '{%'");
        if (std::find(stops.begin(), stops.end(), keyword.value) != stops.end()) {
          next();
          found = next().value;
          return out;
        }
        out.push_back(parse_statement());
      } else {
        error(t, "unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& begin = next();  // {%
    const Token& keyword = next();
    const std::string& k = keyword.value;
    if (k == "if") return parse_if(begin);
    if (k == "for") return parse_for(begin);
    if (k == "set") return parse_set(begin);
    if (k == "macro") return parse_macro(begin);
    if (k == "filter") {
      auto s = make_stmt(StmtKind::FilterBlock, begin);
      s->value = parse_filter_chain(nullptr);
      expect_block_end("filter");
      s->body = parse_body_until("endfilter");
      return s;
    }
    if (k == "with") {
      auto s = make_stmt(StmtKind::With, begin);
      while (peek().kind != TokenKind::BlockEnd) {
        if (!s->params.empty()) expect_op(",");
        MacroParam p;
        p.name = expect_identifier("a variable name");
        expect_op("=");
        p.default_value = parse_expression();
        s->params.push_back(std::move(p));
      }
      expect_block_end("with");
      s->body = parse_body_until("endwith");
      return s;
    }
    if (k == "do") {
      auto s = make_stmt(StmtKind::Do, begin);
      s->value = parse_tuple(true);
      expect_block_end("do");
      return s;
    }
    if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) error(keyword, "'" + k + "' outside of a loop");
      auto s = make_stmt(k == "break" ? StmtKind::Break : StmtKind::Continue, begin);
      expect_block_end(k);
      return s;
    }
    if (k == "call") {
      auto s = make_stmt(StmtKind::CallBlock, begin);
      if (at_op("(")) error(peek(), "'call' blocks with caller parameters are not supported");
      s->value = parse_expression();
      if (s->value->kind != ExprKind::Call) error(keyword, "'call' needs a macro call");
      expect_block_end("call");
      s->body = parse_body_until("endcall");
      return s;
    }
    if (k == "generation") {
      // transformers' {% generation %} marks assistant text for masks; rendering is unchanged.
      auto s = make_stmt(StmtKind::If, begin);
      s->condition = make_expr(ExprKind::Literal, begin);
      s->condition->literal = Value(true);
      expect_block_end("generation");
      s->body = parse_body_until("endgeneration");
      return s;
    }
    error(keyword, "unknown or unsupported tag '" + k + "'");
  }

  StmtList parse_body_until(const char* end_tag) {
    std::string found;
    StmtList body = parse_until({end_tag}, found);
    expect_block_end(end_tag);
    return body;
  }

  // After "{% if" or "{% elif": condition, body, and the chain that follows.
  StmtPtr parse_if(const Token& begin) {
    auto s = make_stmt(StmtKind::If, begin);
    s->condition = parse_tuple(true);
    expect_block_end("if");
    std::string found;
    s->body = parse_until({"elif", "else", "endif"}, found);
    if (found == "elif") {
      s->else_body.push_back(parse_if(peek()));
    } else if (found == "else") {
      expect_block_end("else");
      s->else_body = parse_body_until("endif");
    } else {
      expect_block_end("endif");
    }
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool parens = accept_op("(");
    do {
      names.push_back(expect_identifier("a variable name"));
    } while (accept_op(","));
    if (parens) expect_op(")");
    return names;
  }

  StmtPtr parse_for(const Token& begin) {
    auto s = make_stmt(StmtKind::For, begin);
    s->targets = parse_targets();
    expect_name("in");
    s->value = parse_tuple(false);  // no ternary here: a trailing "if" filters the loop
    if (accept_name("if")) s->condition = parse_expression();
    if (at_name("recursive")) error(peek(), "recursive loops are not supported");
    expect_block_end("for");
    ++loop_depth_;
    std::string found;
    s->body = parse_until({"else", "endfor"}, found);
    --loop_depth_;
    if (found == "else") {
      expect_block_end("else");
      s->else_body = parse_body_until("endfor");
    } else {
      expect_block_end("endfor");
    }
    return s;
  }

  StmtPtr parse_set(const Token& begin) {
    const Token& first = peek();
    std::string name = expect_identifier("a variable name");
    if (accept_op(".")) {  // namespace attribute: {% set ns.attr = value %}
      auto s = make_stmt(StmtKind::Set, begin);
      auto target = make_expr(ExprKind::GetAttr, first);
      target->target = make_expr(ExprKind::Name, first);
      target->target->text = name;
      target->text = expect_identifier("an attribute name");
      s->attribute_target = std::move(target);
      expect_op("=");
      s->value = parse_tuple(true);
      expect_block_end("set");
      return s;
    }
    std::vector<std::string> names{name};
    while (accept_op(",")) names.push_back(expect_identifier("a variable name"));
    if (accept_op("=")) {
      auto s = make_stmt(StmtKind::Set, begin);
      s->targets = std::move(names);
      s->value = parse_tuple(true);
      expect_block_end("set");
      return s;
    }
    if (names.size() != 1) error(peek(), "a block 'set' assigns one name");
    auto s = make_stmt(StmtKind::SetBlock, begin);
    s->text = name;
    if (at_op("|")) s->value = parse_filter_chain(nullptr);
    expect_block_end("set");
    s->body = parse_body_until("endset");
    return s;
  }

  StmtPtr parse_macro(const Token& begin) {
    auto s = make_stmt(StmtKind::Macro, begin);
    s->text = expect_identifier("a macro name");
    expect_op("(");
    while (!at_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (at_op(")")) break;
      MacroParam p;
      p.name = expect_identifier("a parameter name");
      if (accept_op("=")) p.default_value = parse_expression();
      s->params.push_back(std::move(p));
    }
    expect_op(")");
    expect_block_end("macro");
    int saved_depth = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body_until("endmacro");
    loop_depth_ = saved_depth;
    return s;
  }

  // "name(args) | name2 ..." applied to `input` (null: the block's rendered body). A leading
  // '|' is allowed, as after `{% set x | upper %}`.
  ExprPtr parse_filter_chain(ExprPtr input) {
    accept_op("|");
    do {
      input = parse_filter(std::move(input));
    } while (accept_op("|"));
    return input;
  }

  // ---- expressions ----

  // expr, expr, ... (a tuple when there is a comma)
  ExprPtr parse_tuple(bool with_condexpr) {
    const Token& start = peek();
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!at_op(",")) return first;
    auto tuple = make_expr(ExprKind::Tuple, start);
    tuple->args.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == TokenKind::VarEnd || peek().kind == TokenKind::BlockEnd || at_op(")")) break;
      if (!with_condexpr && at_name("if")) break;
      tuple->args.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    return tuple;
  }

  ExprPtr parse_expression() {
    ExprPtr value = parse_or();
    while (at_name("if")) {
      const Token& t = next();
      auto cond = make_expr(ExprKind::Cond, t);
      cond->args.push_back(std::move(value));
      cond->args.push_back(parse_or());
      cond->args.push_back(accept_name("else") ? parse_expression() : nullptr);
      value = std::move(cond);
    }
    return value;
  }

  ExprPtr binary(const Token& at, std::string op, ExprPtr left, ExprPtr right) {
    auto e = make_expr(ExprKind::Binary, at);
    e->text = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      const Token& t = next();
      left = binary(t, "or", std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      const Token& t = next();
      left = binary(t, "and", std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      const Token& t = next();
      auto e = make_expr(ExprKind::Unary, t);
      e->text = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& start = peek();
    ExprPtr first = parse_math1();
    ExprPtr chain;
    while (true) {
      const Token& t = peek();
      std::string op;
      if (t.kind == TokenKind::Operator &&
          (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == ">" || t.value == "<=" ||
           t.value == ">=")) {
        op = t.value;
        next();
      } else if (at_name("in")) {
        op = "in";
        next();
      } else if (at_name("not") && peek(1).kind == TokenKind::Name && peek(1).value == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!chain) {
        chain = make_expr(ExprKind::Compare, start);
        chain->args.push_back(std::move(first));
      }
      chain->ops.push_back(op);
      chain->args.push_back(parse_math1());
    }
    return chain ? std::move(chain) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& t = next();
      left = binary(t, t.value, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_op("~")) {
      const Token& t = next();
      left = binary(t, "~", std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& t = next();
      left = binary(t, t.value, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      const Token& t = next();
      left = binary(t, "**", std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filters) {
    const Token& t = peek();
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      next();
      node = make_expr(ExprKind::Unary, t);
      node->text = t.value;
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filters) node = parse_filters_and_tests(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::Name: {
        next();
        auto e = make_expr(ExprKind::Literal, t);
        if (t.value == "true" || t.value == "True") e->literal = Value(true);
        else if (t.value == "false" || t.value == "False") e->literal = Value(false);
        else if (t.value == "none" || t.value == "None") e->literal = Value(nullptr);
        else {
          e->kind = ExprKind::Name;
          e->text = t.value;
        }
        return e;
      }
      case TokenKind::String: {
        std::string s;
        while (peek().kind == TokenKind::String) s += next().value;  // "a" "b" concatenates
        auto e = make_expr(ExprKind::Literal, t);
        e->literal = Value(std::move(s));
        return e;
      }
      case TokenKind::Int: {
        next();
        auto e = make_expr(ExprKind::Literal, t);
        e->literal = Value(static_cast<int64_t>(std::strtoll(t.value.c_str(), nullptr, 10)));
        return e;
      }
      case TokenKind::Float: {
        next();
        auto e = make_expr(ExprKind::Literal, t);
        e->literal = Value(std::strtod(t.value.c_str(), nullptr));
        return e;
      }
      case TokenKind::Operator: {
        if (accept_op("(")) {
          if (accept_op(")")) return make_expr(ExprKind::Tuple, t);
          ExprPtr inner = parse_tuple(true);
          expect_op(")");
          return inner;
        }
        if (accept_op("[")) {
          auto e = make_expr(ExprKind::List, t);
          while (!at_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (at_op("]")) break;
            e->args.push_back(parse_expression());
          }
          expect_op("]");
          return e;
        }
        if (accept_op("{")) {
          auto e = make_expr(ExprKind::Dict, t);
          while (!at_op("}")) {
            if (!e->args.empty()) expect_op(",");
            if (at_op("}")) break;
            e->args.push_back(parse_expression());
            expect_op(":");
            e->args.push_back(parse_expression());
          }
          expect_op("}");
          return e;
        }
        break;
      }
      default: break;
    }
    error(t, "unexpected " + describe(t) + " in expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const Token& t = peek();
      if (accept_op(".")) {
        const Token& attr = next();
        if (attr.kind == TokenKind::Name) {
          auto e = make_expr(ExprKind::GetAttr, t);
          e->text = attr.value;
          e->target = std::move(node);
          node = std::move(e);
        } else if (attr.kind == TokenKind::Int) {  // foo.0 is foo[0]
          auto e = make_expr(ExprKind::GetItem, t);
          e->target = std::move(node);
          auto index = make_expr(ExprKind::Literal, attr);
          index->literal = Value(static_cast<int64_t>(std::strtoll(attr.value.c_str(), nullptr, 10)));
          e->args.push_back(std::move(index));
          node = std::move(e);
        } else {
          error(attr, "expected an attribute name after '.'");
        }
      } else if (accept_op("[")) {
        node = parse_subscript(std::move(node), t);
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, const Token& at) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!at_op("]")) {
      if (accept_op(":")) {
        is_slice = true;
        if (++part > 2) error(peek(), "too many ':' in slice");
        continue;
      }
      if (parts[part]) error(peek(), "expected ']' or ':' in subscript");
      parts[part] = parse_expression();
    }
    expect_op("]");
    if (!is_slice) {
      if (!parts[0]) error(at, "empty subscript");
      auto e = make_expr(ExprKind::GetItem, at);
      e->target = std::move(target);
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make_expr(ExprKind::Slice, at);
    e->target = std::move(target);
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // "(" args ")" after a callee; fills args and kwargs of `e`.
  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!at_op(")")) {
      if (!e.args.empty() || !e.kwargs.empty()) expect_op(",");
      if (at_op(")")) break;
      if (peek().kind == TokenKind::Name && peek(1).kind == TokenKind::Operator && peek(1).value == "=") {
        std::string name = next().value;
        next();
        e.kwargs.emplace_back(name, parse_expression());
      } else {
        if (!e.kwargs.empty()) error(peek(), "positional argument after keyword argument");
        e.args.push_back(parse_expression());
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make_expr(ExprKind::Call, peek());
    e->target = std::move(callee);
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr input) {
    const Token& t = peek();
    auto e = make_expr(ExprKind::Filter, t);
    e->text = expect_identifier("a filter name");
    e->target = std::move(input);
    if (at_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filters_and_tests(ExprPtr node) {
    while (true) {
      if (accept_op("|")) {
        node = parse_filter(std::move(node));
      } else if (at_name("is")) {
        const Token& t = next();
        auto e = make_expr(ExprKind::Test, t);
        e->negated = accept_name("not");
        e->text = expect_identifier("a test name");
        e->target = std::move(node);
        if (at_op("(")) {
          parse_call_args(*e);
        } else if (starts_test_argument()) {
          e->args.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(e);
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  // `x is divisibleby 3`: a test may take one argument without parentheses.
  bool starts_test_argument() const {
    const Token& t = peek();
    if (t.kind == TokenKind::String || t.kind == TokenKind::Int || t.kind == TokenKind::Float) return true;
    if (t.kind == TokenKind::Operator) return t.value == "[" || t.value == "{";
    if (t.kind != TokenKind::Name) return false;
    static const char* const kStop[] = {"else", "or", "and", "if", "in", "not", "is", "recursive"};
    for (const char* s : kStop)
      if (t.value == s) return false;
    return true;
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

StmtList parse_template(const std::vector<Token>& tokens) { return TemplateParser(tokens).parse_all(); }

}  // namespace kiln::jinja
