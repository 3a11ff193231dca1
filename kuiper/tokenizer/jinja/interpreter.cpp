#include "kuiper/tokenizer/jinja/interpreter.h"

#include <memory>
#include <unordered_map>
#include <utility>

#include "kuiper/tokenizer/jinja/builtins.h"
#include "kuiper/tokenizer/jinja/value.h"

namespace kuiper::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> variables;
};

// The scope holds the macro and the macro points back at the scope, so the back pointer is weak
// to let both go when rendering ends.
struct MacroDefinition {
  const Node* node = nullptr;
  std::weak_ptr<Scope> closure;
};

namespace {

enum class Flow { kNormal, kBreak, kContinue };

// Deep enough for any real template, shallow enough that runaway recursion fails cleanly
// instead of overflowing the stack.
constexpr int kMaxMacroDepth = 200;
// Nested statements and expressions being run at once (macro calls included): a chat template
// needs a few dozen; a few hundred frames fit any thread's stack.
constexpr int kMaxDepth = 400;
// Loop iterations in one render, all loops together: a conversation of a million messages, but
// not nested range(100000) loops.
constexpr int64_t kMaxLoopSteps = int64_t{1} << 20;

// Counts one level of nesting for as long as it lives.
class Nesting {
 public:
  explicit Nesting(int& depth) : depth_(depth) { ++depth_; }
  ~Nesting() { --depth_; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;

 private:
  int& depth_;
};

Status error_at(SourcePos pos, const std::string& message) { return Status::Error(describe(pos) + ": " + message); }

// Value operations and builtins report errors without a position; the failing expression adds it.
template <typename T>
Result<T> located(SourcePos pos, Result<T> result) {
  if (result.ok()) return result;
  return error_at(pos, result.status().message());
}

const Value* lookup(const Scope& scope, const std::string& name) {
  for (const Scope* s = &scope; s != nullptr; s = s->parent.get()) {
    const auto it = s->variables.find(name);
    if (it != s->variables.end()) return &it->second;
  }
  return nullptr;
}

Result<bool> compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "in") return contains(b, a);
  if (op == "not in") {
    KUIPER_ASSIGN_OR_RETURN(const bool found, contains(b, a));
    return !found;
  }
  KUIPER_ASSIGN_OR_RETURN(const bool reversed, op == "<=" ? less(b, a) : less(a, b));
  return !reversed;  // a <= b is not (b < a); a >= b is not (a < b)
}

std::shared_ptr<Scope> child_of(const std::shared_ptr<Scope>& parent) {
  auto scope = std::make_shared<Scope>();
  scope->parent = parent;
  return scope;
}

