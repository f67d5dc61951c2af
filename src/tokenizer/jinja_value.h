#pragma once
// The values a chat template computes with. They mirror the Python objects Jinja sees when
// transformers renders a template: None, bool, int, float, str, list (and tuple), dict in
// insertion order, callables (macros and builtins), and Jinja's Undefined. Lists and dicts
// are shared by reference, as in Python, so `ns.items.append(x)` is seen by every holder.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::jinja {

class Value;

struct List {
  std::vector<Value> items;
  bool is_tuple = false;  // only changes how it prints: (1, 2) rather than [1, 2]
};

// Insertion-ordered mapping with string keys (JSON objects and template dict literals).
// A namespace() object is a Dict that templates may assign attributes on.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  bool is_namespace = false;

  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value value);  // replaces in place or appends
};

// Arguments of a call: positional first, then keyword arguments in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`, or nullptr when neither was given.
  const Value* find(size_t index, std::string_view name) const;
  // Same, falling back to `fallback`.
  Value get(size_t index, std::string_view name, const Value& fallback) const;
};

using NativeFunction = std::function<Value(const CallArgs&)>;

struct Callable {
  std::string name;  // for error messages: "macro 'render_tool'", "builtin 'range'"
  NativeFunction call;
};

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

  Value() = default;  // Undefined
  Value(std::nullptr_t) : kind_(Kind::None) {}
  Value(bool b) : kind_(Kind::Bool), bool_(b) {}
  Value(int i) : kind_(Kind::Int), int_(i) {}
  Value(int64_t i) : kind_(Kind::Int), int_(i) {}
  Value(double f) : kind_(Kind::Float), float_(f) {}
  Value(std::string s) : kind_(Kind::String), string_(std::move(s)) {}
  Value(const char* s) : kind_(Kind::String), string_(s) {}
  Value(std::shared_ptr<List> l) : kind_(Kind::List), list_(std::move(l)) {}
  Value(std::shared_ptr<Dict> d) : kind_(Kind::Dict), dict_(std::move(d)) {}
  Value(std::shared_ptr<Callable> c) : kind_(Kind::Callable), callable_(std::move(c)) {}

  static Value undefined(std::string name) {
    Value v;
    v.string_ = std::move(name);
    return v;
  }
  static Value list(std::vector<Value> items = {}, bool is_tuple = false);
  static Value dict();
  static Value function(std::string name, NativeFunction fn);
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_callable() const { return kind_ == Kind::Callable; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const { return int_; }
  double as_double() const { return kind_ == Kind::Float ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return string_; }
  const std::string& undefined_name() const { return string_; }
  List& as_list() const { return *list_; }
  Dict& as_dict() const { return *dict_; }
  const Callable& as_callable() const { return *callable_; }
  const std::shared_ptr<List>& list_ptr() const { return list_; }

  // Python truthiness: empty containers, "", 0, None and Undefined are false.
  bool truthy() const;
  // Python str(): what {{ value }} prints (Undefined prints nothing).
  std::string str() const;
  // Python repr(): how the value looks inside a printed list or dict.
  std::string repr() const;
  // Python's type name, for error messages.
  const char* type_name() const;

  nlohmann::ordered_json to_json() const;

 private:
  Kind kind_ = Kind::Undefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::string string_;  // the string, or the name an Undefined came from
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> callable_;
};

// Python == (1 == 1.0 == True; dicts compare as unordered mappings).
bool values_equal(const Value& a, const Value& b);
// Python <; throws kiln::Error for unorderable types.
bool value_less(const Value& a, const Value& b);
// Python's float repr: shortest round-trip digits, "1.0" for integral values, 1e+16 style
// exponents outside [1e-4, 1e16).
std::string format_python_float(double value);

struct JsonDumpOptions {
  int indent = -1;  // < 0: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python's json.dumps(value, ...), which is what transformers' tojson filter calls.
std::string dump_json(const Value& value, const JsonDumpOptions& options);

// Unicode helpers for str methods: UTF-8 is split into code points for len() and slicing.
std::vector<std::string> utf8_code_points(const std::string& s);
size_t utf8_length(const std::string& s);

}  // namespace kiln::jinja
