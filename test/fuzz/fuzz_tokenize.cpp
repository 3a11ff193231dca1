// The real Qwen tokenizer (test/data) encoding any text and decoding any ids.
#include <vector>

#include "kuiper/tokenizer/tokenizer.h"
#include "test/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuiper::Tokenizer tokenizer =
      kuiper::Tokenizer::from_file(KUIPER_TEST_DATA_DIR "/tokenizer/qwen3/tokenizer.json").value();
  auto ids = tokenizer.encode(kuiper::fuzz::as_text(data, size));
  if (ids.ok()) (void)tokenizer.decode(*ids);
  // The bytes read as ids, in range or not.
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    raw.push_back(static_cast<int32_t>(data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) |
                                       (uint32_t(data[i + 3]) << 24)) %
                  (tokenizer.vocab_size() + 8));
  }
  (void)tokenizer.decode(raw);
  return 0;
}
