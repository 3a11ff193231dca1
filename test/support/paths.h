// Where tests find things: the shared fixtures, the built tools, scratch space.
#pragma once

#include <cstdlib>
#include <string>

namespace kuiper::test {

// ../shared beside the checkout, or $KUIPER_SHARED_DIR (the GPU machine uses .gpu/).
inline std::string shared_dir() {
  const char* env = std::getenv("KUIPER_SHARED_DIR");
  return env != nullptr ? env : KUIPER_SHARED_DIR;
}
inline std::string fixtures_dir() { return shared_dir() + "/fixtures"; }
inline std::string tokenizer_dir() { return shared_dir() + "/tokenizer/qwen3"; }
inline std::string bin_dir() { return KUIPER_BIN_DIR; }
inline std::string test_data_dir() { return KUIPER_TEST_DATA_DIR; }

}  // namespace kuiper::test
