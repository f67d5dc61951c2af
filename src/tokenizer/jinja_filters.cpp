// Jinja's built-in filters and tests, with the argument names and defaults of Jinja 3.1
// (tojson follows transformers' override: json.dumps with ensure_ascii=False).
#include <algorithm>
#include <cctype>
#include <cfenv>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"

namespace kiln::jinja {

namespace {

using FilterFn = Value (*)(const Value& input, const CallArgs& args);
using TestFn = bool (*)(const Value& input, const CallArgs& args);

bool arg_flag(const CallArgs& a, size_t i, const char* name, bool fallback) {
  const Value* v = a.find(i, name);
  return v ? v->truthy() : fallback;
}

// Jinja's attribute lookup for filters: "a.b.0" walks dicts and list indices.
Value lookup_attribute_path(const Value& item, const std::string& path) {
  Value current = item;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    current = numeric ? get_item(current, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(current, Value(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return current;
}

// For sort/unique/min/max: the key of an item, lower-cased unless case sensitive.
Value sort_key(const Value& item, const Value& attribute, bool case_sensitive) {
  Value key = attribute.is_string() ? lookup_attribute_path(item, attribute.as_string()) : item;
  if (!case_sensitive && key.is_string()) return Value(py_lower(key.as_string()));
  return key;
}

std::vector<Value> items_of(const Value& v, const char* filter) { return iterate_value(v, filter); }

// ---- filters ----

Value filter_length(const Value& v, const CallArgs&) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return Value(int64_t{0});
    case Value::Kind::String: return Value(static_cast<int64_t>(utf8_length(v.as_string())));
    case Value::Kind::List: return Value(static_cast<int64_t>(v.as_list().items.size()));
    case Value::Kind::Dict: return Value(static_cast<int64_t>(v.as_dict().entries.size()));
    default: fail("object of type '{}' has no len()", v.type_name());
  }
}

Value filter_tojson(const Value& v, const CallArgs& a) {
  JsonDumpOptions o;
  Value indent = a.get(1000, "indent", Value(nullptr));
  if (!a.positional.empty()) indent = a.positional[0];
  if (indent.is_int()) o.indent = static_cast<int>(indent.as_int());
  else if (!indent.is_none()) fail("indent must be an integer or none, not {}", indent.type_name());
  o.ensure_ascii = a.get(1000, "ensure_ascii", Value(false)).truthy();
  o.sort_keys = a.get(1000, "sort_keys", Value(false)).truthy();
  // json.dumps: separators default to (', ', ': '), or (',', ': ') when indenting.
  o.item_separator = o.indent >= 0 ? "," : ", ";
  Value separators = a.get(1000, "separators", Value(nullptr));
  if (separators.is_list()) {
    const auto& s = separators.as_list().items;
    if (s.size() != 2 || !s[0].is_string() || !s[1].is_string()) fail("separators must be two strings");
    o.item_separator = s[0].as_string();
    o.key_separator = s[1].as_string();
  }
  return Value(dump_json(v, o));
}

Value filter_string(const Value& v, const CallArgs&) { return Value(v.str()); }
Value filter_upper(const Value& v, const CallArgs&) { return Value(py_upper(v.str())); }
Value filter_lower(const Value& v, const CallArgs&) { return Value(py_lower(v.str())); }
Value filter_safe(const Value& v, const CallArgs&) { return v; }

Value filter_trim(const Value& v, const CallArgs& a) {
  return Value(py_strip(v.str(), a.get(0, "chars", Value(nullptr)), true, true));
}

Value filter_title(const Value& v, const CallArgs&) {
  // Jinja's title: a word starts after whitespace or one of - ( { [ <.
  std::string s = v.str();
  bool word_start = true;
  for (char& c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (std::isspace(u) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
      word_start = true;
      continue;
    }
    c = static_cast<char>(word_start ? std::toupper(u) : std::tolower(u));
    word_start = false;
  }
  return Value(s);
}

Value filter_capitalize(const Value& v, const CallArgs&) {
  std::string s = py_lower(v.str());
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return Value(s);
}

Value filter_replace(const Value& v, const CallArgs& a) {
  const Value* old = a.find(0, "old");
  const Value* with = a.find(1, "new");
  if (!old || !with) fail("replace needs 'old' and 'new'");
  Value count = a.get(2, "count", Value(nullptr));
  return Value(py_replace(v.str(), old->str(), with->str(), count.is_int() ? count.as_int() : -1));
}

Value filter_join(const Value& v, const CallArgs& a) {
  std::string sep = a.get(0, "d", Value("")).str();
  Value attribute = a.get(1, "attribute", Value(nullptr));
  std::string out;
  bool first = true;
  for (const Value& item : items_of(v, "join")) {
    if (!first) out += sep;
    first = false;
    out += (attribute.is_string() ? lookup_attribute_path(item, attribute.as_string()) : item).str();
  }
  return Value(out);
}

Value filter_first(const Value& v, const CallArgs&) {
  std::vector<Value> items = items_of(v, "first");
  return items.empty() ? Value::undefined("first") : items.front();
}

Value filter_last(const Value& v, const CallArgs&) {
  std::vector<Value> items = items_of(v, "last");
  return items.empty() ? Value::undefined("last") : items.back();
}

Value filter_default(const Value& v, const CallArgs& a) {
  bool boolean = arg_flag(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value(""));
  return v;
}

Value filter_list(const Value& v, const CallArgs&) { return Value::list(items_of(v, "list")); }

Value filter_int(const Value& v, const CallArgs& a) {
  Value fallback = a.get(0, "default", Value(int64_t{0}));
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float()) return Value(static_cast<int64_t>(std::trunc(v.as_double())));
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), Value(nullptr), true, true);
    int base = static_cast<int>(a.get(1, "base", Value(int64_t{10})).as_int());
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (s.empty()) return fallback;
    char* end = nullptr;
    long long i = std::strtoll(s.c_str(), &end, base);
    if (end && *end == '\0') return Value(static_cast<int64_t>(i));
    double d = std::strtod(s.c_str(), &end);  // Jinja falls back to int(float(value))
    if (end && *end == '\0' && std::isfinite(d)) return Value(static_cast<int64_t>(std::trunc(d)));
  }
  return fallback;
}