class Interpreter {
 public:
  Result<Flow> exec_body(const Body& body, const std::shared_ptr<Scope>& scope, std::string* out) {
    for (const Node& node : body) {
      KUIPER_ASSIGN_OR_RETURN(const Flow flow, exec(node, scope, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  Status too_deep(SourcePos pos) const {
    return error_at(pos, "template nested deeper than " + std::to_string(kMaxDepth) + " levels");
  }

  Status append(SourcePos pos, const std::string& text, std::string* out) const {
    if (text.size() > kMaxStringBytes - out->size()) {
      return error_at(pos, "template output passes " + std::to_string(kMaxStringBytes) + " bytes");
    }
    *out += text;
    return Status::Ok();
  }

  Result<Flow> exec(const Node& node, const std::shared_ptr<Scope>& scope, std::string* out) {
    const Nesting nesting(depth_);
    if (depth_ > kMaxDepth) return too_deep(node.pos);
    switch (node.kind) {
      case Node::Kind::kText:
        KUIPER_RETURN_IF_ERROR(append(node.pos, node.text, out));
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        KUIPER_ASSIGN_OR_RETURN(const Value value, eval(*node.expr, *scope));
        KUIPER_RETURN_IF_ERROR(append(node.pos, to_string(value), out));
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [condition, branch] : node.branches) {
          KUIPER_ASSIGN_OR_RETURN(const Value value, eval(*condition, *scope));
          if (truthy(value)) return exec_body(branch, scope, out);
        }
        return exec_body(node.else_body, scope, out);
      case Node::Kind::kFor: return exec_for(node, scope, out);
      case Node::Kind::kSet: return exec_set(node, scope);
      case Node::Kind::kMacro: {
        auto macro = std::make_shared<MacroDefinition>();
        macro->node = &node;
        macro->closure = scope;
        scope->variables[node.name] = Value::macro(std::move(macro), node.name);
        return Flow::kNormal;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Status bind_targets(const Node& node, const Value& item, Scope* scope) {
    if (node.targets.size() == 1) {
      scope->variables[node.targets[0]] = item;
      return Status::Ok();
    }
    if (!item.is_list() || item.json().size() != node.targets.size()) {
      return error_at(node.pos, "cannot unpack " + to_string(item) + " into " + std::to_string(node.targets.size()) +
                                    " loop variables");
    }
    for (size_t i = 0; i < node.targets.size(); ++i) {
      scope->variables[node.targets[i]] = Value::element(item, item.json()[i]);
    }
    return Status::Ok();
  }

  Status count_loop_step(SourcePos pos) {
    if (++loop_steps_ > kMaxLoopSteps) {
      return error_at(pos, "loops ran more than " + std::to_string(kMaxLoopSteps) + " iterations");
    }
    return Status::Ok();
  }

  Result<Flow> exec_for(const Node& node, const std::shared_ptr<Scope>& scope, std::string* out) {
    KUIPER_ASSIGN_OR_RETURN(const Value iterable, eval(*node.expr, *scope));
    KUIPER_ASSIGN_OR_RETURN(std::vector<Value> items, located(node.expr->pos, iterate(iterable)));
    if (node.filter != nullptr) {
      // "for x in xs if cond" filters before counting, so loop.length and loop.last see only
      // the kept items.
      std::vector<Value> kept;
      for (const Value& item : items) {
        KUIPER_RETURN_IF_ERROR(count_loop_step(node.pos));
        auto probe = child_of(scope);
        KUIPER_RETURN_IF_ERROR(bind_targets(node, item, probe.get()));
        KUIPER_ASSIGN_OR_RETURN(const Value keep, eval(*node.filter, *probe));
        if (truthy(keep)) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_body(node.else_body, scope, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      KUIPER_RETURN_IF_ERROR(count_loop_step(node.pos));
      // A fresh scope per iteration: a {% set %} in the body does not survive into the next
      // iteration or after the loop (which is why templates use namespace()).
      auto iteration = child_of(scope);
      KUIPER_RETURN_IF_ERROR(bind_targets(node, items[static_cast<size_t>(i)], iteration.get()));
      auto loop = std::make_shared<Object>();
      loop->type_name = "LoopContext";
      auto& a = loop->attributes;
      a["index"] = Value::data(i + 1);
      a["index0"] = Value::data(i);
      a["revindex"] = Value::data(n - i);
      a["revindex0"] = Value::data(n - i - 1);
      a["first"] = Value::data(i == 0);
      a["last"] = Value::data(i == n - 1);
      a["length"] = Value::data(n);
      a["depth"] = Value::data(1);
      a["depth0"] = Value::data(0);
      a["previtem"] = i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item");
      a["nextitem"] = i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item");
      iteration->variables["loop"] = Value::object(std::move(loop));
      KUIPER_ASSIGN_OR_RETURN(const Flow flow, exec_body(node.body, iteration, out));
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Result<Flow> exec_set(const Node& node, const std::shared_ptr<Scope>& scope) {
    Value value;
    if (node.expr != nullptr) {
      KUIPER_ASSIGN_OR_RETURN(value, eval(*node.expr, *scope));
    } else {
      std::string captured;
      const Result<Flow> flow = exec_body(node.body, child_of(scope), &captured);
      if (!flow.ok()) return flow.status();
      value = Value::data(std::move(captured));
    }
    if (node.attribute.empty()) {
      scope->variables[node.name] = std::move(value);
      return Flow::kNormal;
    }
    const Value* target = lookup(*scope, node.name);
    if (target == nullptr || target->kind() != Value::Kind::kObject || !target->object()->assignable) {
      return error_at(node.pos, "cannot set '" + node.name + "." + node.attribute + "': '" + node.name +
                                    "' is not a namespace() object");
    }
    target->object()->attributes[node.attribute] = std::move(value);
    return Flow::kNormal;
  }

  Result<Arguments> eval_arguments(const CallArguments& call, const Scope& scope) {
    Arguments args;
    for (const ExprPtr& e : call.positional) {
      KUIPER_ASSIGN_OR_RETURN(Value v, eval(*e, scope));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [name, e] : call.named) {
      KUIPER_ASSIGN_OR_RETURN(Value v, eval(*e, scope));
      args.named.emplace_back(name, std::move(v));
    }
    return args;
  }

  Result<std::optional<int64_t>> slice_bound(const Expr* e, const Scope& scope) {
    if (e == nullptr) return std::optional<int64_t>();
    KUIPER_ASSIGN_OR_RETURN(const Value v, eval(*e, scope));
    if (v.is_undefined() || (v.is_data() && v.json().is_null())) return std::optional<int64_t>();
    if (!v.is_integer()) return error_at(e->pos, "slice indices must be integers, not " + type_name(v));
    return std::optional<int64_t>(v.integer());
  }

  // Every value an expression makes is checked against the size limits.
  Result<Value> eval(const Expr& e, const Scope& scope) {
    const Nesting nesting(depth_);
    if (depth_ > kMaxDepth) return too_deep(e.pos);
    KUIPER_ASSIGN_OR_RETURN(Value v, eval_node(e, scope));
    const Status size = check_size(v);
    if (!size.ok()) return error_at(e.pos, size.message());
    return v;
  }

  Result<Value> eval_node(const Expr& e, const Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return Value::data(e.literal);
      case Expr::Kind::kName: {
        if (const Value* v = lookup(scope, e.name)) return *v;
        if (has_global_function(e.name)) return Value::function(e.name);
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kList: {
        Json list = Json::array();
        for (const ExprPtr& item : e.operands) {
          KUIPER_ASSIGN_OR_RETURN(const Value v, eval(*item, scope));
          KUIPER_ASSIGN_OR_RETURN(Json j, located(item->pos, to_json(v)));
          list.push_back(std::move(j));
        }
        return Value::data(std::move(list));
      }
      case Expr::Kind::kDict: {
        Json dict = Json::object();
        for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
          KUIPER_ASSIGN_OR_RETURN(const Value key, eval(*e.operands[i], scope));
          if (!key.is_string()) return error_at(e.operands[i]->pos, "dict keys must be strings, not " + type_name(key));
          KUIPER_ASSIGN_OR_RETURN(const Value v, eval(*e.operands[i + 1], scope));
          KUIPER_ASSIGN_OR_RETURN(dict[key.string()], located(e.operands[i + 1]->pos, to_json(v)));
        }
        return Value::data(std::move(dict));
      }
      case Expr::Kind::kGetAttr: {
        KUIPER_ASSIGN_OR_RETURN(const Value object, eval(*e.operands[0], scope));
        if (e.is_index) return located(e.pos, get_item(object, Value::data(std::stoll(e.name))));
        return located(e.pos, get_attribute(object, e.name));
      }
      case Expr::Kind::kGetItem: {
        KUIPER_ASSIGN_OR_RETURN(const Value object, eval(*e.operands[0], scope));
        KUIPER_ASSIGN_OR_RETURN(const Value key, eval(*e.operands[1], scope));
        return located(e.pos, get_item(object, key));
      }
      case Expr::Kind::kSlice: {
        KUIPER_ASSIGN_OR_RETURN(const Value object, eval(*e.operands[0], scope));
        KUIPER_ASSIGN_OR_RETURN(const auto start, slice_bound(e.operands[1].get(), scope));
        KUIPER_ASSIGN_OR_RETURN(const auto stop, slice_bound(e.operands[2].get(), scope));
        KUIPER_ASSIGN_OR_RETURN(const auto step, slice_bound(e.operands[3].get(), scope));
        return located(e.pos, get_slice(object, start, stop, step));
      }
      case Expr::Kind::kCall: return eval_call(e, scope);
      case Expr::Kind::kFilter: {
        KUIPER_ASSIGN_OR_RETURN(const Value input, eval(*e.operands[0], scope));
        KUIPER_ASSIGN_OR_RETURN(const Arguments args, eval_arguments(e.arguments, scope));
        return located(e.pos, apply_filter(e.name, input, args));
      }
      case Expr::Kind::kTest: {
        KUIPER_ASSIGN_OR_RETURN(const Value input, eval(*e.operands[0], scope));
        KUIPER_ASSIGN_OR_RETURN(const Arguments args, eval_arguments(e.arguments, scope));
        KUIPER_ASSIGN_OR_RETURN(const bool passed, located(e.pos, apply_test(e.name, input, args)));
        return Value::data(passed != e.negated);
      }
      case Expr::Kind::kNot: {
        KUIPER_ASSIGN_OR_RETURN(const Value v, eval(*e.operands[0], scope));
        return Value::data(!truthy(v));
      }
      case Expr::Kind::kNegate: {
        KUIPER_ASSIGN_OR_RETURN(const Value v, eval(*e.operands[0], scope));
        return located(e.pos, negate(e.name, v));
      }
      case Expr::Kind::kBinary: return eval_binary(e, scope);
      case Expr::Kind::kCompare: {
        KUIPER_ASSIGN_OR_RETURN(Value left, eval(*e.operands[0], scope));
        for (size_t i = 0; i < e.compare_ops.size(); ++i) {
          KUIPER_ASSIGN_OR_RETURN(Value right, eval(*e.operands[i + 1], scope));
          KUIPER_ASSIGN_OR_RETURN(const bool holds, located(e.operands[i + 1]->pos, compare(e.compare_ops[i], left, right)));
          if (!holds) return Value::data(false);
          left = std::move(right);
        }
        return Value::data(true);
      }
      case Expr::Kind::kConditional: {
        KUIPER_ASSIGN_OR_RETURN(const Value condition, eval(*e.operands[1], scope));
        if (truthy(condition)) return eval(*e.operands[0], scope);
        if (e.operands[2] != nullptr) return eval(*e.operands[2], scope);
        return Value::undefined("the inline if-expression evaluated to false and has no else");
      }
    }
    return error_at(e.pos, "unknown expression");
  }

  // and/or return an operand, not a bool, as in Python; ~ joins the str() of both sides.
  Result<Value> eval_binary(const Expr& e, const Scope& scope) {
    KUIPER_ASSIGN_OR_RETURN(Value left, eval(*e.operands[0], scope));
    if (e.name == "and" && !truthy(left)) return left;
    if (e.name == "or" && truthy(left)) return left;
    KUIPER_ASSIGN_OR_RETURN(Value right, eval(*e.operands[1], scope));
    if (e.name == "and" || e.name == "or") return right;
    if (e.name == "~") {
      std::string joined = to_string(left);
      KUIPER_RETURN_IF_ERROR(append(e.pos, to_string(right), &joined));
      return Value::data(std::move(joined));
    }
    return located(e.pos, arithmetic(e.name, left, right));
  }

  Result<Value> eval_call(const Expr& e, const Scope& scope) {
    const Expr& callee = *e.operands[0];
    Value function;
    if (callee.kind == Expr::Kind::kGetAttr && !callee.is_index) {
      // Like Python's getattr, a method of str or dict wins over a key of the same name.
      KUIPER_ASSIGN_OR_RETURN(const Value object, eval(*callee.operands[0], scope));
      if (has_method(object, callee.name)) {
        KUIPER_ASSIGN_OR_RETURN(const Arguments args, eval_arguments(e.arguments, scope));
        return located(callee.pos, call_method(object, callee.name, args));
      }
      KUIPER_ASSIGN_OR_RETURN(function, located(callee.pos, get_attribute(object, callee.name)));
    } else {
      KUIPER_ASSIGN_OR_RETURN(function, eval(callee, scope));
    }
    KUIPER_ASSIGN_OR_RETURN(const Arguments args, eval_arguments(e.arguments, scope));
    switch (function.kind()) {
      case Value::Kind::kMacro: return call_macro(function, args, e.pos);
      case Value::Kind::kFunction: return located(e.pos, call_global_function(function.text(), args));
      case Value::Kind::kUndefined: return error_at(e.pos, undefined_error(function).message());
      default: return error_at(e.pos, "'" + type_name(function) + "' object is not callable");
    }
  }

  Result<Value> call_macro(const Value& function, const Arguments& args, SourcePos pos) {
    const MacroDefinition& macro = *function.macro();
    const Node& node = *macro.node;
    const std::shared_ptr<Scope> closure = macro.closure.lock();
    if (closure == nullptr) return error_at(pos, "macro '" + node.name + "' is called after its scope ended");
    if (call_depth_ >= kMaxMacroDepth) {
      return error_at(pos, "macro calls nested deeper than " + std::to_string(kMaxMacroDepth));
    }
    if (args.positional.size() > node.params.size()) {
      return error_at(pos, "macro '" + node.name + "' takes not more than " + std::to_string(node.params.size()) +
                               " argument(s)");
    }
    auto scope = child_of(closure);
    std::vector<bool> bound(node.params.size(), false);
    for (size_t i = 0; i < args.positional.size(); ++i) {
      scope->variables[node.params[i]] = args.positional[i];
      bound[i] = true;
    }
    for (const auto& [name, value] : args.named) {
      size_t i = 0;
      while (i < node.params.size() && node.params[i] != name) ++i;
      if (i == node.params.size()) return error_at(pos, "macro '" + node.name + "' has no parameter '" + name + "'");
      if (bound[i]) return error_at(pos, "macro '" + node.name + "' got multiple values for '" + name + "'");
      scope->variables[name] = value;
      bound[i] = true;
    }
    for (size_t i = 0; i < node.params.size(); ++i) {
      if (bound[i]) continue;
      if (node.defaults[i] != nullptr) {
        KUIPER_ASSIGN_OR_RETURN(scope->variables[node.params[i]], eval(*node.defaults[i], *scope));
      } else {
        scope->variables[node.params[i]] = Value::undefined("parameter '" + node.params[i] + "' was not provided");
      }
    }
    std::string out;
    ++call_depth_;
    const Result<Flow> flow = exec_body(node.body, scope, &out);
    --call_depth_;
    if (!flow.ok()) return flow.status();
    return Value::data(std::move(out));
  }

  int call_depth_ = 0;
  int depth_ = 0;
  int64_t loop_steps_ = 0;
};

}  // namespace

Result<std::string> render(const Template& tmpl, Json variables) {
  if (!variables.is_object()) return Status::Error("template variables must be a JSON object");
  // One copy of the caller's data; every top-level variable is a view into it.
  const Value storage = Value::data(std::move(variables));
  auto root = std::make_shared<Scope>();
  for (const auto& [name, value] : storage.json().items()) root->variables[name] = Value::element(storage, value);
  std::string out;
  Interpreter interpreter;
  const Result<Flow> flow = interpreter.exec_body(tmpl.body, root, &out);
  if (!flow.ok()) return flow.status();
  return out;
}

}  // namespace kuiper::jinja
