// Chat templates: the Qwen3 template from tokenizer_config.json against the transformers goldens,
// more conversations (tools, reasoning, vision content, Qwen2.5's default system prompt) whose
// expected text was rendered by Jinja2 3.1 in transformers' environment, and the interpreter's
// Jinja semantics one feature at a time.
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kuiper/tokenizer/chat_template.h"
#include "support/assertions.h"
#include "support/paths.h"

namespace kuiper {
namespace {

using Json = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

ChatTemplate qwen3_template() {
  const std::string config = read_file(test::tokenizer_dir() + "/tokenizer_config.json");
  auto tmpl = ChatTemplate::from_tokenizer_config(config);
  EXPECT_OK(tmpl);
  return std::move(tmpl).value();
}

// Renders `source` with the variables of `variables_json` (no generation prompt unless given).
Result<std::string> render_source(const std::string& source, const std::string& variables_json = "{}") {
  KUIPER_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::parse(source));
  Json variables = Json::parse(variables_json);
  ChatOptions options;
  options.add_generation_prompt = false;
  Json messages = Json::array();
  for (const auto& [key, value] : variables.items()) {
    if (key == "messages") {
      messages = value;
    } else {
      options.extra[key] = value;
    }
  }
  return tmpl.render(messages, options);
}

std::string rendered(const std::string& source, const std::string& variables_json = "{}") {
  auto text = render_source(source, variables_json);
  EXPECT_OK(text);
  return text.ok() ? text.value() : "<error: " + text.status().message() + ">";
}

std::string render_error(const std::string& source, const std::string& variables_json = "{}") {
  auto text = render_source(source, variables_json);
  EXPECT_FALSE(text.ok()) << "rendered: " << (text.ok() ? text.value() : "");
  return text.ok() ? "" : text.status().message();
}

std::string parse_error(const std::string& source) {
  auto tmpl = ChatTemplate::parse(source);
  EXPECT_FALSE(tmpl.ok());
  return tmpl.ok() ? "" : tmpl.status().message();
}

// ---- the real Qwen3 template ----

TEST(ChatTemplateGolden, EveryFixtureCaseRendersExactly) {
  const ChatTemplate tmpl = qwen3_template();
  const Json cases = Json::parse(read_file(test::fixtures_dir() + "/tokenizer/chat_template.json"));
  ASSERT_TRUE(cases.is_array());
  ASSERT_GE(cases.size(), 10u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Json& c = cases[i];
    ChatOptions options;
    options.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    options.extra = c.at("kwargs");
    auto text = tmpl.render(c.at("messages"), options);
    ASSERT_TRUE(text.ok()) << "case " << i << ": " << text.status().message();
    EXPECT_EQ(text.value(), c.at("text").get<std::string>()) << "case " << i;
  }
}

TEST(ChatTemplateGolden, Qwen3ToolsAndToolCalls) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Current temperature (温度) for a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
      "required": ["city"]}}}])");
  const Json messages = Json::parse(R"([
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris and 東京?"},
    {"role": "assistant", "content": "<think>\nNeed two calls.\n</think>\n\nChecking.", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris"}}},
      {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"東京\"}"}}]},
    {"role": "tool", "content": "18°C"},
    {"role": "tool", "content": "22°C"},
    {"role": "assistant", "content": "<think>\nBoth fetched.\n</think>\n\nParis 18°C, 東京 22°C."}])");
  ChatOptions options;
  options.add_generation_prompt = false;
  options.extra["tools"] = tools;
  auto text = qwen3_template().render(messages, options);
  ASSERT_OK(text);
  // Tool JSON keeps the caller's key order and its non-ASCII text (json.dumps, ensure_ascii=False).
  EXPECT_EQ(text.value(), R"X(<|im_start|>system
You are a weather bot.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Current temperature (温度) for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris and 東京?<|im_end|>
<|im_start|>assistant
<think>
Need two calls.
</think>

Checking.
<tool_call>
{"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris"}}
</tool_call>
<tool_call>
{"name": "get_weather", "arguments": {"city": "東京"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
18°C
</tool_response>
<tool_response>
22°C
</tool_response><|im_end|>
<|im_start|>assistant
<think>
Both fetched.
</think>

Paris 18°C, 東京 22°C.<|im_end|>
)X");
}

