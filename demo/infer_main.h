// The shared front end of qwen2_infer, qwen3_infer and qwen3_vl_infer: one prompt, a batch file
// or a chat REPL over kuiper/runtime. The programs differ only in the model family they accept
// (a vision-language family also takes images).
#pragma once

#include "kuiper/model/config.h"

namespace kuiper::demo {

// Parses the command line, loads the model (refusing one of another family) and runs the mode
// the flags ask for. Returns the process exit status; every failure prints one line on stderr.
int infer_main(int argc, char** argv, Architecture family);

}  // namespace kuiper::demo
