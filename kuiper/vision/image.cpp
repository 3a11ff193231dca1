#include "kuiper/vision/image.h"

#include <cerrno>
#include <climits>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>

// The one stb_image implementation in the project: PNG and JPEG only, with internal linkage so it
// cannot clash with another copy linked into a program.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_NO_STDIO
#define STBI_FAILURE_USERMSG
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#include <stb_image.h>
#pragma GCC diagnostic pop

#include <jpeglib.h>  // after <cstdio>: it uses FILE

namespace kuiper {

namespace {

// PIL refuses images above twice Image.MAX_IMAGE_PIXELS as decompression bombs; so do we.
constexpr int64_t kMaxImagePixels = 2 * 89478485;

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}
uint32_t read_be16(const uint8_t* p) { return (uint32_t(p[0]) << 8) | uint32_t(p[1]); }

bool is_png(const uint8_t* data, size_t size) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  return size >= 8 && std::memcmp(data, kSignature, 8) == 0;
}
bool is_jpeg(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

// Walks the PNG's chunks up to IEND: a file that ends first is truncated (stb_image can decode a
// picture from a file cut after its image data, and would return it without a word).
Status check_png_structure(const uint8_t* data, size_t size, const std::string& name) {
  size_t pos = 8;
  bool first = true;
  while (true) {
    if (size - pos < 8) {
      return Status::Error(name + ": truncated PNG (the file ends before its IEND chunk)");
    }
    const uint64_t length = read_be32(data + pos);
    const std::string type(reinterpret_cast<const char*>(data + pos + 4), 4);
    if (length > 0x7FFFFFFFu) return Status::Error(name + ": corrupt PNG (bad chunk length)");
    if (size - pos < 12 + length) {
      return Status::Error(name + ": truncated PNG (the file ends inside its " + type + " chunk)");
    }
    if (first) {
      if (type != "IHDR" || length < 8) return Status::Error(name + ": corrupt PNG (no IHDR chunk)");
      const uint32_t width = read_be32(data + pos + 8), height = read_be32(data + pos + 12);
      if (width == 0 || height == 0) {
        return Status::Error(name + ": zero-sized image (" + std::to_string(width) + "x" +
                             std::to_string(height) + ")");
      }
      first = false;
    }
    if (type == "IEND") return Status::Ok();
    pos += 12 + length;
  }
}

// A DHT segment's tables: each a class/index byte, 16 code counts, then as many symbols, at most
// 256 (the JPEG limit). Checked before any decoder builds the tables: stb_image's builder (Debian's
// 2022 copy) writes out of bounds when the counts pass 256.
Status check_huffman_tables(const uint8_t* p, size_t n, const std::string& name) {
  while (n > 0) {
    if (n < 17) return Status::Error(name + ": corrupt JPEG (bad Huffman table)");
    size_t symbols = 0;
    for (int i = 1; i <= 16; ++i) symbols += p[i];
    if (symbols > 256 || n - 17 < symbols) {
      return Status::Error(name + ": corrupt JPEG (bad Huffman table)");
    }
    p += 17 + symbols;
    n -= 17 + symbols;
  }
  return Status::Ok();
}

// Walks the JPEG's marker segments to its first scan, reading the frame size on the way, then
// requires an EOI marker after it (stb_image decodes a cut-off scan as if the rest were zeros).
// Inside entropy-coded data a 0xFF byte is always followed by 0x00 or a restart marker, so FF D9
// there can only be the EOI.
Status check_jpeg_structure(const uint8_t* data, size_t size, const std::string& name) {
  const std::string truncated = name + ": truncated JPEG (the file ends before its EOI marker)";
  size_t pos = 2;
  while (true) {
    // Stray bytes before a marker are skipped, as libjpeg does (with a warning); then fill bytes.
    while (pos < size && data[pos] != 0xFF) ++pos;
    while (pos < size && data[pos] == 0xFF) ++pos;
    if (pos >= size) return Status::Error(truncated);
    const uint8_t marker = data[pos++];
    if (marker == 0xD9) return Status::Error(name + ": corrupt JPEG (no image data before EOI)");
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // no length field
    if (size - pos < 2) return Status::Error(truncated);
    const size_t length = read_be16(data + pos);
    if (length < 2) return Status::Error(name + ": corrupt JPEG (bad segment length)");
    if (size - pos < length) return Status::Error(truncated);
    if (marker == 0xC4) KUIPER_RETURN_IF_ERROR(check_huffman_tables(data + pos + 2, length - 2, name));
    const bool frame = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                       marker != 0xCC;
    if (frame && length >= 7) {
      const uint32_t height = read_be16(data + pos + 3), width = read_be16(data + pos + 5);
      if (width == 0 || height == 0) {
        return Status::Error(name + ": zero-sized image (" + std::to_string(width) + "x" +
                             std::to_string(height) + ")");
      }
    }
    pos += length;
    if (marker == 0xDA) break;  // start of scan: entropy-coded data follows
  }
  for (size_t i = pos; i + 1 < size; ++i) {
    if (data[i] == 0xFF && data[i + 1] == 0xD9) return Status::Ok();
  }
  return Status::Error(truncated);
}

// ---- EXIF orientation ----

// The orientation tag (0x0112) of a TIFF structure, the payload of a JPEG APP1 "Exif" segment or
// a PNG eXIf chunk: 1 to 8, or 1 when absent, malformed or out of range (as PIL's
// exif_transpose, which acts only on 2 to 8).
int tiff_orientation(const uint8_t* t, size_t n) {
  if (n < 8) return 1;
  const bool little = t[0] == 'I' && t[1] == 'I';
  if (!little && !(t[0] == 'M' && t[1] == 'M')) return 1;
  auto u16 = [&](size_t o) -> uint32_t {
    return little ? uint32_t(t[o]) | (uint32_t(t[o + 1]) << 8) : read_be16(t + o);
  };
  auto u32 = [&](size_t o) -> uint32_t { return little ? u16(o) | (u16(o + 2) << 16) : read_be32(t + o); };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > n - 2) return 1;
  const size_t entries = u16(ifd);
  for (size_t i = 0; i < entries; ++i) {
    const size_t e = ifd + 2 + 12 * i;
    if (e + 12 > n) break;
    if (u16(e) != 0x0112) continue;
    if (u16(e + 2) != 3 || u32(e + 4) != 1) return 1;  // one SHORT, stored in the entry
    const uint32_t value = u16(e + 8);
    return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
  }
  return 1;
}

