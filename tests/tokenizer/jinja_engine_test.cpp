// Unit tests of the Jinja subset: each expected string is worked out by hand from Jinja2 /
// Python semantics, never produced by this engine.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/jinja_template.h"
#include "tokenizer/jinja_value.h"

namespace kiln::jinja {
namespace {

using Json = nlohmann::ordered_json;

std::string render(const std::string& source, const Json& vars = Json::object(), bool hf_whitespace = false) {
  TemplateOptions options;
  options.trim_blocks = hf_whitespace;
  options.lstrip_blocks = hf_whitespace;
  Template t(source, options);
  std::unordered_map<std::string, Value> values;
  for (const auto& [k, v] : vars.items()) values[k] = Value::from_json(v);
  return t.render(values);
}

// The message of the kiln::Error that rendering throws ("" when it does not throw).
std::string error_of(const std::string& source, const Json& vars = Json::object()) {
  try {
    render(source, vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaEngine, TextVariablesAndComments) {
  EXPECT_EQ(render("Hello {{ name }}!", {{"name", "World"}}), "Hello World!");
  EXPECT_EQ(render("a{# hidden {{ x }} #}b"), "ab");
  EXPECT_EQ(render("no tags at all"), "no tags at all");
  EXPECT_EQ(render(""), "");
}

TEST(JinjaEngine, LiteralsPrintLikePython) {
  EXPECT_EQ(render("{{ 1 }} {{ 1.5 }} {{ 2.0 }} {{ true }} {{ False }} {{ none }} {{ 'x' }}"),
            "1 1.5 2.0 True False None x");
  EXPECT_EQ(render("{{ [1, 'a', none, 2.5] }}"), "[1, 'a', None, 2.5]");
  EXPECT_EQ(render("{{ {'k': 1, 'j': [true]} }}"), "{'k': 1, 'j': [True]}");
  EXPECT_EQ(render("{{ (1, 2) }} {{ (1,) }} {{ () }}"), "(1, 2) (1,) ()");
  EXPECT_EQ(render("{{ \"it's\" }} {{ [\"it's\"] }}"), "it's [\"it's\"]");
}

TEST(JinjaEngine, StringLiteralEscapes) {
  EXPECT_EQ(render("{{ 'a\\nb\\t\\'q\\'' }}"), "a\nb\t'q'");
  EXPECT_EQ(render("{{ \"\\u00e9\\x41\\101\" }}"), "\xc3\xa9" "AA");
  EXPECT_EQ(render("{{ 'a' 'b' }}"), "ab");
  EXPECT_EQ(render("{{ '\\d' }}"), "\\d");  // unknown escapes stay as written
}

TEST(JinjaEngine, FloatRepr) {
  EXPECT_EQ(format_python_float(0.1), "0.1");
  EXPECT_EQ(format_python_float(100.0), "100.0");
  EXPECT_EQ(format_python_float(1e16), "1e+16");
  EXPECT_EQ(format_python_float(1e15), "1000000000000000.0");
  EXPECT_EQ(format_python_float(1.5e-5), "1.5e-05");
  EXPECT_EQ(format_python_float(0.0001), "0.0001");
  EXPECT_EQ(format_python_float(-2.5), "-2.5");
  EXPECT_EQ(format_python_float(123456789.125), "123456789.125");
}

TEST(JinjaEngine, Arithmetic) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"),
            "3 -4 1 2 3.5 1024");
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 4 / 2 }} {{ 1.5 + 1 }} {{ -(3) }}"), "7 9 2.0 2.5 -3");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }} {{ 'ab' + 'cd' }} {{ [1] + [2] }} {{ 'ab' * 2 }}"), "a1None abcd [1, 2] abab");
  EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
}

TEST(JinjaEngine, ComparisonsAndLogic) {
  EXPECT_EQ(render("{{ 1 < 2 and 2 <= 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ not true or false }}"),
            "True True True False");
  EXPECT_EQ(render("{{ 0 or 'x' }} {{ 1 and 2 }} {{ '' and 3 }}|"), "x 2 |");
  EXPECT_EQ(render("{{ 3 > 2 > 1 }} {{ 1 < 3 < 2 }}"), "True False");  // chained as in Python
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1, 2] }}"),
            "True True True True");
  EXPECT_EQ(render("{{ 'yes' if x else 'no' }}", {{"x", 0}}), "no");
  EXPECT_EQ(render("[{{ 'a' if false }}]"), "[]");
}

