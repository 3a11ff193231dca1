// The command line of qwen2_infer / qwen3_infer, read into one checked InferOptions. Every
// value that makes no sense is refused with a message naming the flag and what it accepts.
#pragma once

#include <string>
#include <vector>

#include "kuiper/model/config.h"
#include "kuiper/model/model.h"
#include "kuiper/runtime/generator.h"

namespace kuiper::demo {

struct InferOptions {
  std::string model_path;
  std::string tokenizer_path;  // empty: the tokenizer embedded in the model file
  ModelOptions model;
  GenerationOptions generation;
  bool seed_given = false;  // false: a fresh random seed was drawn
  // --max-context was given: above the model's maximum it is refused (the default is cut to it).
  bool max_context_given = false;
  bool no_think = false;
  std::string prompt;
  std::vector<std::string> images;  // --image, in order: shown with the first message
  std::string system;
  std::string prompts_file;
  std::string output_path;
  int64_t max_batch = 8;  // batch mode: prompts running at once
  bool interactive = false;
  bool stream = false;
  bool stats = false;
};

// Parses argv (gflags, after the rewriting gflags cannot do itself: `-i`, dashes in flag
// names, repeated --stop and --image) and checks the values for a program serving `family`.
// `argv[0]` is the program name.
Result<InferOptions> parse_infer_options(int argc, char** argv, Architecture family);

}  // namespace kuiper::demo
