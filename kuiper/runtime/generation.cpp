#include "kuiper/runtime/generation.h"

namespace kuiper {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEndToken: return "eos";
    case FinishReason::kStopString: return "stop";
    case FinishReason::kMaxTokens: return "length";
    case FinishReason::kContextFull: return "context";
    case FinishReason::kInterrupted: return "interrupted";
  }
  return "unknown";
}

}  // namespace kuiper
