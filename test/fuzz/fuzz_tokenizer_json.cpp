// tokenizer.json, then encoding and decoding with whatever tokenizer it describes.
#include "kuiper/tokenizer/tokenizer.h"
#include "test/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tokenizer = kuiper::Tokenizer::from_json(kuiper::fuzz::as_text(data, size));
  if (!tokenizer.ok()) return 0;
  auto ids = tokenizer->encode("Hello, world! 你好 <|im_start|>user\n");
  if (ids.ok()) (void)tokenizer->decode(*ids);
  return 0;
}