TEST(JinjaEngine, AttributesSubscriptsAndSlices) {
  Json vars = {{"m", {{"role", "user"}, {"content", "hi"}, {"list", {1, 2, 3}}}}};
  EXPECT_EQ(render("{{ m.role }} {{ m['content'] }} {{ m.list[-1] }} {{ m.list.0 }}", vars), "user hi 3 1");
  EXPECT_EQ(render("{{ [1,2,3,4][1:] }} {{ [1,2,3,4][::-1] }} {{ 'hello'[1:3] }} {{ 'hello'[::-1] }}"),
            "[2, 3, 4] [4, 3, 2, 1] el olleh");
  EXPECT_EQ(render("{{ [1,2,3,4][:-1] }} {{ [0,1,2,3,4,5][1::2] }} {{ 'h\xc3\xa9llo'[1] }}"), "[1, 2, 3] [1, 3, 5] \xc3\xa9");
}

TEST(JinjaEngine, UndefinedIsLenientUntilCalled) {
  Json vars = {{"m", {{"role", "user"}}}};
  EXPECT_EQ(render("[{{ missing }}][{{ missing.attr.deeper }}][{{ m.nokey }}]", vars), "[][][]");
  EXPECT_EQ(render("{{ missing is defined }} {{ missing is undefined }} {{ m.nokey is defined }} {{ m.role is defined }}",
                   vars),
            "False True False True");
  EXPECT_EQ(render("{% for x in missing %}x{% else %}none{% endfor %}"), "none");
  std::string err = error_of("\n{{ missing() }}");
  EXPECT_NE(err.find("'missing' is undefined"), std::string::npos) << err;
  EXPECT_NE(err.find("line 2"), std::string::npos) << err;
}

TEST(JinjaEngine, IfElifElse) {
  EXPECT_EQ(render("{% for x in [1,2,3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %}"),
            "one,two,many,");
}

TEST(JinjaEngine, LoopVariables) {
  EXPECT_EQ(render("{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"),
            "103TrueFalse3;212FalseFalse3;321FalseTrue3;");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }} {% endfor %}"), "-2 1-3 2- ");
  EXPECT_EQ(render("{% for i in range(4) %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "abab");
  EXPECT_EQ(render("{% for a in [1,2] %}{% for b in [1,2] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}"),
            "121122");
}

TEST(JinjaEngine, LoopElseFilterAndUnpacking) {
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }}{{ ',' if not loop.last }}{% endfor %}"),
            "11,32,53,74,95");
  Json vars = {{"d", {{"b", 1}, {"a", 2}}}};
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", vars), "b=1;a=2;");
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", vars), "ba");
  EXPECT_EQ(render("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}"), "37");
}

TEST(JinjaEngine, BreakAndContinue) {
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
                   "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "0134");
}

TEST(JinjaEngine, ScopingAndNamespace) {
  // A set inside a loop does not outlive the iteration: hence namespace().
  EXPECT_EQ(render("{% set c = 0 %}{% for i in range(3) %}{% set c = c + 1 %}{{ c }}{% endfor %}{{ c }}"), "1110");
  EXPECT_EQ(render("{% set ns = namespace(c=0) %}{% for i in range(3) %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }}"),
            "3");
  EXPECT_EQ(render("{% set ns = namespace(parts=[]) %}{% for i in range(3) %}{% set _ = ns.parts.append(i * 2) %}"
                   "{% endfor %}{{ ns.parts|join(',') }}"),
            "0,2,4");
  // if does not open a scope.
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(render("{% with a = 1 %}{{ a }}{% endwith %}[{{ a }}]"), "1[]");
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.y = 2 %}").find("not a namespace"), std::string::npos);
}

TEST(JinjaEngine, BlockSetAndFilterBlock) {
  EXPECT_EQ(render("{% set x %}Hi {{ name }}{% endset %}[{{ x }}]", {{"name", "Bob"}}), "[Hi Bob]");
  EXPECT_EQ(render("{% set x | upper %}abc{% endset %}{{ x }}"), "ABC");
  EXPECT_EQ(render("{% filter upper %}hello {{ name }}{% endfilter %}", {{"name", "bob"}}), "HELLO BOB");
}

