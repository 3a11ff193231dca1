// Batch mode of qwen*_infer (--prompts-file): every prompt of the file in turn, one JSONL
// record each to --output (or stdout), progress and bad lines on stderr.
#pragma once

#include "demo/infer_options.h"
#include "kuiper/runtime/generator.h"
#include "kuiper/runtime/vision_input.h"
#include "kuiper/tokenizer/chat_template.h"

namespace kuiper::demo {

// Returns the exit status: 0 when every prompt got a result, 1 when any failed (the others
// still ran) or the file could not be used at all. `vision` reads the lines' images (null: the
// model takes none, and a line with images fails).
int run_batch(Generator& generator, const ChatTemplate& chat_template,
              const ChatOptions& chat_options, const InferOptions& options,
              const ImageInput* vision, const char* program);

}  // namespace kuiper::demo