Value filter_float(const Value& v, const CallArgs& a) {
  Value fallback = a.get(0, "default", Value(0.0));
  if (v.is_number() || v.is_bool()) return Value(v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_double());
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), Value(nullptr), true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value(d);
  }
  return fallback;
}

Value filter_abs(const Value& v, const CallArgs&) {
  if (v.is_int()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  fail("bad operand type for abs(): '{}'", v.type_name());
}

Value filter_round(const Value& v, const CallArgs& a) {
  int64_t precision = a.get(0, "precision", Value(int64_t{0})).as_int();
  std::string method = a.get(1, "method", Value("common")).str();
  if (!v.is_number() && !v.is_bool()) fail("round needs a number, not {}", v.type_name());
  if (method == "common" && (v.is_int() || v.is_bool()) && precision >= 0) return v.is_bool() ? Value(int64_t{v.as_bool()}) : v;
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.is_bool() ? v.as_bool() : v.as_double();
  double r;
  if (method == "common") r = std::nearbyint(x * scale) / scale;  // Python rounds half to even
  else if (method == "ceil") r = std::ceil(x * scale) / scale;
  else if (method == "floor") r = std::floor(x * scale) / scale;
  else fail("method must be common, ceil or floor, not '{}'", method);
  return Value(r);
}

Value filter_items(const Value& v, const CallArgs&) {
  if (v.is_undefined()) return Value::list();
  if (!v.is_dict()) fail("items needs a mapping, not {}", v.type_name());
  std::vector<Value> out;
  for (const auto& [k, item] : v.as_dict().entries) out.push_back(Value::list({Value(k), item}, true));
  return Value::list(std::move(out));
}

// select/reject/selectattr/rejectattr share one walk: keep items whose (attribute's) test
// result equals `keep`.
Value select_items(const Value& v, const CallArgs& a, bool by_attribute, bool keep, const char* name) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (a.positional.empty() || !a.positional[0].is_string()) fail("{} needs an attribute name", name);
    attribute = a.positional[next++].as_string();
  }
  std::string test;
  if (next < a.positional.size()) test = a.positional[next++].str();
  CallArgs test_args;
  test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(next), a.positional.end());
  std::vector<Value> out;
  for (const Value& item : items_of(v, name)) {
    Value subject = by_attribute ? lookup_attribute_path(item, attribute) : item;
    bool passed = test.empty() ? subject.truthy() : apply_test(test, subject, test_args);
    if (passed == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value filter_select(const Value& v, const CallArgs& a) { return select_items(v, a, false, true, "select"); }
Value filter_reject(const Value& v, const CallArgs& a) { return select_items(v, a, false, false, "reject"); }
Value filter_selectattr(const Value& v, const CallArgs& a) { return select_items(v, a, true, true, "selectattr"); }
Value filter_rejectattr(const Value& v, const CallArgs& a) { return select_items(v, a, true, false, "rejectattr"); }

Value filter_map(const Value& v, const CallArgs& a) {
  std::vector<Value> out;
  if (const Value* attribute = a.find(1000, "attribute")) {
    Value fallback = a.get(1000, "default", Value::undefined("default"));
    for (const Value& item : items_of(v, "map")) {
      Value got = lookup_attribute_path(item, attribute->str());
      out.push_back(got.is_undefined() && !fallback.is_undefined() ? fallback : got);
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty()) fail("map needs a filter name or attribute=");
  std::string filter = a.positional[0].str();
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& item : items_of(v, "map")) out.push_back(apply_filter(filter, item, rest));
  return Value::list(std::move(out));
}

Value filter_unique(const Value& v, const CallArgs& a) {
  bool case_sensitive = arg_flag(a, 0, "case_sensitive", false);
  Value attribute = a.get(1, "attribute", Value(nullptr));
  std::vector<Value> out, seen;
  for (const Value& item : items_of(v, "unique")) {
    Value key = sort_key(item, attribute, case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value filter_sort(const Value& v, const CallArgs& a) {
  bool reverse = arg_flag(a, 0, "reverse", false);
  bool case_sensitive = arg_flag(a, 1, "case_sensitive", false);
  Value attribute = a.get(2, "attribute", Value(nullptr));
  std::vector<Value> items = items_of(v, "sort");
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(x, attribute, case_sensitive), ky = sort_key(y, attribute, case_sensitive);
    return reverse ? value_less(ky, kx) : value_less(kx, ky);
  });
  return Value::list(std::move(items));
}

Value filter_reverse(const Value& v, const CallArgs&) {
  if (v.is_string()) {
    std::vector<std::string> chars = utf8_code_points(v.as_string());
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
    return Value(out);
  }
  std::vector<Value> items = items_of(v, "reverse");
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value filter_dictsort(const Value& v, const CallArgs& a) {
  if (!v.is_dict()) fail("dictsort needs a mapping, not {}", v.type_name());
  bool case_sensitive = arg_flag(a, 0, "case_sensitive", false);
  std::string by = a.get(1, "by", Value("key")).str();
  bool reverse = arg_flag(a, 2, "reverse", false);
  if (by != "key" && by != "value") fail("dictsort: 'by' must be 'key' or 'value'");
  size_t pos = by == "key" ? 0 : 1;
  std::vector<Value> pairs = filter_items(v, CallArgs{}).as_list().items;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(x.as_list().items[pos], Value(nullptr), case_sensitive);
    Value ky = sort_key(y.as_list().items[pos], Value(nullptr), case_sensitive);
    return reverse ? value_less(ky, kx) : value_less(kx, ky);
  });
  return Value::list(std::move(pairs));
}

Value filter_indent(const Value& v, const CallArgs& a) {
  Value width = a.get(0, "width", Value(int64_t{4}));
  std::string pad = width.is_string() ? width.as_string() : std::string(static_cast<size_t>(width.as_int()), ' ');
  bool first = arg_flag(a, 1, "first", false);
  bool blank = arg_flag(a, 2, "blank", false);
  std::string s = v.str() + "\n";  // Jinja appends a newline before splitting into lines
  std::vector<std::string> lines;
  for (size_t start = 0; start < s.size();) {
    size_t nl = s.find('\n', start);
    lines.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) out += "\n" + ((blank || !lines[i].empty()) ? pad + lines[i] : lines[i]);
  return Value(first ? pad + out : out);
}

Value filter_escape(const Value& v, const CallArgs&) {
  std::string out;
  for (char c : v.str()) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value(out);
}

Value filter_wordcount(const Value& v, const CallArgs&) {
  int64_t words = 0;
  bool in_word = false;
  for (char c : v.str()) {
    unsigned char u = static_cast<unsigned char>(c);
    bool word_char = std::isalnum(u) || c == '_' || u >= 0x80;
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value(words);
}

Value filter_batch(const Value& v, const CallArgs& a) {
  const Value* size = a.find(0, "linecount");
  if (!size || !size->is_int() || size->as_int() <= 0) fail("batch needs a positive linecount");
  Value fill = a.get(1, "fill_with", Value(nullptr));
  std::vector<Value> out, current;
  for (const Value& item : items_of(v, "batch")) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == size->as_int()) {
      out.push_back(Value::list(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    if (!fill.is_none())
      while (static_cast<int64_t>(current.size()) < size->as_int()) current.push_back(fill);
    out.push_back(Value::list(std::move(current)));
  }
  return Value::list(std::move(out));
}

Value filter_sum(const Value& v, const CallArgs& a) {
  Value attribute = a.get(0, "attribute", Value(nullptr));
  Value total = a.get(1, "start", Value(int64_t{0}));
  for (const Value& item : items_of(v, "sum")) {
    Value x = attribute.is_string() ? lookup_attribute_path(item, attribute.as_string()) : item;
    if (!x.is_number() && !x.is_bool()) fail("sum: cannot add '{}'", x.type_name());
    if (total.is_int() && (x.is_int() || x.is_bool())) total = Value(total.as_int() + (x.is_bool() ? x.as_bool() : x.as_int()));
    else total = Value(total.as_double() + (x.is_bool() ? x.as_bool() : x.as_double()));
  }
  return total;
}

Value min_or_max(const Value& v, const CallArgs& a, bool want_max) {
  bool case_sensitive = arg_flag(a, 0, "case_sensitive", false);
  Value attribute = a.get(1, "attribute", Value(nullptr));
  std::vector<Value> items = items_of(v, want_max ? "max" : "min");
  if (items.empty()) return Value::undefined(want_max ? "max" : "min");
  Value best = items[0];
  for (size_t i = 1; i < items.size(); ++i) {
    Value kb = sort_key(best, attribute, case_sensitive), ki = sort_key(items[i], attribute, case_sensitive);
    if (want_max ? value_less(kb, ki) : value_less(ki, kb)) best = items[i];
  }
  return best;
}
Value filter_max(const Value& v, const CallArgs& a) { return min_or_max(v, a, true); }
Value filter_min(const Value& v, const CallArgs& a) { return min_or_max(v, a, false); }

Value filter_attr(const Value& v, const CallArgs& a) {
  const Value* name = a.find(0, "name");
  if (!name) fail("attr needs a name");
  return get_attribute(v, name->str());
}

// Python's "%s" % args for the common conversions (%s %r %d %i %f %%).
Value filter_format(const Value& v, const CallArgs& a) {
  std::string fmt_string = v.str(), out;
  size_t next = 0;
  for (size_t i = 0; i < fmt_string.size(); ++i) {
    if (fmt_string[i] != '%' || i + 1 >= fmt_string.size()) {
      out += fmt_string[i];
      continue;
    }
    char conv = fmt_string[++i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= a.positional.size()) fail("format: not enough arguments for the format string");
    const Value& arg = a.positional[next++];
    if (conv == 's') out += arg.str();
    else if (conv == 'r') out += arg.repr();
    else if (conv == 'd' || conv == 'i') out += std::to_string(arg.is_float() ? static_cast<int64_t>(arg.as_double()) : arg.as_int());
    else if (conv == 'f') out += fmt::format("{:.6f}", arg.as_double());
    else fail("format: unsupported conversion '%{}'", conv);
  }
  return Value(out);
}

// ---- tests ----

bool test_defined(const Value& v, const CallArgs&) { return !v.is_undefined(); }
bool test_undefined(const Value& v, const CallArgs&) { return v.is_undefined(); }
bool test_none(const Value& v, const CallArgs&) { return v.is_none(); }
bool test_string(const Value& v, const CallArgs&) { return v.is_string(); }
bool test_number(const Value& v, const CallArgs&) { return v.is_number() || v.is_bool(); }
bool test_integer(const Value& v, const CallArgs&) { return v.is_int(); }
bool test_float(const Value& v, const CallArgs&) { return v.is_float(); }
bool test_boolean(const Value& v, const CallArgs&) { return v.is_bool(); }
bool test_true(const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); }
bool test_false(const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool test_mapping(const Value& v, const CallArgs&) { return v.is_dict() && !v.as_dict().is_namespace; }
bool test_iterable(const Value& v, const CallArgs&) { return v.is_list() || v.is_dict() || v.is_string(); }
bool test_sequence(const Value& v, const CallArgs&) { return v.is_list() || v.is_dict() || v.is_string(); }
bool test_callable(const Value& v, const CallArgs&) { return v.is_callable(); }
bool test_escaped(const Value&, const CallArgs&) { return false; }

int64_t integer_for_test(const Value& v, const char* test) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  fail("test '{}' needs an integer, not {}", test, v.type_name());
}
bool test_odd(const Value& v, const CallArgs&) { return integer_for_test(v, "odd") % 2 != 0; }
bool test_even(const Value& v, const CallArgs&) { return integer_for_test(v, "even") % 2 == 0; }
bool test_divisibleby(const Value& v, const CallArgs& a) {
  const Value* n = a.find(0, "num");
  if (!n || !n->is_int() || n->as_int() == 0) fail("divisibleby needs a non-zero integer");
  return integer_for_test(v, "divisibleby") % n->as_int() == 0;
}

const Value& test_operand(const CallArgs& a, const char* test) {
  const Value* other = a.find(0, "other");
  if (!other) fail("test '{}' needs an argument", test);
  return *other;
}
bool test_eq(const Value& v, const CallArgs& a) { return values_equal(v, test_operand(a, "eq")); }
bool test_ne(const Value& v, const CallArgs& a) { return !values_equal(v, test_operand(a, "ne")); }
bool test_lt(const Value& v, const CallArgs& a) { return value_less(v, test_operand(a, "lt")); }
bool test_gt(const Value& v, const CallArgs& a) { return value_less(test_operand(a, "gt"), v); }
bool test_le(const Value& v, const CallArgs& a) { return !value_less(test_operand(a, "le"), v); }
bool test_ge(const Value& v, const CallArgs& a) { return !value_less(v, test_operand(a, "ge")); }
bool test_sameas(const Value& v, const CallArgs& a) {
  const Value& o = test_operand(a, "sameas");
  if (v.kind() != o.kind()) return false;
  if (v.is_list()) return v.list_ptr() == o.list_ptr();
  if (v.is_dict()) return &v.as_dict() == &o.as_dict();
  return values_equal(v, o);
}
bool test_in(const Value& v, const CallArgs& a) {
  const Value& seq = test_operand(a, "in");
  if (seq.is_string()) return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
  if (seq.is_dict()) return seq.as_dict().find(v.str()) != nullptr;
  for (const Value& item : iterate_value(seq, "in"))
    if (values_equal(item, v)) return true;
  return false;
}
bool test_lower(const Value& v, const CallArgs&) {
  return v.is_string() && py_lower(v.as_string()) == v.as_string() && py_upper(v.as_string()) != v.as_string();
}
bool test_upper(const Value& v, const CallArgs&) {
  return v.is_string() && py_upper(v.as_string()) == v.as_string() && py_lower(v.as_string()) != v.as_string();
}

const std::unordered_map<std::string, FilterFn>& filter_table() {
  static const std::unordered_map<std::string, FilterFn> table = {
      {"abs", filter_abs},           {"attr", filter_attr},         {"batch", filter_batch},
      {"capitalize", filter_capitalize}, {"count", filter_length}, {"d", filter_default},
      {"default", filter_default},   {"dictsort", filter_dictsort}, {"e", filter_escape},
      {"escape", filter_escape},     {"first", filter_first},       {"float", filter_float},
      {"format", filter_format},     {"indent", filter_indent},     {"int", filter_int},
      {"items", filter_items},       {"join", filter_join},         {"last", filter_last},
      {"length", filter_length},     {"list", filter_list},         {"lower", filter_lower},
      {"map", filter_map},           {"max", filter_max},           {"min", filter_min},
      {"reject", filter_reject},     {"rejectattr", filter_rejectattr}, {"replace", filter_replace},
      {"reverse", filter_reverse},   {"round", filter_round},       {"safe", filter_safe},
      {"select", filter_select},     {"selectattr", filter_selectattr}, {"sort", filter_sort},
      {"string", filter_string},     {"sum", filter_sum},           {"title", filter_title},
      {"tojson", filter_tojson},     {"trim", filter_trim},         {"unique", filter_unique},
      {"upper", filter_upper},       {"wordcount", filter_wordcount},
  };
  return table;
}

const std::unordered_map<std::string, TestFn>& test_table() {
  static const std::unordered_map<std::string, TestFn> table = {
      {"boolean", test_boolean}, {"callable", test_callable}, {"defined", test_defined},
      {"divisibleby", test_divisibleby}, {"eq", test_eq},     {"equalto", test_eq},
      {"==", test_eq},           {"escaped", test_escaped},   {"even", test_even},
      {"false", test_false},     {"float", test_float},       {"ge", test_ge},
      {">=", test_ge},           {"gt", test_gt},             {">", test_gt},
      {"greaterthan", test_gt},  {"in", test_in},             {"integer", test_integer},
      {"iterable", test_iterable}, {"le", test_le},           {"<=", test_le},
      {"lower", test_lower},     {"lt", test_lt},             {"<", test_lt},
      {"lessthan", test_lt},     {"mapping", test_mapping},   {"ne", test_ne},
      {"!=", test_ne},           {"none", test_none},         {"number", test_number},
      {"odd", test_odd},         {"sameas", test_sameas},     {"sequence", test_sequence},
      {"string", test_string},   {"true", test_true},         {"undefined", test_undefined},
      {"upper", test_upper},
  };
  return table;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& input, const CallArgs& args) {
  auto it = filter_table().find(name);
  if (it == filter_table().end()) fail("no filter named '{}'", name);
  return it->second(input, args);
}

bool apply_test(const std::string& name, const Value& input, const CallArgs& args) {
  auto it = test_table().find(name);
  if (it == test_table().end()) fail("no test named '{}'", name);
  return it->second(input, args);
}

}  // namespace kiln::jinja
