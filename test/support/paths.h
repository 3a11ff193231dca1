// Where tests find things: the in-repository test data, the built tools, scratch space.
#pragma once

#include <string>

namespace kuiper::test {

// test/data: everything a test reads ships with the repository, so a clone tests itself.
inline std::string test_data_dir() { return KUIPER_TEST_DATA_DIR; }
// Tiny Qwen fixtures (recipe, config, Hugging Face goldens) and tokenizer reference cases.
inline std::string fixtures_dir() { return test_data_dir() + "/fixtures"; }
// The real Qwen2/2.5/3 tokenizer (tokenizer.json, tokenizer_config.json).
inline std::string tokenizer_dir() { return test_data_dir() + "/tokenizer/qwen3"; }
inline std::string bin_dir() { return KUIPER_BIN_DIR; }

}  // namespace kuiper::test
