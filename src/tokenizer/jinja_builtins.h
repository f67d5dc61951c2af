#pragma once
// Jinja's built-in behaviour on values: attribute and item access (with Python's str, list
// and dict methods), slicing, iteration, filters, tests and global functions. Each throws
// kiln::Error with a message naming the filter, test or method that refused.
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace kiln::jinja {

// obj.name: Python attribute first (methods such as dict.items, str.strip), then the dict key.
// A missing attribute is Undefined, as in Jinja.
Value get_attribute(const Value& object, const std::string& name);
// obj[key]: the item first, then the attribute of that name; missing is Undefined.
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] on lists, tuples and strings (each bound may be None/Undefined).
Value slice_value(const Value& object, const Value& start, const Value& stop, const Value& step);
// The items a for loop (or a filter) walks: list items, dict keys, string characters;
// Undefined walks nothing. `what` names the construct for the error on other types.
std::vector<Value> iterate_value(const Value& v, const char* what);

// value | name(args)
Value apply_filter(const std::string& name, const Value& input, const CallArgs& args);
// value is name(args)
bool apply_test(const std::string& name, const Value& input, const CallArgs& args);

// range, namespace, dict: the globals every template sees.
void add_builtin_globals(std::unordered_map<std::string, Value>& globals);

// Python str methods shared by filters and methods.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
std::string py_upper(std::string s);
std::string py_lower(std::string s);
std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count);

}  // namespace kiln::jinja
