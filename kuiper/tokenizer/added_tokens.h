// Added tokens (<|im_start|>, <think>, ...) are found in the text before it is normalized and
// pre-tokenized, so they come out as their own id and never merge with their neighbours.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kuiper {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;      // a control token (is_special); matched like any other here
  bool single_word = false;  // only matches where no letter or digit touches either side
  bool lstrip = false;       // swallows the whitespace before it
  bool rstrip = false;       // swallows the whitespace after it
  bool normalized = false;   // matched in the normalized text rather than the raw text
};

// One stretch of text: an added token when id >= 0, else plain text [begin, end).
struct TextSpan {
  size_t begin;
  size_t end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  // Looks for the given tokens; their contents must be non-empty.
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  // Cuts `text` (valid UTF-8) into plain and added-token spans covering it in order. Matching
  // is leftmost-longest and non-overlapping, as the Aho-Corasick matcher of Hugging Face's
  // AddedVocabulary; a match that its single_word flag rules out stays plain text.
  std::vector<TextSpan> split(std::string_view text) const;

 private:
  // The token matching longest at text[pos], or nullptr.
  const AddedToken* longest_at(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  // Token indices by first byte, longest content first: at most positions no token can start.
  std::array<std::vector<size_t>, 256> by_first_byte_;
};

}  // namespace kuiper
