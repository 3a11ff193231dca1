// One safetensors file (8-byte header length, JSON header, data), then the same bytes as a
// sharded checkpoint's model.safetensors.index.json.
#include <unistd.h>

#include <fstream>
#include <string>

#include "kuiper/model/safetensors.h"
#include "test/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kuiper::fuzz::InputFile file(data, size);
  (void)kuiper::SafetensorsFile::open(file.path());

  static const std::string dir = [] {
    std::string pattern = "/tmp/kuiper-fuzz-XXXXXX";
    return ::mkdtemp(&pattern[0]) != nullptr ? pattern : std::string();
  }();
  if (dir.empty()) return 0;
  std::ofstream(dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  (void)kuiper::SafetensorsCheckpoint::open(dir);
  return 0;
}
