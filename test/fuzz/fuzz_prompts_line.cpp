// A JSONL prompts file (--prompts-file): every line parsed into a request or its own error.
#include "demo/prompts_file.h"
#include "test/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // read_prompts_file tells JSONL by the name's .jsonl ending: a symlink gives the memfd one.
  const kuiper::fuzz::InputFile file(data, size);
  static const std::string link = "/tmp/kuiper-fuzz-" + std::to_string(::getpid()) + ".jsonl";
  ::unlink(link.c_str());
  if (::symlink(file.path().c_str(), link.c_str()) != 0) return 0;
  (void)kuiper::demo::read_prompts_file(link, kuiper::GenerationOptions(), "");
  ::unlink(link.c_str());
  return 0;
}
