// Images for the vision models: decoding PNG / JPEG files into upright RGB8 pixels. The image
// processor that turns them into patches is in preprocess.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kuiper/base/status.h"

namespace kuiper {

// Row-major RGB8: rgb[(y * width + x) * 3 + c].
struct Image {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Decodes a PNG (stb_image) or JPEG (libjpeg-turbo with PIL's settings, so the pixels are PIL's;
// CMYK JPEGs through stb_image) file into RGB8. Gray, gray+alpha, palette and RGBA images are converted as
// PIL's convert("RGB") does (gray replicated, alpha dropped, palette looked up); 16-bit PNG
// channels keep their high byte. Missing files, empty files, other formats, zero-sized images,
// truncated files (a PNG without its IEND chunk, a JPEG without its EOI marker) and corrupt data
// are errors naming the path. An EXIF orientation (a JPEG APP1 "Exif" segment or a PNG eXIf
// chunk) is applied, as transformers' load_image does (PIL's ImageOps.exif_transpose), so the
// pixels come upright.
Result<Image> load_image(const std::string& path);
// The same from bytes in memory; `name` stands for the path in error messages.
Result<Image> decode_image(const uint8_t* data, size_t size, const std::string& name);
// The image as EXIF orientation 1-8 says to show it (2: mirrored, 3: rotated 180, 4: flipped,
// 5: transposed, 6: rotated 90 clockwise, 7: transversed, 8: rotated 90 counter-clockwise);
// other values leave it unchanged.
Image apply_orientation(const Image& image, int orientation);

}  // namespace kuiper