// The EXIF orientation of a JPEG whose structure was checked: the first APP1 "Exif" segment
// before the scan (the one PIL reads).
int jpeg_orientation(const uint8_t* data, size_t size) {
  size_t pos = 2;
  while (true) {
    while (pos < size && data[pos] != 0xFF) ++pos;
    while (pos < size && data[pos] == 0xFF) ++pos;
    if (pos + 2 >= size) return 1;
    const uint8_t marker = data[pos++];
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    const size_t length = read_be16(data + pos);
    if (length < 2 || size - pos < length || marker == 0xDA) return 1;
    if (marker == 0xE1 && length >= 8 && std::memcmp(data + pos + 2, "Exif\0\0", 6) == 0) {
      return tiff_orientation(data + pos + 8, length - 8);
    }
    pos += length;
  }
}

// The EXIF orientation of a PNG whose structure was checked: its eXIf chunk.
int png_orientation(const uint8_t* data, size_t size) {
  size_t pos = 8;
  while (size - pos >= 12) {
    const size_t length = read_be32(data + pos);
    if (length > size - pos - 12) return 1;
    if (std::memcmp(data + pos + 4, "eXIf", 4) == 0) return tiff_orientation(data + pos + 8, length);
    if (std::memcmp(data + pos + 4, "IEND", 4) == 0) return 1;
    pos += 12 + length;
  }
  return 1;
}

// ---- JPEG through libjpeg(-turbo) ----

// libjpeg reports fatal errors through error_exit, which must not return: it jumps back to the
// decoding function with the message. Warnings (corrupt data libjpeg can skip, such as stray
// bytes before a marker) are ignored, as PIL ignores them.
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_error_exit(j_common_ptr cinfo) {
  JpegErrors* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpeg_ignore_message(j_common_ptr, int) {}

enum class JpegDecode { kOk, kError, kCmyk, kTooLarge };

// Decodes a JPEG into RGB8 with libjpeg and the settings PIL decodes with (its defaults: the
// accurate integer IDCT, fancy upsampling, YCbCr or gray converted to RGB by libjpeg), so the
// pixels are PIL's. The header is libjpeg's too: `image` gets its size before anything is
// allocated, and one past kMaxImagePixels or in CMYK / YCCK is left to the caller. Only plain C
// objects live between the setjmp and a longjmp to it.
JpegDecode decode_jpeg(const uint8_t* data, size_t size, Image* image, std::string* message) {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_error_exit;
  errors.mgr.emit_message = jpeg_ignore_message;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    *message = errors.message;
    return JpegDecode::kError;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  image->width = cinfo.image_width;
  image->height = cinfo.image_height;
  const bool too_large = image->width * image->height > kMaxImagePixels;
  if (too_large || cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return too_large ? JpegDecode::kTooLarge : JpegDecode::kCmyk;
  }
  cinfo.out_color_space = JCS_RGB;
  cinfo.dct_method = JDCT_ISLOW;
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo);
  image->width = cinfo.output_width;
  image->height = cinfo.output_height;
  image->rgb.resize(static_cast<size_t>(cinfo.output_width) * cinfo.output_height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = image->rgb.data() + static_cast<size_t>(cinfo.output_scanline) * cinfo.output_width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return JpegDecode::kOk;
}

}  // namespace