TEST(JinjaEngine, Macros) {
  EXPECT_EQ(render("{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}"
                   "{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', punct='?') }} {{ greet('Cy', 'Hi') }}"),
            "Hello, Ann! Hello, Bob? Hi, Cy!");
  EXPECT_EQ(render("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}"
                   "{{ fact(5) }}"),
            "120");
  EXPECT_EQ(render("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner{% endcall %}"), "<inner>");
}

TEST(JinjaEngine, RawBlocks) {
  EXPECT_EQ(render("{% raw %}{{ not evaluated }}{% if %}{% endraw %}!"), "{{ not evaluated }}{% if %}!");
}

TEST(JinjaEngine, WhitespaceControl) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("<{%- if true -%}\n  x  \n{%- endif -%}>"), "<x>");
  EXPECT_EQ(render("a\n"), "a");  // one trailing newline is dropped
  EXPECT_EQ(render("a\n\n"), "a\n");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
}

TEST(JinjaEngine, TrimAndLstripBlocks) {
  const std::string source = "{% for x in [1,2] %}\n    {% if x %}\n{{ x }}\n    {% endif %}\n{% endfor %}\n";
  EXPECT_EQ(render(source, Json::object(), true), "1\n2\n");
  EXPECT_EQ(render(source, Json::object(), false), "\n    \n1\n    \n\n    \n2\n    \n");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}", Json::object(), true), "  x");  // '+' keeps indentation
  EXPECT_EQ(render("  {{ 'x' }}", Json::object(), true), "  x");                  // not for {{ }}
  EXPECT_EQ(render("a {% if true %}b{% endif %}", Json::object(), true), "a b");   // not mid-line
  EXPECT_EQ(render("  {# c #}\nx", Json::object(), true), "x");                    // comments too
}

TEST(JinjaEngine, StringFilters) {
  EXPECT_EQ(render("{{ '  hi  '|trim }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|"
                   "{{ 'aaa'|replace('a','b',2) }}|{{ 'Ab'|upper }}{{ 'Ab'|lower }}"),
            "hi|Hello World|Hello|bba|ABab");
  EXPECT_EQ(render("{{ [1,2,3]|length }}|{{ 'h\xc3\xa9llo'|length }}|{{ {'a': 1}|count }}|{{ [3,1,2]|first }}"
                   "{{ [3,1,2]|last }}|{{ [1,2]|join(', ') }}"),
            "3|5|1|32|1, 2");
  EXPECT_EQ(render("{{ missing|default('dflt') }}|{{ ''|default('e', true) }}|{{ none|default('n') }}|{{ 'x'|d('y') }}"),
            "dflt|e|None|x");
  EXPECT_EQ(render("{{ 'a\nb\n\nc'|indent(2) }}"), "a\n  b\n\n  c");
  EXPECT_EQ(render("{{ 'a\nb'|indent(2, true) }}"), "  a\n  b");
  EXPECT_EQ(render("{{ '<a href=\"x\">&\\''|e }}"), "&lt;a href=&#34;x&#34;&gt;&amp;&#39;");
  EXPECT_EQ(render("{{ 'hello big  world'|wordcount }} {{ 'x'|safe }} {{ 7|string ~ '!' }}"), "3 x 7!");
  EXPECT_EQ(render("{{ '%s=%d'|format('a', 3) }}"), "a=3");
}

TEST(JinjaEngine, NumberFilters) {
  EXPECT_EQ(render("{{ '42'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ '2.5'|float }} {{ -3|abs }}"), "43 3 0 2.5 3");
  EXPECT_EQ(render("{{ 2.567|round(2) }} {{ 2.5|round }} {{ 3|round }} {{ 2.1|round(method='ceil') }}"),
            "2.57 2.0 3 3.0");
  EXPECT_EQ(render("{{ [1, 2, 3]|sum }} {{ [3, 1, 2]|max }} {{ [3, 1, 2]|min }}"), "6 3 1");
}

