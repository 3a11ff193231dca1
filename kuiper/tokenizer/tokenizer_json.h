// Reads a Hugging Face tokenizer.json into the parts Kuiper's tokenizer is built from. Only the
// pipeline Qwen uses is accepted (NFC or no normalizer, a regex Split then ByteLevel
// pre-tokenizer, BPE, ByteLevel decoder); anything else is refused by name rather than run
// differently from Hugging Face.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kuiper/base/status.h"
#include "kuiper/tokenizer/added_tokens.h"

namespace kuiper {

struct TokenizerSpec {
  bool nfc = false;
  std::string split_pattern;
  bool split_pattern_is_literal = false;
  std::unordered_map<std::string, int32_t> vocab;  // byte-level token text -> id
  std::vector<std::pair<std::string, std::string>> merges;  // by rank
  std::vector<AddedToken> added_tokens;
};

// Token ids are below this (16.7M, a hundred times Qwen's vocabulary): the tokenizer's id table
// is sized by the largest id, so a larger one is refused rather than allocated.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

Result<TokenizerSpec> parse_tokenizer_json(const std::string& text);

}  // namespace kuiper
