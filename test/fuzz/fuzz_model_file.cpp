// Kuiper model files: header, metadata JSON, config and tensor table.
#include "kuiper/model/model_file.h"
#include "test/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kuiper::fuzz::InputFile file(data, size);
  (void)kuiper::ModelFile::open(file.path());
  return 0;
}
