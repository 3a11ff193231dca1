// config.json as Hugging Face publishes it, the model file's own config object, and the same
// JSON as a Qwen3-VL preprocessor_config.json.
#include "kuiper/base/json_reader.h"
#include "kuiper/model/config.h"
#include "kuiper/vision/preprocess.h"
#include "test/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto json = kuiper::parse_json(kuiper::fuzz::as_text(data, size), "config.json");
  if (!json.ok()) return 0;
  auto config = kuiper::ModelConfig::from_hf(*json);
  if (config.ok()) (void)kuiper::expected_tensors(*config);
  (void)kuiper::ModelConfig::from_json(*json);
  (void)kuiper::ImageProcessorConfig::from_json(*json);
  return 0;
}