TEST(ChatTemplateGolden, Qwen3ReasoningContentKeptOnlyAfterTheLastQuery) {
  const Json messages = Json::parse(R"([{"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "A2", "reasoning_content": "R2"}])");
  ChatOptions options;
  options.add_generation_prompt = false;
  auto text = qwen3_template().render(messages, options);
  ASSERT_OK(text);
  EXPECT_EQ(text.value(),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nR2\n</think>\n\nA2<|im_end|>\n");
}

TEST(ChatTemplateGolden, Qwen3EnableThinkingTrueGivesNoEmptyThinkBlock) {
  const Json messages = Json::parse(R"([{"role": "user", "content": "Q"}])");
  ChatOptions options;
  options.extra["enable_thinking"] = true;
  auto text = qwen3_template().render(messages, options);
  ASSERT_OK(text);
  EXPECT_EQ(text.value(), "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n");
}

// Written in the style of Qwen3-VL's template: a macro that renders text or a list of content
// parts and counts images in a namespace shared across calls.
constexpr const char* kVisionTemplate = R"({%- set image_count = namespace(value=0) %}
{%- macro render_content(content, count_images) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for item in content %}
            {%- if 'image' in item or item.type == 'image' %}
                {%- if count_images %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                <|vision_start|><|image_pad|><|vision_end|>
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + render_content(message.content, true) + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)";

TEST(ChatTemplateGolden, VisionContentPartsThroughAMacro) {
  auto tmpl = ChatTemplate::parse(kVisionTemplate);
  ASSERT_OK(tmpl);
  const Json messages = Json::parse(R"([
    {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "What is this?"}]},
    {"role": "assistant", "content": "A cat."},
    {"role": "user", "content": [{"image": "b.png"}, {"type": "image"}, {"type": "text", "text": "And these?"}]}])");
  ChatOptions options;
  auto plain = tmpl->render(messages, options);
  ASSERT_OK(plain);
  EXPECT_EQ(plain.value(),
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
            "<|im_start|>assistant\nA cat.<|im_end|>\n"
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|>"
            "And these?<|im_end|>\n<|im_start|>assistant\n");
  options.extra["add_vision_id"] = true;
  auto numbered = tmpl->render(messages, options);
  ASSERT_OK(numbered);
  EXPECT_EQ(numbered.value(),
            "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
            "<|im_start|>assistant\nA cat.<|im_end|>\n"
            "<|im_start|>user\nPicture 2: <|vision_start|><|image_pad|><|vision_end|>Picture 3: "
            "<|vision_start|><|image_pad|><|vision_end|>And these?<|im_end|>\n<|im_start|>assistant\n");
}

// The shape of Qwen2.5's template: a default system prompt, subscript access, `is defined`.
constexpr const char* kQwen25StyleTemplate = R"({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)";

