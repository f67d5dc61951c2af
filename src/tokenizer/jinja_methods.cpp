// Attribute, item and slice access, and the Python methods of str, list and dict that chat
// templates call (message.content.strip(), tool.items(), ns.parts.append(x)).
#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"

namespace kiln::jinja {

namespace {

bool is_py_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); }

const std::string& string_arg(const CallArgs& a, size_t i, const char* name, const char* method) {
  const Value* v = a.find(i, name);
  if (!v || !v->is_string()) fail("{}() needs a string argument '{}'", method, name);
  return v->as_string();
}

int64_t int_arg(const CallArgs& a, size_t i, const char* name, int64_t fallback) {
  const Value* v = a.find(i, name);
  if (!v || v->is_none() || v->is_undefined()) return fallback;
  if (!v->is_int()) fail("argument '{}' must be an integer, not {}", name, v->type_name());
  return v->as_int();
}

// Python str.split / rsplit: with no separator, splits on whitespace runs and drops empties.
Value py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < s.size();) {
      while (i < s.size() && is_py_space(s[i])) ++i;
      size_t start = i;
      while (i < s.size() && !is_py_space(s[i])) ++i;
      if (i > start) words.emplace_back(start, i);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (from_right) {
        size_t keep_from = words.size() - static_cast<size_t>(maxsplit);
        std::string head = s.substr(0, words[keep_from - 1].second);
        head.erase(0, words[0].first);
        parts.push_back(head);
        for (size_t k = keep_from; k < words.size(); ++k)
          parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
      } else {
        for (size_t k = 0; k < static_cast<size_t>(maxsplit); ++k)
          parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
        std::string tail = s.substr(words[static_cast<size_t>(maxsplit)].first);
        while (!tail.empty() && is_py_space(tail.back())) tail.pop_back();
        parts.push_back(tail);
      }
    } else {
      for (auto [b, e] : words) parts.push_back(s.substr(b, e - b));
    }
  } else {
    if (!sep.is_string()) fail("split() separator must be a string, not {}", sep.type_name());
    const std::string& d = sep.as_string();
    if (d.empty()) fail("split(): empty separator");
    if (!from_right) {
      size_t start = 0;
      for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
        size_t at = s.find(d, start);
        if (at == std::string::npos) break;
        parts.push_back(s.substr(start, at - start));
        start = at + d.size();
      }
      parts.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
        if (end < d.size()) break;
        size_t at = s.rfind(d, end - d.size());
        if (at == std::string::npos) break;
        parts.push_back(s.substr(at + d.size(), end - at - d.size()));
        end = at;
      }
      parts.push_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
  }
  std::vector<Value> items;
  for (std::string& p : parts) items.emplace_back(std::move(p));
  return Value::list(std::move(items));
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& v) {
    if (!v.is_string()) fail("{}() argument must be str or a tuple of str", prefix ? "startswith" : "endswith");
    const std::string& a = v.as_string();
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_list()) {
    for (const Value& v : affix.as_list().items)
      if (one(v)) return true;
    return false;
  }
  return one(affix);
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_letter = false;
  for (char& c : out) {
    bool letter = std::isalpha(static_cast<unsigned char>(c));
    if (letter) c = static_cast<char>(prev_letter ? std::tolower(c) : std::toupper(c));
    prev_letter = letter;
  }
  return out;
}

template <typename Pred>
bool all_chars(const std::string& s, Pred pred) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)); });
}

