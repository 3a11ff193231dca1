#include "tools/bench/word_tokenizer.h"

#include <string>

#include <nlohmann/json.hpp>

#include "kuiper/tokenizer/byte_level.h"

namespace kuiper::bench {

Result<Tokenizer> word_tokenizer(int64_t vocab_size) {
  using nlohmann::json;
  if (vocab_size < 1) return Status::Error("word tokenizer: the vocabulary is empty");
  json vocab = json::object();
  for (int64_t id = 0; id < vocab_size; ++id) {
    vocab[byte_level::encode(" w" + std::to_string(id))] = id;
  }
  for (int b = 0; b < 256; ++b) {
    vocab[byte_level::encode(std::string(1, static_cast<char>(b)))] = vocab_size + b;
  }
  // Qwen's pipeline (tokenizer_json.cpp accepts only it), split into words at spaces.
  const json tokenizer = {
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", " ?[^ ]+"}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"},
                       {"add_prefix_space", false},
                       {"use_regex", false}}})}}},
      {"model", {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", json::array()}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", json::array()}};
  Result<Tokenizer> result = Tokenizer::from_json(tokenizer.dump());
  if (!result.ok()) return result.status().With("word tokenizer");
  return result;
}

}  // namespace kuiper::bench
