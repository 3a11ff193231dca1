// The syntax tree of a parsed Jinja template: expressions and statements as tagged structs, one
// kind per Jinja construct, so the interpreter is one switch per node family.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/tokenizer/jinja/lexer.h"

namespace kuiper::jinja {

// Insertion-ordered like Python's dict, so tojson prints keys in the order the caller gave them.
using Json = nlohmann::ordered_json;

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct CallArguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> named;
};

struct Expr {
  enum class Kind {
    kLiteral,      // literal
    kName,         // name
    kList,         // operands: the items (tuples are lists too)
    kDict,         // operands: key, value, key, value, ...
    kGetAttr,      // operands[0].name, also obj.0 with name "0" and is_index
    kGetItem,      // operands[0][operands[1]]
    kSlice,        // operands[0][start:stop:step], absent parts are null
    kCall,         // operands[0](arguments)
    kFilter,       // operands[0] | name(arguments)
    kTest,         // operands[0] is [not] name(arguments)
    kNot,          // not operands[0]
    kNegate,       // -operands[0] (name "-") or +operands[0] (name "+")
    kBinary,       // operands[0] name operands[1]; name is + - * / // % ** ~ and or
    kCompare,      // operands[0] compare_ops[0] operands[1] compare_ops[1] ... (chained)
    kConditional,  // operands[0] if operands[1] else operands[2] (null when absent)
  };

  Expr(Kind k, SourcePos p) : kind(k), pos(p) {}
  ~Expr();
  Expr(const Expr&) = delete;
  Expr& operator=(const Expr&) = delete;

  Kind kind;
  SourcePos pos;
  Json literal;
  std::string name;
  std::vector<ExprPtr> operands;
  std::vector<std::string> compare_ops;  // == != < <= > >= in "not in"
  CallArguments arguments;
  bool negated = false;   // kTest: "is not"
  bool is_index = false;  // kGetAttr: obj.0 means obj[0]
};

// Iterative: a long operator chain (a ~ b ~ c ~ ...) is a tree as deep as the chain is long,
// which must not cost a stack frame per level to free.
inline Expr::~Expr() {
  std::vector<ExprPtr> pending;
  auto take_children = [&pending](Expr& e) {
    for (ExprPtr& child : e.operands) pending.push_back(std::move(child));
    for (ExprPtr& child : e.arguments.positional) pending.push_back(std::move(child));
    for (auto& named : e.arguments.named) pending.push_back(std::move(named.second));
  };
  take_children(*this);
  while (!pending.empty()) {
    ExprPtr e = std::move(pending.back());
    pending.pop_back();
    if (e != nullptr) take_children(*e);
  }
}

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches (condition, body) in order, then else_body
    kFor,       // for targets in expr [if filter]: body, else_body when nothing was iterated
    kSet,       // set name[.attribute] = expr, or {% set name %}body{% endset %} when expr is null
    kMacro,     // macro name(params = defaults): body
    kBreak,
    kContinue,
  };

  Node(Kind k, SourcePos p) : kind(k), pos(p) {}

  Kind kind;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  ExprPtr filter;
  std::string name;
  std::string attribute;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null where it has none
};

struct Template {
  Body body;
};

}  // namespace kuiper::jinja