Value string_method(const std::string& s, const std::string& name) {
  auto method = [&](NativeFunction fn) { return Value::function("str." + name, std::move(fn)); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    return method([s, left, right](const CallArgs& a) {
      return Value(py_strip(s, a.get(0, "chars", Value(nullptr)), left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    bool from_right = name == "rsplit";
    return method([s, from_right](const CallArgs& a) {
      return py_split(s, a.get(0, "sep", Value(nullptr)), int_arg(a, 1, "maxsplit", -1), from_right);
    });
  }
  if (name == "splitlines")
    return method([s](const CallArgs&) {
      std::vector<Value> lines;
      size_t start = 0;
      while (start < s.size()) {
        size_t nl = s.find('\n', start);
        if (nl == std::string::npos) nl = s.size();
        std::string line = s.substr(start, nl - start);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.emplace_back(std::move(line));
        start = nl + 1;
      }
      return Value::list(std::move(lines));
    });
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return method([s, prefix](const CallArgs& a) {
      if (a.positional.empty()) fail("{}() takes at least 1 argument", prefix ? "startswith" : "endswith");
      return Value(affix_matches(s, a.positional[0], prefix));
    });
  }
  if (name == "upper") return method([s](const CallArgs&) { return Value(py_upper(s)); });
  if (name == "lower") return method([s](const CallArgs&) { return Value(py_lower(s)); });
  if (name == "title") return method([s](const CallArgs&) { return Value(py_title(s)); });
  if (name == "capitalize")
    return method([s](const CallArgs&) {
      std::string out = py_lower(s);
      if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
      return Value(out);
    });
  if (name == "replace")
    return method([s](const CallArgs& a) {
      return Value(py_replace(s, string_arg(a, 0, "old", "replace"), string_arg(a, 1, "new", "replace"),
                              int_arg(a, 2, "count", -1)));
    });
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    std::string which = name;
    return method([s, which](const CallArgs& a) {
      const std::string& sub = string_arg(a, 0, "sub", which.c_str());
      if (which == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value(n);
      }
      size_t at = which == "rfind" ? s.rfind(sub) : s.find(sub);
      if (at == std::string::npos) {
        if (which == "index") fail("substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(utf8_length(s.substr(0, at))));
    });
  }
  if (name == "join")
    return method([s](const CallArgs& a) {
      if (a.positional.empty()) fail("join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const Value& v : iterate_value(a.positional[0], "str.join")) {
        if (!v.is_string()) fail("join(): expected str items, found {}", v.type_name());
        if (!first) out += s;
        first = false;
        out += v.as_string();
      }
      return Value(out);
    });
  if (name == "isdigit") return method([s](const CallArgs&) { return Value(all_chars(s, ::isdigit)); });
  if (name == "isalpha") return method([s](const CallArgs&) { return Value(all_chars(s, ::isalpha)); });
  if (name == "isalnum") return method([s](const CallArgs&) { return Value(all_chars(s, ::isalnum)); });
  if (name == "isspace") return method([s](const CallArgs&) { return Value(all_chars(s, ::isspace)); });
  if (name == "islower")
    return method([s](const CallArgs&) {
      return Value(py_lower(s) == s && py_upper(s) != s);
    });
  if (name == "isupper")
    return method([s](const CallArgs&) {
      return Value(py_upper(s) == s && py_lower(s) != s);
    });
  return Value::undefined(name);
}

Value list_method(const Value& list, const std::string& name) {
  std::shared_ptr<List> l = list.list_ptr();
  auto method = [&](NativeFunction fn) { return Value::function("list." + name, std::move(fn)); };
  if (name == "append")
    return method([l](const CallArgs& a) {
      if (a.positional.size() != 1) fail("append() takes exactly one argument");
      l->items.push_back(a.positional[0]);
      return Value(nullptr);
    });
  if (name == "extend")
    return method([l](const CallArgs& a) {
      if (a.positional.size() != 1) fail("extend() takes exactly one argument");
      for (const Value& v : iterate_value(a.positional[0], "list.extend")) l->items.push_back(v);
      return Value(nullptr);
    });
  if (name == "insert")
    return method([l](const CallArgs& a) {
      int64_t n = static_cast<int64_t>(l->items.size());
      int64_t i = int_arg(a, 0, "index", 0);
      if (i < 0) i = std::max<int64_t>(0, i + n);
      i = std::min(i, n);
      l->items.insert(l->items.begin() + i, a.get(1, "object", Value(nullptr)));
      return Value(nullptr);
    });
  if (name == "pop")
    return method([l](const CallArgs& a) {
      int64_t n = static_cast<int64_t>(l->items.size());
      int64_t i = int_arg(a, 0, "index", -1);
      if (i < 0) i += n;
      if (i < 0 || i >= n) fail("pop index out of range");
      Value v = l->items[static_cast<size_t>(i)];
      l->items.erase(l->items.begin() + i);
      return v;
    });
  if (name == "index" || name == "count")
    return method([l, name](const CallArgs& a) {
      if (a.positional.empty()) fail("{}() takes at least one argument", name);
      int64_t n = 0;
      for (size_t i = 0; i < l->items.size(); ++i) {
        if (!values_equal(l->items[i], a.positional[0])) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") fail("value is not in list");
      return Value(n);
    });
  if (name == "copy") return method([l](const CallArgs&) { return Value::list(l->items, l->is_tuple); });
  return Value::undefined(name);
}

Value dict_method(const Value& dict, const std::string& name) {
  Dict* d = &dict.as_dict();
  Value keep = dict;  // keeps the dict alive inside the method
  auto method = [&](NativeFunction fn) { return Value::function("dict." + name, std::move(fn)); };
  if (name == "items")
    return method([d, keep](const CallArgs&) {
      std::vector<Value> items;
      for (const auto& [k, v] : d->entries) items.push_back(Value::list({Value(k), v}, true));
      return Value::list(std::move(items));
    });
  if (name == "keys")
    return method([d, keep](const CallArgs&) {
      std::vector<Value> items;
      for (const auto& [k, v] : d->entries) items.emplace_back(k);
      return Value::list(std::move(items));
    });
  if (name == "values")
    return method([d, keep](const CallArgs&) {
      std::vector<Value> items;
      for (const auto& [k, v] : d->entries) items.push_back(v);
      return Value::list(std::move(items));
    });
  if (name == "get")
    return method([d, keep](const CallArgs& a) {
      if (a.positional.empty()) fail("get() takes at least one argument");
      const Value* v = d->find(a.positional[0].str());
      return v ? *v : a.get(1, "default", Value(nullptr));
    });
  if (name == "copy")
    return method([d, keep](const CallArgs&) {
      auto copy = std::make_shared<Dict>();
      copy->entries = d->entries;
      return Value(std::move(copy));
    });
  if (name == "update")
    return method([d, keep](const CallArgs& a) {
      for (const Value& other : a.positional) {
        if (!other.is_dict()) fail("update() takes a dict, not {}", other.type_name());
        for (const auto& [k, v] : other.as_dict().entries) d->set(k, v);
      }
      for (const auto& [k, v] : a.keyword) d->set(k, v);
      return Value(nullptr);
    });
  if (name == "pop")
    return method([d, keep](const CallArgs& a) {
      if (a.positional.empty()) fail("pop() takes at least one argument");
      std::string key = a.positional[0].str();
      for (auto it = d->entries.begin(); it != d->entries.end(); ++it) {
        if (it->first != key) continue;
        Value v = it->second;
        d->entries.erase(it);
        return v;
      }
      if (a.positional.size() > 1) return a.positional[1];
      fail("pop(): key '{}' not found", key);
    });
  return Value::undefined(name);
}

// Python's slice.indices(n) followed by the walk it describes.
std::vector<size_t> slice_positions(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto given = [](const Value& v) { return !v.is_none() && !v.is_undefined(); };
  for (const Value* v : {&start_v, &stop_v, &step_v})
    if (given(*v) && !v->is_int()) fail("slice indices must be integers or None, not {}", v->type_name());
  int64_t step = given(step_v) ? step_v.as_int() : 1;
  if (step == 0) fail("slice step cannot be zero");
  int64_t lower = step > 0 ? 0 : -1;
  int64_t upper = step > 0 ? n : n - 1;
  auto bound = [&](const Value& v, int64_t fallback) {
    if (!given(v)) return fallback;
    int64_t i = v.as_int();
    if (i < 0) return std::max(i + n, lower);
    return std::min(i, upper);
  };
  int64_t start = bound(start_v, step > 0 ? lower : upper);
  int64_t stop = bound(stop_v, step > 0 ? upper : lower);
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(static_cast<size_t>(i));
  return out;
}

}  // namespace

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto strip_char = [&](char c) {
    if (chars.is_none() || chars.is_undefined()) return is_py_space(c);
    return chars.as_string().find(c) != std::string::npos;
  };
  if (!chars.is_none() && !chars.is_undefined() && !chars.is_string())
    fail("strip arg must be None or str, not {}", chars.type_name());
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && strip_char(s[b])) ++b;
  if (right)
    while (e > b && strip_char(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string py_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string py_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  if (old.empty()) {  // Python inserts `with` between every character
    std::string out;
    int64_t n = 0;
    for (const std::string& cp : utf8_code_points(s)) {
      if (count < 0 || n++ < count) out += with;
      out += cp;
    }
    if (count < 0 || n < count) out += with;
    return out;
  }
  std::string out;
  size_t start = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start) + with;
    start = at + old.size();
  }
  return out + s.substr(start);
}

Value get_attribute(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::String: return string_method(object.as_string(), name);
    case Value::Kind::List: return list_method(object, name);
    case Value::Kind::Dict: {
      if (!object.as_dict().is_namespace) {
        Value m = dict_method(object, name);
        if (!m.is_undefined()) return m;
      }
      const Value* v = object.as_dict().find(name);
      return v ? *v : Value::undefined(name);
    }
    default: return Value::undefined(name);  // Undefined, None, numbers: no such attribute
  }
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_dict()) {
    const Value* v = object.as_dict().find(key.is_string() ? key.as_string() : key.str());
    if (v) return *v;
    return key.is_string() ? get_attribute(object, key.as_string()) : Value::undefined(key.str());
  }
  if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
    if (object.is_list()) {
      int64_t n = static_cast<int64_t>(object.as_list().items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("[" + key.str() + "]");
      return object.as_list().items[static_cast<size_t>(i)];
    }
    std::vector<std::string> chars = utf8_code_points(object.as_string());
    int64_t n = static_cast<int64_t>(chars.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("[" + key.str() + "]");
    return Value(chars[static_cast<size_t>(i)]);
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Value::undefined(key.str());
}

Value slice_value(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_list()) {
    const auto& items = object.as_list().items;
    std::vector<Value> out;
    for (size_t i : slice_positions(static_cast<int64_t>(items.size()), start, stop, step)) out.push_back(items[i]);
    return Value::list(std::move(out), object.as_list().is_tuple);
  }
  if (object.is_string()) {
    std::vector<std::string> chars = utf8_code_points(object.as_string());
    std::string out;
    for (size_t i : slice_positions(static_cast<int64_t>(chars.size()), start, stop, step)) out += chars[i];
    return Value(out);
  }
  if (object.is_undefined()) return object;
  fail("'{}' object is not subscriptable", object.type_name());
}

std::vector<Value> iterate_value(const Value& v, const char* what) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.as_list().items;
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& [k, item] : v.as_dict().entries) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      for (std::string& c : utf8_code_points(v.as_string())) chars.emplace_back(std::move(c));
      return chars;
    }
    default: fail("{}: '{}' object is not iterable", what, v.type_name());
  }
}