TEST(JinjaEngine, ToJsonMatchesPythonJsonDumps) {
  Json vars = Json::parse(R"({"obj": {"name": "f", "args": {"x": 1, "y": [true, null, "é"]}, "f": 1.0}})");
  EXPECT_EQ(render("{{ obj|tojson }}", vars), R"({"name": "f", "args": {"x": 1, "y": [true, null, "é"]}, "f": 1.0})");
  EXPECT_EQ(render("{{ obj|tojson(indent=2) }}", vars),
            "{\n  \"name\": \"f\",\n  \"args\": {\n    \"x\": 1,\n    \"y\": [\n      true,\n      null,\n"
            "      \"é\"\n    ]\n  },\n  \"f\": 1.0\n}");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}"), R"({"a": 2, "b": 1})");
  EXPECT_EQ(render("{{ 'a\"b\\\\c\n<>&'|tojson }}"), R"("a\"b\\c\n<>&")");
  EXPECT_EQ(render("{{ [1, {}, []]|tojson(separators=(',', ':')) }}"), "[1,{},[]]");
  EXPECT_EQ(render("{{ 'é'|tojson(ensure_ascii=true) }}"), R"("\u00e9")");
  EXPECT_NE(error_of("{{ missing|tojson }}").find("not JSON serializable"), std::string::npos);
}

TEST(JinjaEngine, SelectionFilters) {
  Json vars = Json::parse(R"({"msgs": [{"role": "system"}, {"role": "user", "x": 1}, {"role": "user"}],
                              "people": [{"name": "b", "age": 30}, {"name": "a", "age": 20}]})");
  EXPECT_EQ(render("{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}", vars), "2");
  EXPECT_EQ(render("{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='role')|join }}", vars), "system");
  EXPECT_EQ(render("{{ msgs|selectattr('x')|list|length }} {{ msgs|selectattr('x', 'defined')|list|length }}", vars),
            "1 1");
  EXPECT_EQ(render("{{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('divisibleby', 2)|list }}"), "[1, 3] [1, 3]");
  EXPECT_EQ(render("{{ ['a','b']|map('upper')|join }}"), "AB");
  EXPECT_EQ(render("{{ people|sort(attribute='age')|map(attribute='name')|join(',') }}", vars), "a,b");
  EXPECT_EQ(render("{{ msgs|map(attribute='x', default=0)|list }}", vars), "[0, 1, 0]");
}

TEST(JinjaEngine, OrderingFilters) {
  EXPECT_EQ(render("{{ ['b','A','a','c']|unique|list }}"), "['b', 'A', 'c']");
  EXPECT_EQ(render("{{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ ['b','A','c']|sort }}"),
            "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c']");
  EXPECT_EQ(render("{{ [1,2,3]|reverse|list }} {{ 'abc'|reverse }}"), "[3, 2, 1] cba");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2}|dictsort }} {{ {'a': 1}|items|list }}"), "[('a', 2), ('b', 1)] [('a', 1)]");
  EXPECT_EQ(render("{{ [1,2,3,4,5]|batch(2)|list }} {{ 'ab'|list }}"), "[[1, 2], [3, 4], [5]] ['a', 'b']");
}

TEST(JinjaEngine, Tests) {
  EXPECT_EQ(render("{{ 1 is odd }}{{ 2 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is string }}{{ 1 is number }}"
                   "{{ 1.5 is integer }}{{ {} is mapping }}{{ [] is sequence }}{{ 'x' is iterable }}"),
            "TrueTrueTrueTrueTrueFalseTrueTrueTrue");
  EXPECT_EQ(render("{{ none is none }}{{ true is boolean }}{{ true is true }}{{ false is false }}{{ 1 is eq 1 }}"
                   "{{ 3 is equalto 4 }}{{ 5 is not none }}{{ 1 is true }}{{ 2 is in [1, 2] }}"),
            "TrueTrueTrueTrueTrueFalseTrueFalseTrue");
  // Tests bind tighter than not/and.
  EXPECT_EQ(render("{{ not x is defined }} {{ x is defined and x }}"), "True False");
}

TEST(JinjaEngine, StringMethods) {
  EXPECT_EQ(render("{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}"), "x|hi|x|x");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a.b.c'.rsplit('.', 1) }}"),
            "['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a.b', 'c']");
  EXPECT_EQ(render("{{ 'hello'.startswith('he') }}|{{ 'hello'.endswith(('x', 'lo')) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}"
                   "|{{ 'aXa'.replace('a', 'b') }}|{{ 'hello world'.title() }}|{{ 'abcb'.find('b') }}|{{ '-'.join(['a', 'b']) }}"),
            "True|True|ABab|bXb|Hello World|1|a-b");
  Json vars = {{"c", "<think>\nreason\n</think>\n\nanswer"}};
  EXPECT_EQ(render("{{ c.split('</think>')[-1].lstrip('\\n') }}|"
                   "{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
                   vars),
            "answer|reason");
}

