#include "kuiper/runtime/stop_strings.h"

#include <algorithm>

namespace kuiper {

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopStrings::Step StopStrings::feed(const std::string& piece) {
  pending_ += piece;
  Step step;
  // The earliest stop string wins, so nothing after the first match is shown.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    step.text = pending_.substr(0, first);
    step.stopped = true;
    pending_.clear();
    return step;
  }
  // Hold back the longest tail of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  step.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return step;
}

std::string StopStrings::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace kuiper
