// The Jinja interpreter runs templates from model files, so a hostile one must end in a clear
// template error: nesting (once a stack overflow), runaway strings and lists (once out of
// memory), loop work (once hours of CPU) and integer overflow (once undefined behaviour) are
// bounded. Each test is a reproducer of issue 16.
#include <gtest/gtest.h>

#include <string>

#include "kuiper/tokenizer/chat_template.h"
#include "kuiper/tokenizer/jinja/interpreter.h"
#include "kuiper/tokenizer/jinja/parser.h"

namespace kuiper {
namespace {

// The rendering of `source` with no variables, or its error.
Result<std::string> render(const std::string& source) {
  KUIPER_ASSIGN_OR_RETURN(jinja::Template tmpl, jinja::parse(source));
  return jinja::render(tmpl, jinja::Json::object());
}

std::string error_of(const std::string& source) {
  Result<std::string> r = render(source);
  EXPECT_FALSE(r.ok()) << source.substr(0, 80);
  return r.ok() ? std::string() : r.status().message();
}

std::string repeated(const std::string& piece, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += piece;
  return out;
}

#define EXPECT_MENTIONS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "expected \"" << (part) << "\" in: " << (text)

TEST(JinjaLimits, DeepNestingIsATemplateError) {
  // Blocks, parentheses, unary operators and `not` nested 5000 deep: each once recursed past
  // the stack in the parser.
  EXPECT_MENTIONS(error_of(repeated("{% if true %}", 5000) + "x" + repeated("{% endif %}", 5000)),
                  "nested deeper than 100 levels");
  EXPECT_MENTIONS(error_of("{{ " + repeated("(", 5000) + "1" + repeated(")", 5000) + " }}"),
                  "nested deeper than 100 levels");
  EXPECT_MENTIONS(error_of("{{ " + repeated("-", 5000) + "1 }}"), "nested deeper than 100 levels");
  EXPECT_MENTIONS(error_of("{{ " + repeated("not ", 5000) + "1 }}"), "nested deeper than 100 levels");
  // Modest nesting still works.
  EXPECT_EQ(*render(repeated("{% if true %}", 50) + "x" + repeated("{% endif %}", 50)), "x");
}

TEST(JinjaLimits, LongOperatorChainsAreBoundedWhenRunAndFreed) {
  // A left-deep tree 20000 levels deep: parsed by loops, but evaluated and freed recursively
  // before.
  EXPECT_MENTIONS(error_of("{{ 'a'" + repeated(" ~ 'a'", 20000) + " }}"), "nested deeper than 400 levels");
  EXPECT_EQ(*render("{{ 'a'" + repeated(" ~ 'a'", 100) + " }}"), std::string(101, 'a'));
}

TEST(JinjaLimits, RecursiveMacrosAreATemplateError) {
  EXPECT_MENTIONS(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "deeper than");
}

TEST(JinjaLimits, HugeStringsAndListsAreTemplateErrors) {
  EXPECT_MENTIONS(error_of("{{ 'a' * 10000000000 }}"), "would pass 16777216 bytes");
  EXPECT_MENTIONS(error_of("{{ [1, 2] * 10000000000 }}"), "would pass 1048576 items");
  // Doubling a string in a loop.
  EXPECT_MENTIONS(error_of("{% set ns = namespace(s='a') %}{% for i in range(64) %}"
                           "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"),
                  "16777216 bytes");
  EXPECT_MENTIONS(error_of("{% set ns = namespace(s='a') %}{% for i in range(64) %}"
                           "{% set ns.s = ns.s + ns.s %}{% endfor %}"),
                  "16777216 bytes");
  EXPECT_MENTIONS(error_of("{{ ('a' * 4000000)|replace('a', 'bbbbbbbb') }}"), "replace() would pass");
  EXPECT_MENTIONS(error_of("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"),
                  "template output passes 16777216 bytes");
  EXPECT_EQ(render("{{ 'ab' * 3 }}{{ [1] * 2 }}{{ 'a-b'|replace('-', '+') }}").value(), "ababab[1, 1]a+b");
}

TEST(JinjaLimits, LoopWorkIsBounded) {
  EXPECT_MENTIONS(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
                  "loops ran more than 1048576 iterations");
}

TEST(JinjaLimits, IntegerOverflowIsATemplateError) {
  EXPECT_MENTIONS(error_of("{{ 9223372036854775807 + 1 }}"), "integer overflow in +");
  EXPECT_MENTIONS(error_of("{{ -9223372036854775807 - 2 }}"), "integer overflow in -");
  EXPECT_MENTIONS(error_of("{{ 4294967296 * 4294967296 }}"), "integer overflow in *");
  EXPECT_MENTIONS(error_of("{{ 2 ** 10000000000 }}"), "integer overflow in **");
  EXPECT_MENTIONS(error_of("{{ (-9223372036854775807 - 1) // -1 }}"), "integer overflow in //");
  EXPECT_EQ(*render("{{ 2 ** 62 }} {{ 7 // -2 }} {{ 3 ** 0 }}"), "4611686018427387904 -4 1");
}

// int() of a float beyond int64 once converted with undefined behaviour (found by reading the
// filters after issue 16's audit): Python gives a big integer, the template an error.
TEST(JinjaLimits, IntOfAFloatBeyondInt64IsATemplateError) {
  EXPECT_MENTIONS(error_of("{{ 1e300 | int }}"), "int(): 1e+300 is beyond a 64-bit integer");
  EXPECT_MENTIONS(error_of("{{ -1e19 | int }}"), "is beyond a 64-bit integer");
  EXPECT_MENTIONS(error_of("{{ '1e300' | int }}"), "is beyond a 64-bit integer");
  EXPECT_MENTIONS(error_of("{{ 9223372036854775808.0 | int }}"), "is beyond a 64-bit integer");
  EXPECT_EQ(*render("{{ 2.9 | int }} {{ '-3.5' | int }} {{ -9223372036854775808.0 | int }}"),
            "2 -3 -9223372036854775808");
}

}  // namespace
}  // namespace kuiper
