#include "kuiper/tokenizer/jinja/parser.h"

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "kuiper/tokenizer/jinja/builtins.h"

namespace kuiper::jinja {
namespace {

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::kText: return "template text";
    case TokenKind::kVariableBegin: return "'{{'";
    case TokenKind::kVariableEnd: return "'}}'";
    case TokenKind::kBlockBegin: return "'{%'";
    case TokenKind::kBlockEnd: return "'%}'";
    case TokenKind::kString: return "string '" + t.text + "'";
    case TokenKind::kEnd: return "end of template";
    default: return in_quotes(t.text);
  }
}

std::string join_alternatives(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += in_quotes(names[i]);
  }
  return out;
}

ExprPtr make(Expr::Kind kind, SourcePos pos) { return std::make_unique<Expr>(kind, pos); }

// Blocks and parenthesised or unary expressions nested deeper than this are refused: real
// templates nest a dozen levels, and the parser recurses once per level.
constexpr int kMaxNesting = 100;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Result<Template> parse_template() {
    Template result;
    KUIPER_ASSIGN_OR_RETURN(result.body, parse_body({}, nullptr));
    return result;
  }

 private:
  const Token& cur() const { return tokens_[i_]; }
  const Token& peek() const { return tokens_[i_ + 1 < tokens_.size() ? i_ + 1 : i_]; }
  void advance() {
    if (i_ + 1 < tokens_.size()) ++i_;
  }
  bool at_name(const char* s) const { return cur().kind == TokenKind::kName && cur().text == s; }
  bool at_op(const char* s) const { return cur().kind == TokenKind::kOperator && cur().text == s; }

  Status fail(const Token& at, const std::string& what) const {
    return Status::Error(jinja::describe(at.pos) + ": " + what);
  }
  Status unexpected(const std::string& expected) const {
    return fail(cur(), "expected " + expected + ", found " + describe(cur()));
  }

  // One level of recursion, refused past kMaxNesting; `leave()` must follow a successful enter.
  Status enter() {
    if (++nesting_ > kMaxNesting) {
      --nesting_;
      return fail(cur(), "nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    return Status::Ok();
  }
  void leave() { --nesting_; }
  // f() one nesting level down.
  template <typename F>
  auto nested(F f) -> decltype(f()) {
    KUIPER_RETURN_IF_ERROR(enter());
    auto result = f();
    leave();
    return result;
  }

  Status expect_op(const char* op) {
    if (!at_op(op)) return unexpected(in_quotes(op));
    advance();
    return Status::Ok();
  }
  Status expect_block_end() {
    if (cur().kind != TokenKind::kBlockEnd) return unexpected("'%}'");
    advance();
    return Status::Ok();
  }
  Result<std::string> expect_name(const std::string& what) {
    if (cur().kind != TokenKind::kName) return unexpected(what);
    std::string name = cur().text;
    advance();
    return name;
  }

  // Statements until one of `end_tags` opens a block; returns with cur() on that tag's name.
  // `opener` is the tag the body belongs to, named when its end never comes.
  Result<Body> parse_body(const std::vector<std::string>& end_tags, const Token* opener) {
    return nested([&] { return parse_statements(end_tags, opener); });
  }

  Result<Body> parse_statements(const std::vector<std::string>& end_tags, const Token* opener) {
    Body body;
    while (true) {
      const Token& t = cur();
      switch (t.kind) {
        case TokenKind::kText:
          body.emplace_back(Node::Kind::kText, t.pos);
          body.back().text = t.text;
          advance();
          break;
        case TokenKind::kVariableBegin: {
          Node node(Node::Kind::kOutput, t.pos);
          advance();
          KUIPER_ASSIGN_OR_RETURN(node.expr, parse_expression());
          if (cur().kind != TokenKind::kVariableEnd) return unexpected("'}}'");
          advance();
          body.push_back(std::move(node));
          break;
        }
        case TokenKind::kBlockBegin: {
          advance();
          if (cur().kind != TokenKind::kName) return unexpected("a tag name");
          for (const std::string& end : end_tags) {
            if (cur().text == end) return body;
          }
          KUIPER_RETURN_IF_ERROR(parse_statement(end_tags, opener, &body));
          break;
        }
        case TokenKind::kEnd:
          if (end_tags.empty()) return body;
          return fail(t, "unexpected end of template: expected " + join_alternatives(end_tags) + " to close the " +
                             in_quotes(opener->text) + " at " + jinja::describe(opener->pos));
        default:
          return fail(t, "unexpected " + describe(t));
      }
    }
  }

  Status parse_statement(const std::vector<std::string>& end_tags, const Token* opener, Body* body) {
    const Token& tag = cur();
    const std::string& name = tag.text;
    if (name == "if") return parse_if(body);
    if (name == "for") return parse_for(body);
    if (name == "set") return parse_set(body);
    if (name == "macro") return parse_macro(body);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return fail(tag, in_quotes(name) + " outside of a loop");
      body->emplace_back(name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, tag.pos);
      advance();
      return expect_block_end();
    }
    if (name == "generation") {
      // Hugging Face's AssistantTracker tag only marks assistant text for training masks;
      // rendering prints its body unchanged.
      const Token& opened = tag;
      advance();
      KUIPER_RETURN_IF_ERROR(expect_block_end());
      KUIPER_ASSIGN_OR_RETURN(Body inner, parse_body({"endgeneration"}, &opened));
      advance();
      KUIPER_RETURN_IF_ERROR(expect_block_end());
      for (Node& node : inner) body->push_back(std::move(node));
      return Status::Ok();
    }
    if (!end_tags.empty()) {
      return fail(tag, "unexpected tag " + in_quotes(name) + ": expected " + join_alternatives(end_tags) +
                           " for the " + in_quotes(opener->text) + " at " + jinja::describe(opener->pos));
    }
    return fail(tag, "unknown or unsupported tag " + in_quotes(name));
  }

  Status parse_if(Body* body) {
    const Token& opener = cur();
    Node node(Node::Kind::kIf, opener.pos);
    advance();
    while (true) {
      KUIPER_ASSIGN_OR_RETURN(ExprPtr condition, parse_expression());
      KUIPER_RETURN_IF_ERROR(expect_block_end());
      KUIPER_ASSIGN_OR_RETURN(Body branch, parse_body({"elif", "else", "endif"}, &opener));
      node.branches.emplace_back(std::move(condition), std::move(branch));
      if (!at_name("elif")) break;
      advance();
    }
    if (at_name("else")) {
      advance();
      KUIPER_RETURN_IF_ERROR(expect_block_end());
      KUIPER_ASSIGN_OR_RETURN(node.else_body, parse_body({"endif"}, &opener));
    }
    advance();  // endif
    KUIPER_RETURN_IF_ERROR(expect_block_end());
    body->push_back(std::move(node));
    return Status::Ok();
  }

  Status parse_for(Body* body) {
    const Token& opener = cur();
    Node node(Node::Kind::kFor, opener.pos);
    advance();
    const bool parenthesized = at_op("(");
    if (parenthesized) advance();
    while (true) {
      KUIPER_ASSIGN_OR_RETURN(std::string target, expect_name("a loop variable name"));
      node.targets.push_back(std::move(target));
      if (!at_op(",")) break;
      advance();
    }
    if (parenthesized) KUIPER_RETURN_IF_ERROR(expect_op(")"));
    if (!at_name("in")) return unexpected("'in'");
    advance();
    // No conditional expression here: a trailing "if" filters the items, as in Jinja.
    KUIPER_ASSIGN_OR_RETURN(node.expr, parse_or());
    if (at_name("if")) {
      advance();
      KUIPER_ASSIGN_OR_RETURN(node.filter, parse_expression());
    }
    if (at_name("recursive")) return fail(cur(), "recursive loops are not supported");
    KUIPER_RETURN_IF_ERROR(expect_block_end());
    ++loop_depth_;
    auto loop_body = parse_body({"else", "endfor"}, &opener);
    --loop_depth_;
    if (!loop_body.ok()) return loop_body.status();
    node.body = std::move(loop_body).value();
    if (at_name("else")) {
      advance();
      KUIPER_RETURN_IF_ERROR(expect_block_end());
      KUIPER_ASSIGN_OR_RETURN(node.else_body, parse_body({"endfor"}, &opener));
    }
    advance();  // endfor
    KUIPER_RETURN_IF_ERROR(expect_block_end());
    body->push_back(std::move(node));
    return Status::Ok();
  }

  Status parse_set(Body* body) {
    const Token& opener = cur();
    Node node(Node::Kind::kSet, opener.pos);
    advance();
    KUIPER_ASSIGN_OR_RETURN(node.name, expect_name("a variable name"));
    if (at_op(".")) {
      advance();
      KUIPER_ASSIGN_OR_RETURN(node.attribute, expect_name("an attribute name"));
    }
    if (at_op("=")) {
      advance();
      KUIPER_ASSIGN_OR_RETURN(node.expr, parse_expression());
      KUIPER_RETURN_IF_ERROR(expect_block_end());
    } else {
      if (cur().kind != TokenKind::kBlockEnd) return unexpected("'=' or '%}'");
      if (!node.attribute.empty()) return fail(opener, "a block 'set' cannot assign an attribute");
      advance();
      KUIPER_ASSIGN_OR_RETURN(node.body, parse_body({"endset"}, &opener));
      advance();  // endset
      KUIPER_RETURN_IF_ERROR(expect_block_end());
    }
    body->push_back(std::move(node));
    return Status::Ok();
  }

  Status parse_macro(Body* body) {
    const Token& opener = cur();
    Node node(Node::Kind::kMacro, opener.pos);
    advance();
    KUIPER_ASSIGN_OR_RETURN(node.name, expect_name("a macro name"));
    KUIPER_RETURN_IF_ERROR(expect_op("("));
    while (!at_op(")")) {
      const Token& param = cur();
      KUIPER_ASSIGN_OR_RETURN(std::string name, expect_name("a parameter name"));
      ExprPtr default_value;
      if (at_op("=")) {
        advance();
        KUIPER_ASSIGN_OR_RETURN(default_value, parse_expression());
      } else if (!node.defaults.empty() && node.defaults.back() != nullptr) {
        return fail(param, "parameter " + in_quotes(name) + " without a default follows one with a default");
      }
      node.params.push_back(std::move(name));
      node.defaults.push_back(std::move(default_value));
      if (!at_op(",")) break;
      advance();
    }
    KUIPER_RETURN_IF_ERROR(expect_op(")"));
    KUIPER_RETURN_IF_ERROR(expect_block_end());
    // A macro body is not inside the loop its definition may sit in.
    const int saved_depth = loop_depth_;
    loop_depth_ = 0;
    auto macro_body = parse_body({"endmacro"}, &opener);
    loop_depth_ = saved_depth;
    if (!macro_body.ok()) return macro_body.status();
    node.body = std::move(macro_body).value();
    advance();  // endmacro
    KUIPER_RETURN_IF_ERROR(expect_block_end());
    body->push_back(std::move(node));
    return Status::Ok();
  }

  // Expressions, lowest precedence first, as in Jinja's parser.

  Result<ExprPtr> parse_expression() {
    return nested([&] { return parse_conditional(); });
  }

  Result<ExprPtr> parse_conditional() {
    const SourcePos pos = cur().pos;
    KUIPER_ASSIGN_OR_RETURN(ExprPtr expr, parse_or());
    while (at_name("if")) {
      advance();
      auto node = make(Expr::Kind::kConditional, pos);
      KUIPER_ASSIGN_OR_RETURN(ExprPtr condition, parse_or());
      ExprPtr otherwise;
      if (at_name("else")) {
        advance();
        KUIPER_ASSIGN_OR_RETURN(otherwise, parse_expression());
      }
      node->operands.push_back(std::move(expr));
      node->operands.push_back(std::move(condition));
      node->operands.push_back(std::move(otherwise));
      expr = std::move(node);
    }
    return expr;
  }

  Result<ExprPtr> binary(const std::string& op, SourcePos pos, ExprPtr lhs, ExprPtr rhs) {
    auto node = make(Expr::Kind::kBinary, pos);
    node->name = op;
    node->operands.push_back(std::move(lhs));
    node->operands.push_back(std::move(rhs));
    return node;
  }

  Result<ExprPtr> parse_or() {
    KUIPER_ASSIGN_OR_RETURN(ExprPtr lhs, parse_and());
    while (at_name("or")) {
      const SourcePos pos = cur().pos;
      advance();
      KUIPER_ASSIGN_OR_RETURN(ExprPtr rhs, parse_and());
      KUIPER_ASSIGN_OR_RETURN(lhs, binary("or", pos, std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  Result<ExprPtr> parse_and() {
    KUIPER_ASSIGN_OR_RETURN(ExprPtr lhs, parse_not());
    while (at_name("and")) {
      const SourcePos pos = cur().pos;
      advance();
      KUIPER_ASSIGN_OR_RETURN(ExprPtr rhs, parse_not());
      KUIPER_ASSIGN_OR_RETURN(lhs, binary("and", pos, std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  Result<ExprPtr> parse_not() {
    if (!at_name("not")) return parse_compare();
    auto node = make(Expr::Kind::kNot, cur().pos);
    advance();
    KUIPER_ASSIGN_OR_RETURN(ExprPtr operand, nested([&] { return parse_not(); }));
    node->operands.push_back(std::move(operand));
    return node;
  }

  Result<ExprPtr> parse_compare() {
    const SourcePos pos = cur().pos;
    KUIPER_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    ExprPtr node;
    while (true) {
      std::string op;
      if (cur().kind == TokenKind::kOperator &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (at_name("in")) {
        op = "in";
        advance();
      } else if (at_name("not") && peek().kind == TokenKind::kName && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      if (node == nullptr) {
        node = make(Expr::Kind::kCompare, pos);
        node->operands.push_back(std::move(first));
      }
      KUIPER_ASSIGN_OR_RETURN(ExprPtr rhs, parse_math1());
      node->operands.push_back(std::move(rhs));
      node->compare_ops.push_back(op);
    }
    return node != nullptr ? std::move(node) : std::move(first);
  }

  Result<ExprPtr> parse_math1() {
    KUIPER_ASSIGN_OR_RETURN(ExprPtr lhs, parse_concat());
    while (at_op("+") || at_op("-")) {
      const std::string op = cur().text;
      const SourcePos pos = cur().pos;
      advance();
      KUIPER_ASSIGN_OR_RETURN(ExprPtr rhs, parse_concat());
      KUIPER_ASSIGN_OR_RETURN(lhs, binary(op, pos, std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  Result<ExprPtr> parse_concat() {
    KUIPER_ASSIGN_OR_RETURN(ExprPtr lhs, parse_math2());
    while (at_op("~")) {
      const SourcePos pos = cur().pos;
      advance();
      KUIPER_ASSIGN_OR_RETURN(ExprPtr rhs, parse_math2());
      KUIPER_ASSIGN_OR_RETURN(lhs, binary("~", pos, std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  Result<ExprPtr> parse_math2() {
    KUIPER_ASSIGN_OR_RETURN(ExprPtr lhs, parse_pow());
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const std::string op = cur().text;
      const SourcePos pos = cur().pos;
      advance();
      KUIPER_ASSIGN_OR_RETURN(ExprPtr rhs, parse_pow());
      KUIPER_ASSIGN_OR_RETURN(lhs, binary(op, pos, std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  Result<ExprPtr> parse_pow() {
    KUIPER_ASSIGN_OR_RETURN(ExprPtr lhs, parse_unary(true));
    while (at_op("**")) {
      const SourcePos pos = cur().pos;
      advance();
      KUIPER_ASSIGN_OR_RETURN(ExprPtr rhs, parse_unary(true));
      KUIPER_ASSIGN_OR_RETURN(lhs, binary("**", pos, std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  // "-x|f" is "(-x)|f": the sign binds tighter than filters, which apply to the signed value.
  Result<ExprPtr> parse_unary(bool with_filter) {
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      node = make(Expr::Kind::kNegate, cur().pos);
      node->name = cur().text;
      advance();
      KUIPER_ASSIGN_OR_RETURN(ExprPtr operand, nested([&] { return parse_unary(false); }));
      node->operands.push_back(std::move(operand));
    } else {
      KUIPER_ASSIGN_OR_RETURN(node, parse_primary());
    }
    KUIPER_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
    if (with_filter) {
      KUIPER_ASSIGN_OR_RETURN(node, parse_filter_expr(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> parse_primary() {
    const Token& t = cur();
    switch (t.kind) {
      case TokenKind::kName: {
        auto node = make(Expr::Kind::kLiteral, t.pos);
        if (t.text == "true" || t.text == "True") {
          node->literal = true;
        } else if (t.text == "false" || t.text == "False") {
          node->literal = false;
        } else if (t.text == "none" || t.text == "None") {
          node->literal = nullptr;
        } else {
          node->kind = Expr::Kind::kName;
          node->name = t.text;
        }
        advance();
        return node;
      }
      case TokenKind::kString: {
        auto node = make(Expr::Kind::kLiteral, t.pos);
        std::string value;
        // Adjacent literals concatenate, as in Python.
        while (cur().kind == TokenKind::kString) {
          value += cur().text;
          advance();
        }
        node->literal = std::move(value);
        return node;
      }
      case TokenKind::kInteger: {
        auto node = make(Expr::Kind::kLiteral, t.pos);
        errno = 0;
        const long long value = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) return fail(t, "integer literal " + t.text + " is too large");
        node->literal = static_cast<int64_t>(value);
        advance();
        return node;
      }
      case TokenKind::kFloat: {
        auto node = make(Expr::Kind::kLiteral, t.pos);
        node->literal = std::strtod(t.text.c_str(), nullptr);
        advance();
        return node;
      }
      case TokenKind::kOperator:
        if (t.text == "(") return parse_parenthesized();
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    return unexpected("an expression");
  }

  // (x) is x; (), (x,) and (x, y) are tuples, which behave as lists here.
  Result<ExprPtr> parse_parenthesized() {
    auto tuple = make(Expr::Kind::kList, cur().pos);
    advance();
    bool saw_comma = false;
    while (!at_op(")")) {
      KUIPER_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
      tuple->operands.push_back(std::move(item));
      if (!at_op(",")) break;
      saw_comma = true;
      advance();
    }
    KUIPER_RETURN_IF_ERROR(expect_op(")"));
    if (tuple->operands.size() == 1 && !saw_comma) return std::move(tuple->operands[0]);
    return tuple;
  }

  Result<ExprPtr> parse_list() {
    auto list = make(Expr::Kind::kList, cur().pos);
    advance();
    while (!at_op("]")) {
      KUIPER_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
      list->operands.push_back(std::move(item));
      if (!at_op(",")) break;
      advance();
    }
    KUIPER_RETURN_IF_ERROR(expect_op("]"));
    return list;
  }

  Result<ExprPtr> parse_dict() {
    auto dict = make(Expr::Kind::kDict, cur().pos);
    advance();
    while (!at_op("}")) {
      KUIPER_ASSIGN_OR_RETURN(ExprPtr key, parse_expression());
      KUIPER_RETURN_IF_ERROR(expect_op(":"));
      KUIPER_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
      dict->operands.push_back(std::move(key));
      dict->operands.push_back(std::move(value));
      if (!at_op(",")) break;
      advance();
    }
    KUIPER_RETURN_IF_ERROR(expect_op("}"));
    return dict;
  }

  Result<ExprPtr> parse_postfix(ExprPtr node) {
    while (true) {
      if (at_op(".")) {
        auto attr = make(Expr::Kind::kGetAttr, cur().pos);
        advance();
        if (cur().kind != TokenKind::kName && cur().kind != TokenKind::kInteger) return unexpected("an attribute name");
        attr->name = cur().text;
        attr->is_index = cur().kind == TokenKind::kInteger;
        advance();
        attr->operands.push_back(std::move(node));
        node = std::move(attr);
      } else if (at_op("[")) {
        KUIPER_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node)));
      } else if (at_op("(")) {
        KUIPER_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr object) {
    const SourcePos pos = cur().pos;
    advance();  // [
    ExprPtr start;
    if (!at_op(":")) {
      KUIPER_ASSIGN_OR_RETURN(start, parse_expression());
      if (at_op("]")) {
        advance();
        auto item = make(Expr::Kind::kGetItem, pos);
        item->operands.push_back(std::move(object));
        item->operands.push_back(std::move(start));
        return item;
      }
      if (!at_op(":")) return unexpected("']' or ':'");
    }
    advance();  // :
    auto slice = make(Expr::Kind::kSlice, pos);
    slice->operands.push_back(std::move(object));
    slice->operands.push_back(std::move(start));
    ExprPtr stop, step;
    if (!at_op("]") && !at_op(":")) {
      KUIPER_ASSIGN_OR_RETURN(stop, parse_expression());
    }
    if (at_op(":")) {
      advance();
      if (!at_op("]")) {
        KUIPER_ASSIGN_OR_RETURN(step, parse_expression());
      }
    }
    KUIPER_RETURN_IF_ERROR(expect_op("]"));
    slice->operands.push_back(std::move(stop));
    slice->operands.push_back(std::move(step));
    return slice;
  }

  Result<CallArguments> parse_arguments() {
    CallArguments args;
    advance();  // (
    while (!at_op(")")) {
      if (at_op("*") || at_op("**")) return fail(cur(), "*args and **kwargs in calls are not supported");
      if (cur().kind == TokenKind::kName && peek().kind == TokenKind::kOperator && peek().text == "=") {
        std::string name = cur().text;
        advance();
        advance();
        KUIPER_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
        args.named.emplace_back(std::move(name), std::move(value));
      } else {
        if (!args.named.empty()) return fail(cur(), "positional argument follows keyword argument");
        KUIPER_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
        args.positional.push_back(std::move(value));
      }
      if (!at_op(",")) break;
      advance();
    }
    KUIPER_RETURN_IF_ERROR(expect_op(")"));
    return args;
  }

  // Errors from the call (raise_exception's among them) point at what was called.
  Result<ExprPtr> parse_call(ExprPtr callee) {
    auto call = make(Expr::Kind::kCall, callee->pos);
    KUIPER_ASSIGN_OR_RETURN(call->arguments, parse_arguments());
    call->operands.push_back(std::move(callee));
    return call;
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr node) {
    while (true) {
      if (at_op("|")) {
        advance();
        auto filter = make(Expr::Kind::kFilter, cur().pos);
        const Token& name_token = cur();
        KUIPER_ASSIGN_OR_RETURN(filter->name, expect_name("a filter name"));
        if (!has_filter(filter->name)) return fail(name_token, "no filter named " + in_quotes(filter->name));
        if (at_op("(")) {
          KUIPER_ASSIGN_OR_RETURN(filter->arguments, parse_arguments());
        }
        filter->operands.push_back(std::move(node));
        node = std::move(filter);
      } else if (at_name("is")) {
        auto test = make(Expr::Kind::kTest, cur().pos);
        advance();
        if (at_name("not")) {
          test->negated = true;
          advance();
        }
        const Token& name_token = cur();
        KUIPER_ASSIGN_OR_RETURN(test->name, expect_name("a test name"));
        if (!has_test(test->name)) return fail(name_token, "no test named " + in_quotes(test->name));
        if (at_op("(")) {
          KUIPER_ASSIGN_OR_RETURN(test->arguments, parse_arguments());
        } else if (starts_bare_test_argument()) {
          // "is divisibleby 3", "is sameas false": one argument without parentheses.
          KUIPER_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
          KUIPER_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
          test->arguments.positional.push_back(std::move(arg));
        }
        test->operands.push_back(std::move(node));
        node = std::move(test);
      } else if (at_op("(")) {
        KUIPER_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  bool starts_bare_test_argument() const {
    const Token& t = cur();
    if (t.kind == TokenKind::kName) return t.text != "else" && t.text != "or" && t.text != "and";
    return t.kind == TokenKind::kString || t.kind == TokenKind::kInteger || t.kind == TokenKind::kFloat ||
           (t.kind == TokenKind::kOperator && (t.text == "[" || t.text == "{"));
  }

  std::vector<Token> tokens_;
  size_t i_ = 0;
  int nesting_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Result<Template> parse(std::string_view source) {
  KUIPER_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source));
  return Parser(std::move(tokens)).parse_template();
}

}  // namespace kuiper::jinja
