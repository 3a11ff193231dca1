#include "kuiper/vision/image.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csetjmp>
#include <cmath>
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

enum class JpegDecode { kOk, kError, kCmyk };

// Decodes a JPEG into RGB8 with libjpeg and the settings PIL decodes with (its defaults: the
// accurate integer IDCT, fancy upsampling, YCbCr or gray converted to RGB by libjpeg), so the
// pixels are PIL's. CMYK / YCCK files are left to the caller. Only plain C objects live between
// the setjmp and a longjmp to it.
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
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return JpegDecode::kCmyk;
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

// Python's round(): half to even (the default rounding mode of nearbyint).
int64_t round_half_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// ---- PIL bicubic resampling (libImaging/Resample.c, 8 bits per channel) ----

constexpr int kPrecisionBits = 32 - 8 - 2;

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Per output position: the first input index, the tap count, and ksize fixed-point weights.
struct ResampleCoeffs {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out_size, ksize]
};

ResampleCoeffs precompute_coeffs(int in_size, int out_size) {
  constexpr double kSupport = 2.0;  // bicubic
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = kSupport * filterscale;
  ResampleCoeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = bicubic_filter((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[x] /= ww;
      const double scaled = k[x] * (1 << kPrecisionBits);
      c.weights[static_cast<size_t>(xx) * c.ksize + x] =
          static_cast<int32_t>(k[x] < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

uint8_t clip8(int64_t sum) {
  if (sum < 0) return 0;
  const int64_t v = sum >> kPrecisionBits;
  return static_cast<uint8_t>(v > 255 ? 255 : v);
}

// One separable pass along x (horizontal) or y, from src [h, w, 3] to a new image.
Image resample_horizontal(const Image& src, int out_w) {
  const ResampleCoeffs c = precompute_coeffs(static_cast<int>(src.width), out_w);
  Image dst;
  dst.width = out_w;
  dst.height = src.height;
  dst.rgb.resize(static_cast<size_t>(dst.width) * dst.height * 3);
#pragma omp parallel for schedule(static)
  for (int64_t y = 0; y < src.height; ++y) {
    const uint8_t* row = src.rgb.data() + static_cast<size_t>(y) * src.width * 3;
    uint8_t* out = dst.rgb.data() + static_cast<size_t>(y) * out_w * 3;
    for (int xx = 0; xx < out_w; ++xx) {
      const int32_t* k = c.weights.data() + static_cast<size_t>(xx) * c.ksize;
      int64_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      const uint8_t* p = row + static_cast<size_t>(c.first[xx]) * 3;
      for (int x = 0; x < c.count[xx]; ++x) {
        s0 += int64_t(p[3 * x + 0]) * k[x];
        s1 += int64_t(p[3 * x + 1]) * k[x];
        s2 += int64_t(p[3 * x + 2]) * k[x];
      }
      out[3 * xx + 0] = clip8(s0);
      out[3 * xx + 1] = clip8(s1);
      out[3 * xx + 2] = clip8(s2);
    }
  }
  return dst;
}

Image resample_vertical(const Image& src, int out_h) {
  const ResampleCoeffs c = precompute_coeffs(static_cast<int>(src.height), out_h);
  Image dst;
  dst.width = src.width;
  dst.height = out_h;
  dst.rgb.resize(static_cast<size_t>(dst.width) * dst.height * 3);
  const size_t stride = static_cast<size_t>(src.width) * 3;
#pragma omp parallel
  {
    std::vector<int64_t> sum(stride);  // one output row, accumulated input row by input row
#pragma omp for schedule(static)
    for (int yy = 0; yy < out_h; ++yy) {
      const int32_t* k = c.weights.data() + static_cast<size_t>(yy) * c.ksize;
      const uint8_t* base = src.rgb.data() + static_cast<size_t>(c.first[yy]) * stride;
      std::fill(sum.begin(), sum.end(), int64_t(1) << (kPrecisionBits - 1));
      for (int y = 0; y < c.count[yy]; ++y) {
        const uint8_t* row = base + static_cast<size_t>(y) * stride;
        const int64_t w = k[y];
        for (size_t i = 0; i < stride; ++i) sum[i] += row[i] * w;
      }
      uint8_t* out = dst.rgb.data() + static_cast<size_t>(yy) * stride;
      for (size_t i = 0; i < stride; ++i) out[i] = clip8(sum[i]);
    }
  }
  return dst;
}

// ---- preprocessor_config.json fields ----

bool present(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && !j.at(key).is_null();
}

Status read_bool(const nlohmann::json& j, const char* key, bool* out) {
  if (!present(j, key)) return Status::Ok();
  if (!j.at(key).is_boolean()) return Status::Error(std::string("\"") + key + "\" must be true or false");
  *out = j.at(key).get<bool>();
  return Status::Ok();
}

Status read_int(const nlohmann::json& j, const char* key, int64_t* out) {
  if (!present(j, key)) return Status::Ok();
  const nlohmann::json& v = j.at(key);
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return Status::Ok();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9.0e15) {
      *out = static_cast<int64_t>(d);
      return Status::Ok();
    }
  }
  return Status::Error(std::string("\"") + key + "\" must be an integer");
}

Status read_triple(const nlohmann::json& j, const char* key, std::array<double, 3>* out) {
  if (!present(j, key)) return Status::Ok();
  const nlohmann::json& v = j.at(key);
  if (v.is_number()) {  // one value for every channel
    out->fill(v.get<double>());
    return Status::Ok();
  }
  if (!v.is_array() || v.size() != 3) {
    return Status::Error(std::string("\"") + key + "\" must be a number or a list of 3 numbers");
  }
  for (size_t i = 0; i < 3; ++i) {
    if (!v[i].is_number()) {
      return Status::Error(std::string("\"") + key + "\" must be a number or a list of 3 numbers");
    }
    (*out)[i] = v[i].get<double>();
  }
  return Status::Ok();
}

Status parse_config(const nlohmann::json& j, ImageProcessorConfig* c) {
  if (!j.is_object()) return Status::Error("not a JSON object");
  KUIPER_RETURN_IF_ERROR(read_bool(j, "do_resize", &c->do_resize));
  KUIPER_RETURN_IF_ERROR(read_bool(j, "do_rescale", &c->do_rescale));
  KUIPER_RETURN_IF_ERROR(read_bool(j, "do_normalize", &c->do_normalize));
  if (present(j, "size")) {
    const nlohmann::json& size = j.at("size");
    if (!size.is_object()) return Status::Error("\"size\" must be an object");
    // Current key names, then the older ones some checkpoints keep inside size.
    KUIPER_RETURN_IF_ERROR(read_int(size, "shortest_edge", &c->min_pixels));
    KUIPER_RETURN_IF_ERROR(read_int(size, "longest_edge", &c->max_pixels));
    KUIPER_RETURN_IF_ERROR(read_int(size, "min_pixels", &c->min_pixels));
    KUIPER_RETURN_IF_ERROR(read_int(size, "max_pixels", &c->max_pixels));
  }
  // Top-level min_pixels / max_pixels override size (transformers' backward compatibility).
  KUIPER_RETURN_IF_ERROR(read_int(j, "min_pixels", &c->min_pixels));
  KUIPER_RETURN_IF_ERROR(read_int(j, "max_pixels", &c->max_pixels));
  KUIPER_RETURN_IF_ERROR(read_int(j, "patch_size", &c->patch_size));
  KUIPER_RETURN_IF_ERROR(read_int(j, "temporal_patch_size", &c->temporal_patch_size));
  KUIPER_RETURN_IF_ERROR(read_int(j, "merge_size", &c->merge_size));
  if (present(j, "rescale_factor")) {
    if (!j.at("rescale_factor").is_number()) return Status::Error("\"rescale_factor\" must be a number");
    c->rescale_factor = j.at("rescale_factor").get<double>();
  }
  KUIPER_RETURN_IF_ERROR(read_triple(j, "image_mean", &c->image_mean));
  KUIPER_RETURN_IF_ERROR(read_triple(j, "image_std", &c->image_std));
  if (present(j, "resample")) {
    int64_t resample = 0;
    KUIPER_RETURN_IF_ERROR(read_int(j, "resample", &resample));
    if (resample != 3) {
      return Status::Error("\"resample\" is " + std::to_string(resample) +
                           "; only 3 (PIL BICUBIC) is supported");
    }
  }
  return c->validate();
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
  const int len = static_cast<int>(size);
  int width = 0, height = 0, channels = 0;
  if (!stbi_info_from_memory(data, len, &width, &height, &channels)) {
    return Status::Error(name + ": cannot read the image header (" + stbi_failure_reason() + ")");
  }
  if (width <= 0 || height <= 0) {
    return Status::Error(name + ": zero-sized image (" + std::to_string(width) + "x" +
                         std::to_string(height) + ")");
  }
  if (int64_t(width) * height > kMaxImagePixels) {
    return Status::Error(name + ": image of " + std::to_string(width) + "x" + std::to_string(height) +
                         " pixels is larger than the limit of " + std::to_string(kMaxImagePixels) +
                         " pixels");
  }
  if (is_jpeg(data, size)) {
    Image image;
    std::string message;
    switch (decode_jpeg(data, size, &image, &message)) {
      case JpegDecode::kOk: return apply_orientation(image, jpeg_orientation(data, size));
      case JpegDecode::kError: return Status::Error(name + ": cannot decode the image (" + message + ")");
      case JpegDecode::kCmyk: break;  // stb_image converts CMYK (libjpeg does not)
    }
  }
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

// ---- configuration ----

Status ImageProcessorConfig::validate() const {
  if (patch_size <= 0 || temporal_patch_size <= 0 || merge_size <= 0) {
    return Status::Error("patch_size, temporal_patch_size and merge_size must be positive");
  }
  if (min_pixels < 0 || max_pixels <= 0 || min_pixels > max_pixels) {
    return Status::Error("need 0 <= size.shortest_edge (min_pixels) <= size.longest_edge (max_pixels), got " +
                         std::to_string(min_pixels) + " and " + std::to_string(max_pixels));
  }
  if (max_pixels < factor() * factor()) {
    return Status::Error("size.longest_edge (max_pixels) " + std::to_string(max_pixels) +
                         " is below one merged patch (" + std::to_string(factor() * factor()) + " pixels)");
  }
  if (!(rescale_factor > 0) || !std::isfinite(rescale_factor)) {
    return Status::Error("rescale_factor must be a positive number");
  }
  for (int c = 0; c < 3; ++c) {
    if (!std::isfinite(image_mean[c]) || !std::isfinite(image_std[c]) || image_std[c] == 0) {
      return Status::Error("image_mean must be finite and image_std finite and non-zero");
    }
  }
  return Status::Ok();
}

nlohmann::json ImageProcessorConfig::to_json() const {
  return {{"do_resize", do_resize},
          {"do_rescale", do_rescale},
          {"do_normalize", do_normalize},
          {"size", {{"shortest_edge", min_pixels}, {"longest_edge", max_pixels}}},
          {"patch_size", patch_size},
          {"temporal_patch_size", temporal_patch_size},
          {"merge_size", merge_size},
          {"rescale_factor", rescale_factor},
          {"image_mean", image_mean},
          {"image_std", image_std},
          {"resample", 3}};
}

Result<ImageProcessorConfig> ImageProcessorConfig::from_json(const nlohmann::json& preprocessor_config) {
  ImageProcessorConfig config;
  const Status s = parse_config(preprocessor_config, &config);
  if (!s.ok()) return s.With("preprocessor_config.json");
  return config;
}

// ---- processing ----

Result<std::pair<int64_t, int64_t>> smart_resize(int64_t height, int64_t width, int64_t factor,
                                                 int64_t min_pixels, int64_t max_pixels) {
  if (height <= 0 || width <= 0) {
    return Status::Error("image size " + std::to_string(width) + "x" + std::to_string(height) +
                         " is not positive");
  }
  if (factor <= 0) return Status::Error("resize factor must be positive");
  const double ratio = static_cast<double>(std::max(height, width)) / std::min(height, width);
  if (ratio > 200) {
    return Status::Error("image of " + std::to_string(width) + "x" + std::to_string(height) +
                         ": aspect ratio above 200 is not supported");
  }
  const double f = static_cast<double>(factor);
  int64_t h_bar = round_half_even(height / f) * factor;
  int64_t w_bar = round_half_even(width / f) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(static_cast<double>(height * width) / static_cast<double>(max_pixels));
    h_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(height / beta / f)) * factor);
    w_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(width / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / static_cast<double>(height * width));
    h_bar = static_cast<int64_t>(std::ceil(height * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(width * beta / f)) * factor;
  }
  if (h_bar <= 0 || w_bar <= 0) {
    return Status::Error("image of " + std::to_string(width) + "x" + std::to_string(height) +
                         " resizes to nothing (min_pixels " + std::to_string(min_pixels) + ")");
  }
  return std::make_pair(h_bar, w_bar);
}

Image resize_bicubic(const Image& image, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0 || image.width <= 0 || image.height <= 0) return Image{};
  Image out = image;
  if (width != out.width) out = resample_horizontal(out, static_cast<int>(width));
  if (height != out.height) out = resample_vertical(out, static_cast<int>(height));
  return out;
}

