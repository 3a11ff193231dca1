// The interactive chat of qwen*_infer -i: a prompt with line editing and history, multi-line
// input, streamed replies, and the commands /clear /stats /system /help /quit (and, for a
// vision-language model, /image PATH).
#pragma once

#include "demo/infer_options.h"
#include "kuiper/runtime/chat_session.h"
#include "kuiper/runtime/vision_input.h"

namespace kuiper::demo {

// Runs until /quit or Ctrl-D; returns the exit status. Errors of one turn (a message too long
// for the context, invalid UTF-8, an image that cannot be read) are printed and the chat goes
// on. `vision` reads the images of /image (null: the model takes none); `images` (--image) go
// with the first message.
int run_repl(ChatSession& session, const InferOptions& options, const ImageInput* vision,
             std::vector<PromptImage> images, const char* program);

}  // namespace kuiper::demo
