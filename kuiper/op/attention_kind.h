// The attention algorithm chosen end to end (--attention): data, not scattered ifs. Declared in
// namespace kuiper (not kuiper::op) because options and flags of every layer above name it.
#pragma once

#include <string>

#include "kuiper/base/status.h"

namespace kuiper {

enum class AttentionKind { kMha, kFlash1, kFlash2 };
const char* attention_name(AttentionKind a);  // "mha", "flash1", "flash2"
Result<AttentionKind> parse_attention(const std::string& name);

}  // namespace kuiper
