#include "kuiper/tokenizer/tokenizer_json.h"

#include <nlohmann/json.hpp>

namespace kuiper {
namespace {

using nlohmann::json;

std::string type_of(const json& node) {
  return node.is_object() && node.contains("type") && node["type"].is_string()
             ? node["type"].get<std::string>()
             : node.dump();
}

Status read_normalizer(const json& root, TokenizerSpec* spec) {
  const json& normalizer = root.value("normalizer", json());
  if (normalizer.is_null()) return Status::Ok();
  if (type_of(normalizer) != "NFC") {
    return Status::Error("normalizer " + type_of(normalizer) + " is not supported (only NFC)");
  }
  spec->nfc = true;
  return Status::Ok();
}

Status read_split(const json& split, TokenizerSpec* spec) {
  if (split.value("behavior", "") != "Isolated" || split.value("invert", false)) {
    return Status::Error("only a Split pre-tokenizer with behavior Isolated and invert false "
                         "is supported");
  }
  const json& pattern = split.at("pattern");
  if (pattern.contains("Regex")) {
    spec->split_pattern = pattern["Regex"].get<std::string>();
  } else if (pattern.contains("String")) {
    spec->split_pattern = pattern["String"].get<std::string>();
    spec->split_pattern_is_literal = true;
  } else {
    return Status::Error("Split pattern " + pattern.dump() + " is neither Regex nor String");
  }
  return Status::Ok();
}

Status read_pre_tokenizer(const json& root, TokenizerSpec* spec) {
  const json& pre = root.value("pre_tokenizer", json());
  const std::string expected = "a Sequence of Split and ByteLevel (use_regex false)";
  if (type_of(pre) != "Sequence" || !pre.contains("pretokenizers") ||
      pre["pretokenizers"].size() != 2) {
    return Status::Error("pre_tokenizer " + type_of(pre) + " is not supported (only " +
                         expected + ")");
  }
  const json& split = pre["pretokenizers"][0];
  const json& byte_level = pre["pretokenizers"][1];
  if (type_of(split) != "Split" || type_of(byte_level) != "ByteLevel" ||
      byte_level.value("use_regex", true) || byte_level.value("add_prefix_space", true)) {
    return Status::Error("pre_tokenizer is not " + expected + " without add_prefix_space");
  }
  return read_split(split, spec);
}

Status read_model(const json& root, TokenizerSpec* spec) {
  const json& model = root.at("model");
  if (type_of(model) != "BPE") {
    return Status::Error("model " + type_of(model) + " is not supported (only BPE)");
  }
  const auto set = [&](const char* key) {
    return model.contains(key) && !model[key].is_null() && model[key] != false && model[key] != "";
  };
  for (const char* key : {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                          "byte_fallback", "ignore_merges"}) {
    if (set(key)) {
      return Status::Error(std::string("BPE option ") + key + " = " + model[key].dump() +
                           " is not supported");
    }
  }
  spec->vocab.reserve(model.at("vocab").size());
  for (const auto& [token, id] : model.at("vocab").items()) {
    spec->vocab.emplace(token, id.get<int32_t>());
  }
  const json& merges = model.at("merges");
  spec->merges.reserve(merges.size());
  for (const json& merge : merges) {
    // Newer files store each merge as a pair, older ones as one "left right" string.
    if (merge.is_array() && merge.size() == 2) {
      spec->merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      continue;
    }
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
      return Status::Error("merge \"" + text + "\" is not two tokens separated by a space");
    }
    spec->merges.emplace_back(text.substr(0, space), text.substr(space + 1));
  }
  return Status::Ok();
}

Status read_decoder(const json& root) {
  const json& decoder = root.value("decoder", json());
  if (type_of(decoder) != "ByteLevel") {
    return Status::Error("decoder " + type_of(decoder) + " is not supported (only ByteLevel)");
  }
  return Status::Ok();
}

// The post-processor runs only when special tokens are added around the encoding; ByteLevel
// there just adjusts offsets, so it leaves the ids alone. Others (e.g. TemplateProcessing adding
// a BOS) would change them.
Status read_post_processor(const json& root) {
  const json& post = root.value("post_processor", json());
  if (!post.is_null() && type_of(post) != "ByteLevel") {
    return Status::Error("post_processor " + type_of(post) + " is not supported");
  }
  return Status::Ok();
}

Status read_added_tokens(const json& root, TokenizerSpec* spec) {
  for (const json& entry : root.value("added_tokens", json::array())) {
    AddedToken token;
    token.id = entry.at("id").get<int32_t>();
    token.content = entry.at("content").get<std::string>();
    token.special = entry.value("special", false);
    token.single_word = entry.value("single_word", false);
    token.lstrip = entry.value("lstrip", false);
    token.rstrip = entry.value("rstrip", false);
    token.normalized = entry.value("normalized", false);
    if (token.content.empty()) {
      return Status::Error("added token " + std::to_string(token.id) + " is empty");
    }
    spec->added_tokens.push_back(std::move(token));
  }
  return Status::Ok();
}

}  // namespace

Result<TokenizerSpec> parse_tokenizer_json(const std::string& text) {
  TokenizerSpec spec;
  try {
    const json root = json::parse(text);
    KUIPER_RETURN_IF_ERROR(read_normalizer(root, &spec));
    KUIPER_RETURN_IF_ERROR(read_pre_tokenizer(root, &spec));
    KUIPER_RETURN_IF_ERROR(read_model(root, &spec));
    KUIPER_RETURN_IF_ERROR(read_decoder(root));
    KUIPER_RETURN_IF_ERROR(read_post_processor(root));
    KUIPER_RETURN_IF_ERROR(read_added_tokens(root, &spec));
  } catch (const nlohmann::json::exception& e) {
    // Missing keys and wrong types surface from nlohmann as exceptions; they all mean the same
    // thing to the caller: this is not a well-formed tokenizer.json.
    return Status::Error(std::string("malformed tokenizer.json: ") + e.what());
  }
  for (const auto& [token, id] : spec.vocab) {
    if (id < 0) return Status::Error("vocab token \"" + token + "\" has negative id");
  }
  for (const AddedToken& token : spec.added_tokens) {
    if (token.id < 0) return Status::Error("added token \"" + token.content + "\" has negative id");
  }
  return spec;
}

}  // namespace kuiper
