#include "kuiper/tokenizer/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include "kuiper/base/json_reader.h"

namespace kuiper {
namespace {

using nlohmann::json;

// A node's "type" string, or the node itself for messages.
std::string type_of(const JsonReader& node) {
  Result<std::string> type = node.get_string("type");
  return type.ok() ? *type : node.json().dump();
}

// An optional member read as a node: absent or null is a null node.
JsonReader member_or_null(const JsonReader& parent, const std::string& key) {
  static const json kNull;
  return parent.has(key) ? *parent.at(key) : JsonReader(kNull, "");
}

Status read_normalizer(const JsonReader& root, TokenizerSpec* spec) {
  const JsonReader normalizer = member_or_null(root, "normalizer");
  if (normalizer.json().is_null()) return Status::Ok();
  if (type_of(normalizer) != "NFC") {
    return Status::Error("normalizer " + type_of(normalizer) + " is not supported (only NFC)");
  }
  spec->nfc = true;
  return Status::Ok();
}

Status read_split(const JsonReader& split, TokenizerSpec* spec) {
  KUIPER_ASSIGN_OR_RETURN(std::string behavior, split.get_string_or("behavior", ""));
  KUIPER_ASSIGN_OR_RETURN(bool invert, split.get_bool_or("invert", false));
  if (behavior != "Isolated" || invert) {
    return Status::Error("only a Split pre-tokenizer with behavior Isolated and invert false "
                         "is supported");
  }
  KUIPER_ASSIGN_OR_RETURN(JsonReader pattern, split.at("pattern"));
  if (pattern.has("Regex")) {
    KUIPER_ASSIGN_OR_RETURN(spec->split_pattern, pattern.get_string("Regex"));
  } else if (pattern.has("String")) {
    KUIPER_ASSIGN_OR_RETURN(spec->split_pattern, pattern.get_string("String"));
    spec->split_pattern_is_literal = true;
  } else {
    return Status::Error("Split pattern " + pattern.json().dump() + " is neither Regex nor String");
  }
  return Status::Ok();
}

Status read_pre_tokenizer(const JsonReader& root, TokenizerSpec* spec) {
  const JsonReader pre = member_or_null(root, "pre_tokenizer");
  const std::string expected = "a Sequence of Split and ByteLevel (use_regex false)";
  const Status unsupported =
      Status::Error("pre_tokenizer " + type_of(pre) + " is not supported (only " + expected + ")");
  if (type_of(pre) != "Sequence" || !pre.has("pretokenizers")) return unsupported;
  KUIPER_ASSIGN_OR_RETURN(JsonReader list, pre.at("pretokenizers"));
  KUIPER_ASSIGN_OR_RETURN(std::vector<JsonReader> steps, list.elements());
  if (steps.size() != 2) return unsupported;
  const JsonReader& split = steps[0];
  const JsonReader& byte_level = steps[1];
  KUIPER_ASSIGN_OR_RETURN(bool use_regex, byte_level.get_bool_or("use_regex", true));
  KUIPER_ASSIGN_OR_RETURN(bool prefix_space, byte_level.get_bool_or("add_prefix_space", true));
  if (type_of(split) != "Split" || type_of(byte_level) != "ByteLevel" || use_regex ||
      prefix_space) {
    return Status::Error("pre_tokenizer is not " + expected + " without add_prefix_space");
  }
  return read_split(split, spec);
}

// A token id: non-negative and below kMaxTokenId, since the tokenizer sizes its id table by the
// largest one.
Result<int32_t> read_id(const JsonReader& id) {
  KUIPER_ASSIGN_OR_RETURN(int64_t value, id.to_int(0, kMaxTokenId - 1));
  return static_cast<int32_t>(value);
}

Status read_model(const JsonReader& root, TokenizerSpec* spec) {
  KUIPER_ASSIGN_OR_RETURN(JsonReader model, root.at("model"));
  if (type_of(model) != "BPE") {
    return Status::Error("model " + type_of(model) + " is not supported (only BPE)");
  }
  const json& m = model.json();
  const auto set = [&](const char* key) {
    return m.contains(key) && !m[key].is_null() && m[key] != false && m[key] != "";
  };
  for (const char* key : {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                          "byte_fallback", "ignore_merges"}) {
    if (set(key)) {
      return Status::Error(std::string("BPE option ") + key + " = " + m[key].dump() +
                           " is not supported");
    }
  }
  KUIPER_ASSIGN_OR_RETURN(JsonReader vocab_node, model.at("vocab"));
  KUIPER_ASSIGN_OR_RETURN(auto vocab, vocab_node.members());
  spec->vocab.reserve(vocab.size());
  for (const auto& [token, id_node] : vocab) {
    KUIPER_ASSIGN_OR_RETURN(int32_t id, read_id(id_node));
    spec->vocab.emplace(token, id);
  }
  KUIPER_ASSIGN_OR_RETURN(JsonReader merges_node, model.at("merges"));
  KUIPER_ASSIGN_OR_RETURN(std::vector<JsonReader> merges, merges_node.elements());
  spec->merges.reserve(merges.size());
  for (const JsonReader& merge : merges) {
    // Newer files store each merge as a pair, older ones as one "left right" string.
    if (merge.is_array() && merge.json().size() == 2) {
      KUIPER_ASSIGN_OR_RETURN(std::string left, merge.at(size_t{0}).value().to_string());
      KUIPER_ASSIGN_OR_RETURN(std::string right, merge.at(size_t{1}).value().to_string());
      spec->merges.emplace_back(std::move(left), std::move(right));
      continue;
    }
    KUIPER_ASSIGN_OR_RETURN(std::string text, merge.to_string());
    const size_t space = text.find(' ');
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
      return Status::Error("merge \"" + text + "\" is not two tokens separated by a space");
    }
    spec->merges.emplace_back(text.substr(0, space), text.substr(space + 1));
  }
  return Status::Ok();
}

Status read_decoder(const JsonReader& root) {
  const JsonReader decoder = member_or_null(root, "decoder");
  if (type_of(decoder) != "ByteLevel") {
    return Status::Error("decoder " + type_of(decoder) + " is not supported (only ByteLevel)");
  }
  return Status::Ok();
}

// The post-processor runs only when special tokens are added around the encoding; ByteLevel
// there just adjusts offsets, so it leaves the ids alone. Others (e.g. TemplateProcessing adding
// a BOS) would change them.
Status read_post_processor(const JsonReader& root) {
  const JsonReader post = member_or_null(root, "post_processor");
  if (!post.json().is_null() && type_of(post) != "ByteLevel") {
    return Status::Error("post_processor " + type_of(post) + " is not supported");
  }
  return Status::Ok();
}

Status read_added_tokens(const JsonReader& root, TokenizerSpec* spec) {
  if (!root.has("added_tokens")) return Status::Ok();
  KUIPER_ASSIGN_OR_RETURN(JsonReader list, root.at("added_tokens"));
  KUIPER_ASSIGN_OR_RETURN(std::vector<JsonReader> entries, list.elements());
  for (const JsonReader& entry : entries) {
    AddedToken token;
    KUIPER_ASSIGN_OR_RETURN(JsonReader id, entry.at("id"));
    KUIPER_ASSIGN_OR_RETURN(token.id, read_id(id));
    KUIPER_ASSIGN_OR_RETURN(token.content, entry.get_string("content"));
    KUIPER_ASSIGN_OR_RETURN(token.special, entry.get_bool_or("special", false));
    KUIPER_ASSIGN_OR_RETURN(token.single_word, entry.get_bool_or("single_word", false));
    KUIPER_ASSIGN_OR_RETURN(token.lstrip, entry.get_bool_or("lstrip", false));
    KUIPER_ASSIGN_OR_RETURN(token.rstrip, entry.get_bool_or("rstrip", false));
    KUIPER_ASSIGN_OR_RETURN(token.normalized, entry.get_bool_or("normalized", false));
    if (token.content.empty()) {
      return Status::Error("added token " + std::to_string(token.id) + " is empty");
    }
    spec->added_tokens.push_back(std::move(token));
  }
  return Status::Ok();
}

Status read_tokenizer(const JsonReader& root, TokenizerSpec* spec) {
  if (!root.is_object()) return root.error("not a JSON object");
  KUIPER_RETURN_IF_ERROR(read_normalizer(root, spec));
  KUIPER_RETURN_IF_ERROR(read_pre_tokenizer(root, spec));
  KUIPER_RETURN_IF_ERROR(read_model(root, spec));
  KUIPER_RETURN_IF_ERROR(read_decoder(root));
  KUIPER_RETURN_IF_ERROR(read_post_processor(root));
  return read_added_tokens(root, spec);
}

}  // namespace

Result<TokenizerSpec> parse_tokenizer_json(const std::string& text) {
  KUIPER_ASSIGN_OR_RETURN(const json root, parse_json(text, "tokenizer.json"));
  TokenizerSpec spec;
  KUIPER_RETURN_IF_ERROR(read_tokenizer(JsonReader(root, "tokenizer.json"), &spec));
  return spec;
}

}  // namespace kuiper
