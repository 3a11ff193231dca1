// The byte-level BPE model: a word's bytes start as one token each and adjacent pairs are
// merged, lowest merge rank first, until no listed pair remains.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kuiper/base/status.h"

namespace kuiper {

class BpeModel {
 public:
  // `vocab` maps byte-level token text to ids; `merges` lists pairs of token texts, the
  // earliest merged first. Fails if a byte, a merge part or a merge result is not in the vocab.
  static Result<BpeModel> build(const std::unordered_map<std::string, int32_t>& vocab,
                                const std::vector<std::pair<std::string, std::string>>& merges);

  // Appends the ids of one pre-tokenized word, given as raw bytes.
  void encode_word(std::string_view bytes, std::vector<int32_t>* ids) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // the id of the merged token
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Merge* find_merge(int32_t left, int32_t right) const;

  BpeModel() = default;
  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace kuiper