void add_builtin_globals(std::unordered_map<std::string, Value>& globals) {
  globals["range"] = Value::function("range", [](const CallArgs& a) {
    if (a.positional.empty() || a.positional.size() > 3) fail("range expected 1 to 3 arguments");
    for (const Value& v : a.positional)
      if (!v.is_int()) fail("range() arguments must be integers, not {}", v.type_name());
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) {
      stop = a.positional[0].as_int();
    } else {
      start = a.positional[0].as_int();
      stop = a.positional[1].as_int();
      if (a.positional.size() == 3) step = a.positional[2].as_int();
    }
    if (step == 0) fail("range() step must not be zero");
    std::vector<Value> items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (items.size() >= 1000000) fail("range() is too long");
      items.emplace_back(i);
    }
    return Value::list(std::move(items));
  });
  auto make_dict = [](const CallArgs& a, bool is_namespace) {
    auto d = std::make_shared<Dict>();
    d->is_namespace = is_namespace;
    for (const Value& init : a.positional) {
      if (!init.is_dict()) fail("expected a mapping, got {}", init.type_name());
      for (const auto& [k, v] : init.as_dict().entries) d->set(k, v);
    }
    for (const auto& [k, v] : a.keyword) d->set(k, v);
    return Value(std::move(d));
  };
  globals["namespace"] = Value::function("namespace", [make_dict](const CallArgs& a) { return make_dict(a, true); });
  globals["dict"] = Value::function("dict", [make_dict](const CallArgs& a) { return make_dict(a, false); });
}

}  // namespace kiln::jinja
