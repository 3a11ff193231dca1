// The real Qwen tokenizer (test/data) encoding any text and decoding any ids.
#include <vector>

#include "kuiper/tokenizer/tokenizer.h"
#include "test/fuzz/fuzz_input.h"

namespace {
const kuiper::Tokenizer* tokenizer_ptr = nullptr;
}  // namespace

// The 11 MB tokenizer.json is read once before fuzzing: read in the first input's call, it counted
// against -timeout (over 10 s under ASan on a loaded machine, a timeout on the empty input).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer_ptr = new kuiper::Tokenizer(
      kuiper::Tokenizer::from_file(KUIPER_TEST_DATA_DIR "/tokenizer/qwen3/tokenizer.json").value());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kuiper::Tokenizer& tokenizer = *tokenizer_ptr;
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
