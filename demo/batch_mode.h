// Batch mode of qwen*_infer (--prompts-file): every prompt of the file in turn, one JSONL
// record each to --output (or stdout), progress and bad lines on stderr.
#pragma once

#include "demo/infer_options.h"
#include "kuiper/runtime/generator.h"
#include "kuiper/tokenizer/chat_template.h"

namespace kuiper::demo {

// Returns the exit status: 0 when every prompt got a result, 1 when any failed (the others
// still ran) or the file could not be used at all.
int run_batch(Generator& generator, const ChatTemplate& chat_template,
              const ChatOptions& chat_options, const InferOptions& options, const char* program);

}  // namespace kuiper::demo