TEST(ChatTemplateGolden, Qwen25StyleDefaultSystemPromptAndToolCall) {
  auto tmpl = ChatTemplate::parse(kQwen25StyleTemplate);
  ASSERT_OK(tmpl);
  auto hello = tmpl->render(Json::parse(R"([{"role": "user", "content": "Hi"}])"), ChatOptions());
  ASSERT_OK(hello);
  EXPECT_EQ(hello.value(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  ChatOptions options;
  options.extra["tools"] = Json::parse(R"([{"type": "function", "function": {"name": "get_weather"}}])");
  auto call = tmpl->render(Json::parse(R"([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather",
        "arguments": {"unit": "celsius", "city": "Paris"}}}]},
      {"role": "tool", "content": "18°C"}])"),
                           options);
  ASSERT_OK(call);
  EXPECT_EQ(call.value(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
            "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}\n</tools><|im_end|>\n"
            "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
            "{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\", \"city\": \"Paris\"}}\n</tool_call>"
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n18°C\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

// ---- the ChatTemplate API ----

TEST(ChatTemplate, FromTokenizerConfigErrors) {
  EXPECT_FALSE(ChatTemplate::from_tokenizer_config("not json").ok());
  EXPECT_FALSE(ChatTemplate::from_tokenizer_config("[]").ok());
  auto missing = ChatTemplate::from_tokenizer_config(R"({"eos_token": "</s>"})");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("chat_template"), std::string::npos);
  auto unparsable = ChatTemplate::from_tokenizer_config(R"({"chat_template": "{% if x %}"})");
  ASSERT_FALSE(unparsable.ok());
  EXPECT_NE(unparsable.status().message().find("endif"), std::string::npos) << unparsable.status().message();
}

TEST(ChatTemplate, FromTokenizerConfigTakesTheDefaultOfNamedTemplatesAndSpecialTokens) {
  auto tmpl = ChatTemplate::from_tokenizer_config(R"({
      "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
      "chat_template": [{"name": "tool_use", "template": "tools"},
                        {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]})");
  ASSERT_OK(tmpl);
  auto text = tmpl->render(Json::parse(R"([{"role": "user", "content": "x"}])"), ChatOptions());
  ASSERT_OK(text);
  EXPECT_EQ(text.value(), "<s>x</s>");
}

TEST(ChatTemplate, NullBosTokenIsUndefined) {
  auto tmpl = ChatTemplate::parse("{{ bos_token is defined }}{{ eos_token }}", "", "<|im_end|>");
  ASSERT_OK(tmpl);
  auto text = tmpl->render(Json::array(), ChatOptions());
  ASSERT_OK(text);
  EXPECT_EQ(text.value(), "False<|im_end|>");
}

TEST(ChatTemplate, GenerationPromptFlagAndExtraVariables) {
  auto tmpl = ChatTemplate::parse("{{ add_generation_prompt }} {{ tools }} {{ custom }}");
  ASSERT_OK(tmpl);
  ChatOptions options;
  options.extra["custom"] = "c";
  auto on = tmpl->render(Json::array(), options);
  ASSERT_OK(on);
  EXPECT_EQ(on.value(), "True None c");
  options.add_generation_prompt = false;
  auto off = tmpl->render(Json::array(), options);
  ASSERT_OK(off);
  EXPECT_EQ(off.value(), "False None c");
}

TEST(ChatTemplate, MessagesMustBeAList) {
  auto tmpl = ChatTemplate::parse("x");
  ASSERT_OK(tmpl);
  EXPECT_FALSE(tmpl->render(Json::object(), ChatOptions()).ok());
}

// ---- Jinja: whitespace control (trim_blocks, lstrip_blocks, - and +) ----

TEST(Jinja, TrimBlocksAndLstripBlocks) {
  EXPECT_EQ(rendered("<{% if true %}\n  yes\n  {% endif %}\nafter>"), "<  yes\nafter>");
}

TEST(Jinja, DashStripsWhitespaceOnThatSide) {
  EXPECT_EQ(rendered("a  {{- ' b ' -}}  c|  {%- if true %}x{% endif -%}  \n y"), "a b c|xy");
}

TEST(Jinja, PlusKeepsWhatLstripAndTrimWouldRemove) {
  EXPECT_EQ(rendered("line\n    {%+ if true %}kept{% endif +%}\nnext"), "line\n    kept\nnext");
}

TEST(Jinja, CommentsDisappearWithTheirWhitespaceControl) { EXPECT_EQ(rendered("a {# note #}\n  {#- c -#}  b\n"), "a b"); }

TEST(Jinja, OneTrailingNewlineIsDropped) { EXPECT_EQ(rendered("x\n\n"), "x\n"); }

TEST(Jinja, NoNewlineTrimAfterAnExpression) { EXPECT_EQ(rendered("{{ 'a' }}\nb{% set y = 1 %}\nc"), "a\nbc"); }

// ---- Jinja: loops and scoping ----

TEST(Jinja, LoopVariables) {
  EXPECT_EQ(rendered("{% for x in items %}{{ loop.index }}/{{ loop.length }}:{{ x }}{% if not loop.last %}, {% endif %}"
                     "{% endfor %}",
                     R"({"items": ["a", "b", "c"]})"),
            "1/3:a, 2/3:b, 3/3:c");
  EXPECT_EQ(rendered("{% for x in items %}[{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}]"
                     "{% endfor %}",
                     R"({"items": [1, 2]})"),
            "[021True][110False]");
}

TEST(Jinja, ForElseFilterBreakContinue) {
  EXPECT_EQ(rendered("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(rendered("{% for x in items if x > 1 %}{{ loop.index0 }}{{ x }}{{ loop.last }} {% endfor %}",
                     R"({"items": [1, 2, 3]})"),
            "02False 13True ");
  EXPECT_EQ(rendered("{% for x in range(10) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}"
                     "{% endif %}{{ x }}{% endfor %}"),
            "023");
}

TEST(Jinja, UnpackingDictItems) {
  EXPECT_EQ(rendered("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}{% for k, v in d.items() %}{{ k }}{% endfor %}",
                     R"({"d": {"z": 1, "a": "x"}})"),
            "z=1;a=x;za");
}

TEST(Jinja, LoopBodySetDoesNotLeakButNamespaceDoes) {
  EXPECT_EQ(rendered("{% set x = 0 %}{% for i in [1,2] %}{% set x = i %}{{ x }}{% endfor %}{{ x }}"), "120");
  EXPECT_EQ(rendered("{% set ns = namespace(count=0, seen=false) %}{% for i in range(3) %}"
                     "{% set ns.count = ns.count + i %}{% if i == 2 %}{% set ns.seen = true %}{% endif %}{% endfor %}"
                     "{{ ns.count }} {{ ns.seen }}"),
            "3 True");
  EXPECT_NE(render_error("{% set x = 1 %}{% set x.y = 2 %}").find("namespace"), std::string::npos);
}

TEST(Jinja, NestedLoopsSeeTheirOwnLoopVariable) {
  EXPECT_EQ(rendered("{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}"
                     "{{ loop.index }}|{% endfor %}"),
            "1x1 1y2 1|2x1 2y2 2|");
}

TEST(Jinja, SetBlockAndMacro) {
  EXPECT_EQ(rendered("{% set x %}a{{ 1 + 1 }}b{% endset %}[{{ x }}]"), "[a2b]");
  EXPECT_EQ(rendered("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                     "{{ greet('A') }} {{ greet('B', punct='?') }}"),
            "Hi A! Hi B?");
}

// ---- Jinja: filters ----

TEST(Jinja, LengthCountsCharactersNotBytes) {
  EXPECT_EQ(rendered("{{ items|length }} {{ s|length }} {{ d|length }} {{ messages|length - 1 }}",
                     R"({"items": [1, 2, 3], "s": "多轮ab", "d": {"a": 1}, "messages": [1, 2]})"),
            "3 4 1 1");
}

TEST(Jinja, TrimStringFirstLastJoin) {
  EXPECT_EQ(rendered("[{{ '  hi \n'|trim }}]"), "[hi]");
  EXPECT_EQ(rendered("{{ 3|string ~ 'x' }} {{ [1, 'a', none, true]|string }} {{ {'k': 'v'}|string }} {{ none|string }}"),
            "3x [1, 'a', None, True] {'k': 'v'} None");
  EXPECT_EQ(rendered("{{ items|first }}{{ items|last }}{{ 'abc'|first }}{{ 'abc'|last }}", R"({"items": [1, 2, 3]})"),
            "13ac");
  EXPECT_EQ(rendered("{{ ['a','b']|join(', ') }}|{{ [1,2]|join }}|{{ users|join('/', attribute='name') }}",
                     R"({"users": [{"name": "x"}, {"name": "y"}]})"),
            "a, b|12|x/y");
}

TEST(Jinja, DefaultFilter) {
  EXPECT_EQ(rendered("{{ missing|default('d') }}|{{ ''|default('d', true) }}|{{ ''|default('d') }}|"
                     "{{ none|default('d') }}|{{ x|d('e') }}",
                     R"({"x": "set"})"),
            "d|d||None|set");
}

TEST(Jinja, TojsonLikeTransformers) {
  EXPECT_EQ(rendered("{{ d|tojson }}|{{ [1, 'é', none, true, 1.5]|tojson }}|{{ 'a\"b'|tojson }}",
                     R"({"d": {"b": 1, "a": ["x\n", {"k": "温度"}]}})"),
            R"({"b": 1, "a": ["x\n", {"k": "温度"}]}|[1, "é", null, true, 1.5]|"a\"b")");
  EXPECT_EQ(rendered("{{ d|tojson(indent=2) }}", R"({"d": {"b": 1, "a": ["x", {"k": "温度"}]}})"),
            "{\n  \"b\": 1,\n  \"a\": [\n    \"x\",\n    {\n      \"k\": \"温度\"\n    }\n  ]\n}");
}

// ---- Jinja: tests, methods, operators ----

TEST(Jinja, Tests) {
  EXPECT_EQ(rendered("{{ x is defined }} {{ y is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [1] is sequence }} "
                     "{{ 'a' is sequence }} {{ 1 is string }} {{ x is not defined }} {{ d is mapping }} {{ d is sequence }}",
                     R"({"y": null, "d": {}})"),
            "False True True True True True False True True True");
}

TEST(Jinja, StringMethods) {
  EXPECT_EQ(rendered("{{ s.startswith('<think>') }} {{ s.endswith(('x', 'A1')) }} {{ s.split('</think>')[-1].lstrip('\n') }}|"
                     "{{ s.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') }}|{{ '  a b  '.strip() }}|"
                     "{{ 'xxhixx'.strip('x') }}|{{ 'a,b,c'.split(',', 1) }}|{{ ' a  b '.split() }}|"
                     "{{ 'aaa'.replace('a', 'b', 2) }}",
                     R"({"s": "<think>\nsome reasoning\n</think>\n\nA1"})"),
            "True True A1|some reasoning|a b|hi|['a', 'b,c']|['a', 'b']|bba");
}

TEST(Jinja, Slicing) {
  EXPECT_EQ(rendered("{{ items[::-1] }} {{ items[1:] }} {{ items[:-1] }} {{ items[::2] }} {{ 'héllo'[::-1] }} "
                     "{{ items[-1] }} {{ 'héllo'[1:3] }} {{ items.0 }}",
                     R"({"items": [1, 2, 3, 4]})"),
            "[4, 3, 2, 1] [2, 3, 4] [1, 2, 3] [1, 3] olléh 4 él 1");
}

TEST(Jinja, Operators) {
  EXPECT_EQ(rendered("{{ 'a' ~ 1 ~ none }} {{ 'b' in 'abc' }} {{ 2 not in [1, 3] }} {{ 'k' in d }} {{ 1 + 2 * 3 }} "
                     "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 1 < 2 < 3 }} {{ 0 or 'x' }} {{ 1 and '' }} "
                     "{{ 'y' if false else 'n' }} {{ [1] + [2] }} {{ 'ab' * 2 }} {{ 2 ** 10 }} {{ -2 ** 2 }} {{ 'a' 'b' }}",
                     R"({"d": {"k": 1}})"),
            "a1None True True True 7 3 -4 1 3.5 True x  n [1, 2] abab 1024 4 ab");
}

// ---- Jinja: Undefined and errors ----

TEST(Jinja, UndefinedPrintsEmptyAndIsFalsy) {
  EXPECT_EQ(rendered("[{{ missing }}][{{ msg.nokey }}][{% for x in missing %}x{% endfor %}][{{ missing is defined }}]"
                     "[{{ msg['role'] }}][{% if not missing %}falsy{% endif %}]",
                     R"({"msg": {"role": "user"}})"),
            "[][][][False][user][falsy]");
}

TEST(Jinja, UsingUndefinedIsAnErrorWithItsLine) {
  const std::string attr = render_error("ok\n{{ missing.attr }}");
  EXPECT_NE(attr.find("'missing' is undefined"), std::string::npos) << attr;
  EXPECT_NE(attr.find("line 2"), std::string::npos) << attr;
  EXPECT_NE(render_error("{{ missing + 1 }}").find("'missing' is undefined"), std::string::npos);
}

TEST(Jinja, RaiseExceptionBecomesAnErrorStatus) {
  const std::string message =
      render_error("{% if messages|length == 0 %}{{ raise_exception('No messages were given!') }}{% endif %}ok");
  EXPECT_NE(message.find("No messages were given!"), std::string::npos) << message;
  EXPECT_EQ(rendered("{% if messages|length == 0 %}{{ raise_exception('No messages were given!') }}{% endif %}ok",
                     R"({"messages": [{"role": "user", "content": "x"}]})"),
            "ok");
}

TEST(Jinja, ParseErrorsNameLineAndColumn) {
  const std::string filter = parse_error("line1\n{% if x %}\n  {{ x | bogus }}\n{% endif %}");
  EXPECT_NE(filter.find("line 3, column 10"), std::string::npos) << filter;
  EXPECT_NE(filter.find("bogus"), std::string::npos) << filter;

  const std::string unclosed = parse_error("a\n  {% for m in messages %}{{ m }}");
  EXPECT_NE(unclosed.find("endfor"), std::string::npos) << unclosed;
  EXPECT_NE(unclosed.find("the 'for' at line 2, column 6"), std::string::npos) << unclosed;

  const std::string tag = parse_error("{% include 'other.jinja' %}");
  EXPECT_NE(tag.find("line 1, column 4"), std::string::npos) << tag;
  EXPECT_NE(tag.find("include"), std::string::npos) << tag;

  const std::string stray = parse_error("{{ x y }}");
  EXPECT_NE(stray.find("line 1, column 6"), std::string::npos) << stray;

  const std::string string = parse_error("ok\n{{ 'abc }}");
  EXPECT_NE(string.find("line 2, column 4"), std::string::npos) << string;

  const std::string bracket = parse_error("{{ f(x] }}");
  EXPECT_NE(bracket.find("line 1, column 7: unexpected ']', expected ')'"), std::string::npos) << bracket;
}

}  // namespace
}  // namespace kuiper
