// Batch mode of qwen*_infer (--prompts-file): the file's prompts run concurrently on the Engine
// (up to --max-batch at once), one JSONL record each to --output (or stdout) in the file's
// order, progress with the output rate and an ETA on stderr, a bad line that line's error only.
#pragma once

#include "demo/infer_options.h"
#include "kuiper/runtime/engine.h"
#include "kuiper/runtime/vision_input.h"
#include "kuiper/tokenizer/chat_template.h"

namespace kuiper::demo {

// Returns the exit status: 0 when every prompt got a result, 1 when any failed (the others
// still ran) or the file could not be used at all. `vision` reads the lines' images (null: the
// model takes none, and a line with images fails).
int run_batch(Engine& engine, const ChatTemplate& chat_template, const ChatOptions& chat_options,
              const InferOptions& options, const ImageInput* vision, const char* program);

}  // namespace kuiper::demo