// ---- decoding ----

Result<Image> decode_image(const uint8_t* data, size_t size, const std::string& name) {
  if (size == 0) return Status::Error(name + ": empty file (zero bytes), not an image");
  if (is_png(data, size)) {
    KUIPER_RETURN_IF_ERROR(check_png_structure(data, size, name));
  } else if (is_jpeg(data, size)) {
    KUIPER_RETURN_IF_ERROR(check_jpeg_structure(data, size, name));
  } else {
    return Status::Error(name + ": not a PNG or JPEG image");
  }
  if (size > static_cast<size_t>(INT_MAX)) return Status::Error(name + ": file too large (over 2 GiB)");
  auto too_large = [&name](int64_t width, int64_t height) {
    return Status::Error(name + ": image of " + std::to_string(width) + "x" + std::to_string(height) +
                         " pixels is larger than the limit of " + std::to_string(kMaxImagePixels) +
                         " pixels");
  };
  // JPEG headers are read by libjpeg, never by stb_image's header reader.
  if (is_jpeg(data, size)) {
    Image image;
    std::string message;
    switch (decode_jpeg(data, size, &image, &message)) {
      case JpegDecode::kOk: return apply_orientation(image, jpeg_orientation(data, size));
      case JpegDecode::kError: return Status::Error(name + ": cannot decode the image (" + message + ")");
      case JpegDecode::kTooLarge: return too_large(image.width, image.height);
      case JpegDecode::kCmyk: break;  // stb_image converts CMYK (libjpeg does not)
    }
  }
  // PNG, or a CMYK JPEG whose structure and Huffman tables were checked above.
  const int len = static_cast<int>(size);
  int width = 0, height = 0, channels = 0;
  if (!stbi_info_from_memory(data, len, &width, &height, &channels)) {
    return Status::Error(name + ": cannot read the image header (" + stbi_failure_reason() + ")");
  }
  if (width <= 0 || height <= 0) {
    return Status::Error(name + ": zero-sized image (" + std::to_string(width) + "x" +
                         std::to_string(height) + ")");
  }
  if (int64_t(width) * height > kMaxImagePixels) return too_large(width, height);
  stbi_uc* pixels = stbi_load_from_memory(data, len, &width, &height, &channels, 3);
  if (pixels == nullptr) {
    return Status::Error(name + ": cannot decode the image (" + stbi_failure_reason() + ")");
  }
  Image image;
  image.width = width;
  image.height = height;
  image.rgb.assign(pixels, pixels + static_cast<size_t>(width) * height * 3);
  stbi_image_free(pixels);
  return apply_orientation(image, is_png(data, size) ? png_orientation(data, size)
                                                     : jpeg_orientation(data, size));
}

Image apply_orientation(const Image& image, int orientation) {
  if (orientation < 2 || orientation > 8) return image;
  const int64_t w = image.width, h = image.height;
  const bool swap = orientation >= 5;  // 5-8 exchange width and height
  Image out;
  out.width = swap ? h : w;
  out.height = swap ? w : h;
  out.rgb.resize(image.rgb.size());
  for (int64_t y = 0; y < out.height; ++y) {
    for (int64_t x = 0; x < out.width; ++x) {
      int64_t sx = x, sy = y;  // the source pixel of output pixel (x, y)
      switch (orientation) {
        case 2: sx = w - 1 - x; break;                     // mirrored left-right
        case 3: sx = w - 1 - x; sy = h - 1 - y; break;     // rotated 180
        case 4: sy = h - 1 - y; break;                     // mirrored top-bottom
        case 5: sx = y; sy = x; break;                     // transposed
        case 6: sx = y; sy = h - 1 - x; break;             // rotated 90 clockwise
        case 7: sx = w - 1 - y; sy = h - 1 - x; break;     // transversed
        case 8: sx = w - 1 - y; sy = x; break;             // rotated 90 counter-clockwise
      }
      const uint8_t* src = &image.rgb[static_cast<size_t>(sy * w + sx) * 3];
      uint8_t* dst = &out.rgb[static_cast<size_t>(y * out.width + x) * 3];
      dst[0] = src[0];
      dst[1] = src[1];
      dst[2] = src[2];
    }
  }
  return out;
}

Result<Image> load_image(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::Error(path + ": no such file");
  if (std::filesystem::is_directory(path, ec)) return Status::Error(path + ": is a directory, not an image");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::Error(path + ": cannot open (" + std::strerror(errno) + ")");
  std::vector<uint8_t> bytes;
  uint8_t buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) bytes.insert(bytes.end(), buffer, buffer + n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Status::Error(path + ": read error");
  return decode_image(bytes.data(), bytes.size(), path);
}

}  // namespace kuiper
