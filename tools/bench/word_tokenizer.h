// The tokenizer a random-weight model is served with: every id of its vocabulary decodes to a
// word of its own (" w17"), so each generated token streams as one piece of text and the
// stream's callbacks time every token.
#pragma once

#include <cstdint>

#include "kuiper/base/status.h"
#include "kuiper/tokenizer/tokenizer.h"

namespace kuiper::bench {

// Ids [0, vocab_size) are the words; the 256 byte tokens BPE needs come after them, where a
// model of vocab_size ids never samples.
Result<Tokenizer> word_tokenizer(int64_t vocab_size);

}  // namespace kuiper::bench