TEST(JinjaEngine, DictAndListMethods) {
  Json vars = {{"d", {{"b", 1}, {"a", 2}}}};
  EXPECT_EQ(render("{% for k in d.keys() %}{{ k }}{% endfor %}|{{ d.values()|list }}|{{ d.get('a') }}|"
                   "{{ d.get('zz', 'none!') }}|{{ d.get('zz') }}",
                   vars),
            "ba|[1, 2]|2|none!|None");
  EXPECT_EQ(render("{% set l = [1,2,3] %}{{ l.pop() }}{{ l }}{{ l.index(2) }}"), "3[1, 2]1");
  // d.items is the method even through the attribute syntax; d['items'] is the key.
  EXPECT_EQ(render("{{ x['items'] }} {{ x.items()|length }}", {{"x", {{"items", "key"}}}}), "key 1");
}

TEST(JinjaEngine, Globals) {
  EXPECT_EQ(render("{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }} {{ dict(a=1).a }}"),
            "[0, 1, 2] [1, 3, 5] [3, 2, 1] 1");
  EXPECT_EQ(render("{{ x|length - 1 }} {{ -2|abs }}", {{"x", {1, 2, 3}}}), "2 2");
}

TEST(JinjaEngine, SyntaxErrorsNameLineAndColumn) {
  auto syntax_error = [](const std::string& source) -> std::string {
    try {
      Template t(source);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::string e1 = syntax_error("Hello\n{{ 1 + }}");
  EXPECT_NE(e1.find("line 2, column 8"), std::string::npos) << e1;
  std::string e2 = syntax_error("{% for x in y %}\nabc");
  EXPECT_NE(e2.find("endfor"), std::string::npos) << e2;
  std::string e3 = syntax_error("ab\n  {% foo %}");
  EXPECT_NE(e3.find("unknown or unsupported tag 'foo'"), std::string::npos) << e3;
  EXPECT_NE(e3.find("line 2, column 6"), std::string::npos) << e3;
  EXPECT_NE(syntax_error("{{ 'abc }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(syntax_error("{% if x %}{% break %}{% endif %}").find("outside of a loop"), std::string::npos);
  EXPECT_NE(syntax_error("{{ x").find("missing '}}'"), std::string::npos);
}

TEST(JinjaEngine, RuntimeErrorsNameTheConstruct) {
  std::string e1 = error_of("a\nb {{ 'a' | nosuch }}");
  EXPECT_NE(e1.find("no filter named 'nosuch'"), std::string::npos) << e1;
  EXPECT_NE(e1.find("line 2"), std::string::npos) << e1;
  std::string e2 = error_of("{{ 5 is nosuchtest }}");
  EXPECT_NE(e2.find("no test named 'nosuchtest'"), std::string::npos) << e2;
  std::string e3 = error_of("{% for x in 5 %}{% endfor %}");
  EXPECT_NE(e3.find("not iterable"), std::string::npos) << e3;
  std::string e4 = error_of("{{ 'abc'.strip(1) }}");
  EXPECT_NE(e4.find("strip"), std::string::npos) << e4;
}

TEST(JinjaEngine, HostileTemplatesFailCleanly) {
  std::string e1 = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(e1.find("nests deeper than"), std::string::npos) << e1;
  std::string e2 = error_of("{{ 'ab' * 1000000000 }}");
  EXPECT_NE(e2.find("repetition"), std::string::npos) << e2;
  std::string e3 = error_of("{{ range(100000000)|length }}");
  EXPECT_NE(e3.find("too long"), std::string::npos) << e3;
}

TEST(JinjaEngine, GenerationTagRendersItsBody) {
  // transformers' {% generation %} only marks assistant text for training masks.
  EXPECT_EQ(render("a{% generation %}b{{ 1 }}{% endgeneration %}c"), "ab1c");
}

}  // namespace
}  // namespace kiln::jinja