Result<ProcessedImage> preprocess_image(const Image& image, const ImageProcessorConfig& config) {
  KUIPER_RETURN_IF_ERROR(config.validate());
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return Status::Error("preprocess_image: not an RGB image of " + std::to_string(image.width) + "x" +
                         std::to_string(image.height) + " pixels");
  }
  const int64_t factor = config.factor();
  int64_t rh = image.height, rw = image.width;
  const Image* pixels = &image;
  Image resized;
  if (config.do_resize) {
    KUIPER_ASSIGN_OR_RETURN(auto size, smart_resize(image.height, image.width, factor,
                                                    config.min_pixels, config.max_pixels));
    rh = size.first;
    rw = size.second;
    if (rh != image.height || rw != image.width) {
      resized = resize_bicubic(image, rw, rh);
      pixels = &resized;
    }
  } else if (rh % factor != 0 || rw % factor != 0) {
    return Status::Error("image of " + std::to_string(rw) + "x" + std::to_string(rh) +
                         " is not a multiple of " + std::to_string(factor) + " pixels and do_resize is off");
  }

  // Every uint8 value maps to one float per channel, computed as numpy does: rescale in double
  // then cast to float32, normalise in float32.
  std::array<std::array<float, 256>, 3> lut;
  for (int c = 0; c < 3; ++c) {
    const float mean = static_cast<float>(config.image_mean[c]);
    const float sd = static_cast<float>(config.image_std[c]);
    for (int v = 0; v < 256; ++v) {
      float x = config.do_rescale ? static_cast<float>(v * config.rescale_factor) : static_cast<float>(v);
      if (config.do_normalize) x = (x - mean) / sd;
      lut[c][v] = x;
    }
  }

  const int64_t P = config.patch_size, T = config.temporal_patch_size, M = config.merge_size;
  const int64_t grid_h = rh / P, grid_w = rw / P;
  ProcessedImage out;
  out.grid = {1, grid_h, grid_w};
  out.patches = grid_h * grid_w;
  out.patch_dim = config.patch_dim();
  out.pixel_values.resize(static_cast<size_t>(out.patches * out.patch_dim));
  const uint8_t* src = pixels->rgb.data();
  // Row order (block_h, block_w, merge_h, merge_w); within a row (channel, frame, py, px). The
  // frames are copies of the one image.
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < out.patches; ++row) {
    const int64_t mw = row % M, mh = (row / M) % M;
    const int64_t bw = (row / (M * M)) % (grid_w / M), bh = row / (M * M) / (grid_w / M);
    const int64_t y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
    float* dst = out.pixel_values.data() + row * out.patch_dim;
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t py = 0; py < P; ++py) {
          const uint8_t* line = src + ((y0 + py) * rw + x0) * 3 + c;
          for (int64_t px = 0; px < P; ++px) *dst++ = lut[c][line[px * 3]];
        }
      }
    }
  }
  return out;
}

}  // namespace kuiper
