// Finds user stop strings in streamed text. A stop string may be spelled by several tokens, or
// start in the middle of one, so text that could be the beginning of a stop string is held back
// until it is known not to be one; the stop string itself is never emitted.
#pragma once

#include <string>
#include <vector>

namespace kuiper {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);

  struct Step {
    std::string text;      // safe to show now
    bool stopped = false;  // a stop string was completed; `text` ends just before it
  };
  // Adds the next piece of generated text.
  Step feed(const std::string& piece);
  // The text still held back, when generation ends without a stop string.
  std::string flush();

 private:
  std::vector<std::string> stops_;  // empty strings removed
  std::string pending_;
};

}  // namespace kuiper
