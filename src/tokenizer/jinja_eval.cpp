#include "tokenizer/jinja_eval.h"

#include <cmath>

#include "tokenizer/jinja_builtins.h"

namespace kiln::jinja {

const Value* Scope::lookup(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

namespace {

[[noreturn]] void fail_undefined(const Value& v) {
  fail("'{}' is undefined", v.undefined_name().empty() ? "value" : v.undefined_name());
}

double number_of(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_double(); }
bool int_like(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t int_of(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int(); }

Value repeat_value(const Value& seq, int64_t times) {
  // A template is data from the model repository: refuse sizes that would exhaust memory.
  size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().items.size();
  if (times > 0 && unit > 0 && static_cast<double>(unit) * static_cast<double>(times) > 64.0 * 1024 * 1024)
    fail("repetition by {} would exceed 64 Mi elements", times);
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return Value(out);
  }
  std::vector<Value> items;
  for (int64_t i = 0; i < times; ++i)
    items.insert(items.end(), seq.as_list().items.begin(), seq.as_list().items.end());
  return Value::list(std::move(items), seq.as_list().is_tuple);
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  bool a_num = a.is_number() || a.is_bool();
  bool b_num = b.is_number() || b.is_bool();
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list()) {
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return Value::list(std::move(items), a.as_list().is_tuple);
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && int_like(b)) return repeat_value(a, int_of(b));
    if ((b.is_string() || b.is_list()) && int_like(a)) return repeat_value(b, int_of(a));
  }
  if (!a_num || !b_num)
    fail("unsupported operand types for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
  bool ints = int_like(a) && int_like(b);
  if (ints) {
    int64_t x = int_of(a), y = int_of(b);
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if ((op == "//" || op == "%" || op == "/") && y == 0) fail("division by zero");
    if (op == "//") return Value(x / y - ((x % y != 0 && ((x < 0) != (y < 0))) ? 1 : 0));
    if (op == "%") {
      int64_t r = x % y;
      return Value(r != 0 && ((r < 0) != (y < 0)) ? r + y : r);
    }
    if (op == "**" && y >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < y; ++i) r *= x;
      return Value(r);
    }
  }
  double x = number_of(a), y = number_of(b);
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") return Value(std::pow(x, y));
  if (y == 0.0) fail("division by zero");
  if (op == "/") return Value(x / y);
  if (op == "//") return Value(std::floor(x / y));
  if (op == "%") {
    double r = std::fmod(x, y);
    return Value(r != 0 && ((r < 0) != (y < 0)) ? r + y : r);
  }
  fail("unknown operator '{}'", op);
}

bool contains(const Value& container, const Value& needle) {
  switch (container.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (!needle.is_string())
        fail("'in <string>' requires string as left operand, not {}", needle.type_name());
      return container.as_string().find(needle.as_string()) != std::string::npos;
    case Value::Kind::List:
      for (const Value& v : container.as_list().items)
        if (values_equal(v, needle)) return true;
      return false;
    case Value::Kind::Dict:
      return needle.is_string() ? container.as_dict().find(needle.as_string()) != nullptr
                                : container.as_dict().find(needle.str()) != nullptr;
    default: fail("argument of type '{}' is not iterable", container.type_name());
  }
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return values_equal(a, b);
  if (op == "!=") return !values_equal(a, b);
  if (op == "<") return value_less(a, b);
  if (op == ">") return value_less(b, a);
  if (op == "<=") return !value_less(b, a);
  if (op == ">=") return !value_less(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  fail("unknown comparison '{}'", op);
}

enum class Flow { Normal, Break, Continue };

class Interpreter {
 public:
  Flow exec_list(const StmtList& list, std::string& out, const ScopePtr& scope) {
    for (const StmtPtr& s : list) {
      Flow f = exec(*s, out, scope);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

 private:
  Flow exec(const Stmt& s, std::string& out, const ScopePtr& scope) {
    try {
      return exec_inner(s, out, scope);
    } catch (const TemplateError&) {
      throw;
    } catch (const Error& e) {
      throw TemplateError(fmt::format("chat template error at line {}: {}", s.line, e.what()));
    }
  }

  Flow exec_inner(const Stmt& s, std::string& out, const ScopePtr& scope) {
    switch (s.kind) {
      case StmtKind::Text: out += s.text; return Flow::Normal;
      case StmtKind::Output: out += eval(*s.value, scope).str(); return Flow::Normal;
      case StmtKind::If:
        return exec_list(eval(*s.condition, scope).truthy() ? s.body : s.else_body, out, scope);
      case StmtKind::For: return exec_for(s, out, scope);
      case StmtKind::Set: {
        Value v = eval(*s.value, scope);
        if (s.attribute_target) {
          const Expr& t = *s.attribute_target;
          const Value* ns = scope->lookup(t.target->text);
          if (!ns || !ns->is_dict() || !ns->as_dict().is_namespace)
            fail("cannot assign attribute '{}' on '{}': it is not a namespace", t.text, t.target->text);
          ns->as_dict().set(t.text, std::move(v));
        } else {
          assign(*scope, s.targets, v, "set");
        }
        return Flow::Normal;
      }
      case StmtKind::SetBlock: {
        std::string body;
        exec_list(s.body, body, scope);
        Value v(std::move(body));
        if (s.value) v = eval_with_block_input(*s.value, scope, v);
        scope->vars[s.text] = std::move(v);
        return Flow::Normal;
      }
      case StmtKind::Macro: scope->vars[s.text] = make_macro(s, scope); return Flow::Normal;
      case StmtKind::FilterBlock: {
        std::string body;
        exec_list(s.body, body, scope);
        out += eval_with_block_input(*s.value, scope, Value(std::move(body))).str();
        return Flow::Normal;
      }
      case StmtKind::With: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        for (const MacroParam& p : s.params) inner->vars[p.name] = eval(*p.default_value, scope);
        return exec_list(s.body, out, inner);
      }
      case StmtKind::Do: eval(*s.value, scope); return Flow::Normal;
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
      case StmtKind::CallBlock: {
        const Stmt* block = &s;
        Interpreter* self = this;
        std::weak_ptr<Scope> weak_scope = scope;
        Value caller = Value::function("caller", [self, block, weak_scope](const CallArgs&) {
          std::string body;
          self->exec_list(block->body, body, weak_scope.lock());
          return Value(std::move(body));
        });
        out += eval_call(*s.value, scope, &caller).str();
        return Flow::Normal;
      }
    }
    return Flow::Normal;
  }

  void assign(Scope& scope, const std::vector<std::string>& targets, const Value& v, const char* what) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    if (!v.is_list()) fail("{}: cannot unpack a '{}' into {} names", what, v.type_name(), targets.size());
    const auto& items = v.as_list().items;
    if (items.size() != targets.size())
      fail("{}: expected {} values to unpack, got {}", what, targets.size(), items.size());
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  Flow exec_for(const Stmt& s, std::string& out, const ScopePtr& scope) {
    std::vector<Value> items = iterate_value(eval(*s.value, scope), "for loop");
    if (s.condition) {  // the loop's "if" filters before loop.index and loop.length count
      std::vector<Value> kept;
      for (Value& item : items) {
        auto probe = std::make_shared<Scope>();
        probe->parent = scope;
        assign(*probe, s.targets, item, "for loop");
        if (eval(*s.condition, probe).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_list(s.else_body, out, scope);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      auto iteration = std::make_shared<Scope>();
      iteration->parent = scope;
      assign(*iteration, s.targets, items[i], "for loop");
      auto loop = std::make_shared<Dict>();
      loop->entries = {{"index", Value(i + 1)},       {"index0", Value(i)},
                       {"revindex", Value(n - i)},    {"revindex0", Value(n - i - 1)},
                       {"first", Value(i == 0)},      {"last", Value(i == n - 1)},
                       {"length", Value(n)},          {"depth", Value(1)},
                       {"depth0", Value(0)}};
      if (i > 0) loop->entries.emplace_back("previtem", items[i - 1]);
      if (i + 1 < n) loop->entries.emplace_back("nextitem", items[i + 1]);
      loop->entries.emplace_back("cycle", Value::function("loop.cycle", [i](const CallArgs& a) {
        if (a.positional.empty()) fail("loop.cycle needs at least one value");
        return a.positional[static_cast<size_t>(i) % a.positional.size()];
      }));
      iteration->vars["loop"] = Value(std::move(loop));
      if (exec_list(s.body, out, iteration) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Stmt& s, const ScopePtr& scope) {
    const Stmt* macro = &s;
    Interpreter* self = this;
    std::weak_ptr<Scope> defining = scope;  // weak: the scope holds the macro itself
    return Value::function("macro '" + s.text + "'", [self, macro, defining](const CallArgs& args) {
      if (self->macro_depth_ >= kMaxMacroDepth) fail("macro '{}' nests deeper than {} calls", macro->text, kMaxMacroDepth);
      struct DepthGuard {
        int& depth;
        explicit DepthGuard(int& d) : depth(d) { ++depth; }
        ~DepthGuard() { --depth; }
      } guard(self->macro_depth_);
      auto frame = std::make_shared<Scope>();
      frame->parent = defining.lock();
      size_t n_params = macro->params.size();
      for (size_t i = 0; i < n_params; ++i) {
        const MacroParam& p = macro->params[i];
        if (const Value* given = args.find(i, p.name)) {
          frame->vars[p.name] = *given;
        } else {
          frame->vars[p.name] = p.default_value ? self->eval(*p.default_value, frame) : Value::undefined(p.name);
        }
      }
      std::vector<Value> extra;
      for (size_t i = n_params; i < args.positional.size(); ++i) extra.push_back(args.positional[i]);
      frame->vars["varargs"] = Value::list(std::move(extra), true);
      auto kwargs = std::make_shared<Dict>();
      for (const auto& [name, v] : args.keyword) {
        bool is_param = false;
        for (const MacroParam& p : macro->params) is_param = is_param || p.name == name;
        if (name == "caller") frame->vars["caller"] = v;
        else if (!is_param) kwargs->set(name, v);
      }
      frame->vars["kwargs"] = Value(std::move(kwargs));
      std::string out;
      self->exec_list(macro->body, out, frame);
      return Value(std::move(out));
    });
  }

  // Evaluates a filter chain whose innermost filter has no input: the block body goes there.
  Value eval_with_block_input(const Expr& chain, const ScopePtr& scope, const Value& input) {
    Value saved = block_input_;
    block_input_ = input;
    Value result = eval(chain, scope);
    block_input_ = saved;
    return result;
  }

  CallArgs eval_args(const Expr& e, const ScopePtr& scope) {
    CallArgs args;
    for (const ExprPtr& a : e.args) args.positional.push_back(eval(*a, scope));
    for (const auto& [name, a] : e.kwargs) args.keyword.emplace_back(name, eval(*a, scope));
    return args;
  }

  Value eval_call(const Expr& e, const ScopePtr& scope, const Value* caller) {
    Value callee = eval(*e.target, scope);
    if (callee.is_undefined()) fail_undefined(callee);
    if (!callee.is_callable()) fail("'{}' object is not callable", callee.type_name());
    CallArgs args = eval_args(e, scope);
    if (caller) args.keyword.emplace_back("caller", *caller);
    return callee.as_callable().call(args);
  }

 public:
  Value eval(const Expr& e, const ScopePtr& scope) {
    try {
      return eval_inner(e, scope);
    } catch (const TemplateError&) {
      throw;
    } catch (const Error& err) {
      throw TemplateError(fmt::format("chat template error at line {}, column {} ({}): {}", e.line, e.column,
                                      describe(e), err.what()));
    }
  }

 private:
  static std::string describe(const Expr& e) {
    switch (e.kind) {
      case ExprKind::Filter: return "filter '" + e.text + "'";
      case ExprKind::Test: return "test '" + e.text + "'";
      case ExprKind::Call:
        if (e.target->kind == ExprKind::Name) return "call of '" + e.target->text + "'";
        if (e.target->kind == ExprKind::GetAttr) return "call of method '" + e.target->text + "'";
        return "call";
      case ExprKind::Binary:
      case ExprKind::Unary: return "operator '" + e.text + "'";
      case ExprKind::Compare: return "comparison '" + e.ops[0] + "'";
      case ExprKind::GetAttr: return "attribute '" + e.text + "'";
      case ExprKind::GetItem: return "subscript";
      case ExprKind::Slice: return "slice";
      default: return "expression";
    }
  }

  Value eval_inner(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case ExprKind::Literal: return e.literal;
      case ExprKind::Name: {
        const Value* v = scope->lookup(e.text);
        return v ? *v : Value::undefined(e.text);
      }
      case ExprKind::List:
      case ExprKind::Tuple: {
        std::vector<Value> items;
        for (const ExprPtr& a : e.args) items.push_back(eval(*a, scope));
        return Value::list(std::move(items), e.kind == ExprKind::Tuple);
      }
      case ExprKind::Dict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value key = eval(*e.args[i], scope);
          d->set(key.str(), eval(*e.args[i + 1], scope));
        }
        return Value(std::move(d));
      }
      case ExprKind::Unary: {
        Value v = eval(*e.args[0], scope);
        if (e.text == "not") return Value(!v.truthy());
        if (v.is_undefined()) fail_undefined(v);
        if (v.is_int() || v.is_bool()) return Value(e.text == "-" ? -int_of(v) : int_of(v));
        if (v.is_float()) return Value(e.text == "-" ? -v.as_double() : v.as_double());
        fail("bad operand type for unary {}: '{}'", e.text, v.type_name());
      }
      case ExprKind::Binary: {
        if (e.text == "and") {
          Value left = eval(*e.args[0], scope);
          return left.truthy() ? eval(*e.args[1], scope) : left;
        }
        if (e.text == "or") {
          Value left = eval(*e.args[0], scope);
          return left.truthy() ? left : eval(*e.args[1], scope);
        }
        Value left = eval(*e.args[0], scope);
        Value right = eval(*e.args[1], scope);
        if (e.text == "~") return Value(left.str() + right.str());
        return arithmetic(e.text, left, right);
      }
      case ExprKind::Compare: {  // a < b < c means a < b and b < c, each operand evaluated once
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          if (!compare(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case ExprKind::Cond: {
        if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value::undefined("");
      }
      case ExprKind::GetAttr: return get_attribute(eval(*e.target, scope), e.text);
      case ExprKind::GetItem: return get_item(eval(*e.target, scope), eval(*e.args[0], scope));
      case ExprKind::Slice: {
        Value bounds[3];
        for (int i = 0; i < 3; ++i)
          if (e.args[i]) bounds[i] = eval(*e.args[i], scope);
        return slice_value(eval(*e.target, scope), bounds[0], bounds[1], bounds[2]);
      }
      case ExprKind::Call: return eval_call(e, scope, nullptr);
      case ExprKind::Filter: {
        Value input = e.target ? eval(*e.target, scope) : block_input_;
        return apply_filter(e.text, input, eval_args(e, scope));
      }
      case ExprKind::Test: {
        Value input = eval(*e.target, scope);
        bool result = apply_test(e.text, input, eval_args(e, scope));
        return Value(e.negated ? !result : result);
      }
    }
    fail("unknown expression");
  }

  static constexpr int kMaxMacroDepth = 200;  // recursion bound: a runaway template fails, not the stack
  Value block_input_;
  int macro_depth_ = 0;
};

}  // namespace

std::string render_program(const StmtList& program, ScopePtr root) {
  Interpreter interpreter;
  std::string out;
  interpreter.exec_list(program, out, root);
  return out;
}

}  // namespace kiln::jinja
