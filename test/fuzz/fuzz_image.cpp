// PNG and JPEG decoding (EXIF orientation included), then Qwen3-VL preprocessing.
#include "kuiper/vision/image.h"
#include "kuiper/vision/preprocess.h"
#include "test/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto image = kuiper::decode_image(data, size, "fuzz");
  if (!image.ok() || image->width * image->height > (1 << 20)) return 0;
  (void)kuiper::preprocess_image(*image, kuiper::ImageProcessorConfig());
  return 0;
}
