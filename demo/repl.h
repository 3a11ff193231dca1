// The interactive chat of qwen*_infer -i: a prompt with line editing and history, multi-line
// input, streamed replies, and the commands /clear /stats /system /help /quit.
#pragma once

#include "demo/infer_options.h"
#include "kuiper/runtime/chat_session.h"

namespace kuiper::demo {

// Runs until /quit or Ctrl-D; returns the exit status. Errors of one turn (a message too long
// for the context, invalid UTF-8) are printed and the chat goes on.
int run_repl(ChatSession& session, const InferOptions& options, const char* program);

}  // namespace kuiper::demo
