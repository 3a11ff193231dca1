// Image loading and the Qwen2-VL / Qwen3-VL image processor: golden pixel values from Hugging Face
// for the fixture image, smart_resize against the transformers formula, bicubic resampling against
// PIL output and a double-precision reference, and every kind of bad image file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

// libjpeg's header needs size_t and FILE declared first (<cstdio> above).
#include <jpeglib.h>

#include "kuiper/vision/image.h"
#include "kuiper/vision/preprocess.h"
#include "support/assertions.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"
#include "support/paths.h"

namespace kuiper {
namespace {

const char* kFixture = "qwen3-vl-tiny";

std::string fixture_file(const std::string& name) { return test::fixtures_dir() + "/" + kFixture + "/" + name; }

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

nlohmann::json fixture_preprocessor_config() {
  std::ifstream in(fixture_file("preprocessor_config.json"));
  return nlohmann::json::parse(in);
}

// ---- a minimal PNG writer (stored deflate blocks), for every colour type and bit depth ----

uint32_t crc32(const uint8_t* data, size_t n) {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

void put_be32(std::vector<uint8_t>* out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out->push_back(static_cast<uint8_t>(v >> s));
}

void put_chunk(std::vector<uint8_t>* png, const char* type, const std::vector<uint8_t>& data) {
  put_be32(png, static_cast<uint32_t>(data.size()));
  std::vector<uint8_t> body(type, type + 4);
  body.insert(body.end(), data.begin(), data.end());
  png->insert(png->end(), body.begin(), body.end());
  put_be32(png, crc32(body.data(), body.size()));
}

std::vector<uint8_t> zlib_stored(const std::vector<uint8_t>& raw) {
  std::vector<uint8_t> z = {0x78, 0x01};
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    z.push_back(pos + n == raw.size() ? 1 : 0);  // BFINAL, BTYPE = stored
    z.push_back(static_cast<uint8_t>(n));
    z.push_back(static_cast<uint8_t>(n >> 8));
    z.push_back(static_cast<uint8_t>(~n));
    z.push_back(static_cast<uint8_t>(~n >> 8));
    z.insert(z.end(), raw.begin() + pos, raw.begin() + pos + n);
    pos += n;
  } while (pos < raw.size());
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < raw.size(); i += 5552) {  // 5552: the longest run without overflow
    for (size_t j = i; j < std::min(raw.size(), i + 5552); ++j) {
      a += raw[j];
      b += a;
    }
    a %= 65521;
    b %= 65521;
  }
  put_be32(&z, (b << 16) | a);
  return z;
}

// `rows`: the raw scanlines without filter bytes (bytes_per_row each).
std::vector<uint8_t> make_png(uint32_t width, uint32_t height, int bit_depth, int color_type,
                              const std::vector<uint8_t>& rows, const std::vector<uint8_t>& palette = {},
                              const std::vector<uint8_t>& trns = {}) {
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  std::vector<uint8_t> ihdr;
  put_be32(&ihdr, width);
  put_be32(&ihdr, height);
  ihdr.insert(ihdr.end(), {static_cast<uint8_t>(bit_depth), static_cast<uint8_t>(color_type), 0, 0, 0});
  put_chunk(&png, "IHDR", ihdr);
  if (!palette.empty()) put_chunk(&png, "PLTE", palette);
  if (!trns.empty()) put_chunk(&png, "tRNS", trns);
  std::vector<uint8_t> raw;
  const size_t row_bytes = height == 0 ? 0 : rows.size() / height;
  for (uint32_t y = 0; y < height; ++y) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), rows.begin() + y * row_bytes, rows.begin() + (y + 1) * row_bytes);
  }
  put_chunk(&png, "IDAT", zlib_stored(raw));
  put_chunk(&png, "IEND", {});
  return png;
}

// Encoded by libjpeg (stb_image_write's JPEG encoder left-shifts negative values, undefined
// behaviour that UBSan reports). Baseline 4:2:0, as PIL writes by default.
std::vector<uint8_t> make_jpeg(const Image& image, int quality) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr errors;
  cinfo.err = jpeg_std_error(&errors);  // a failure in this test helper exits, naming it
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(image.rgb.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * static_cast<size_t>(image.width) * 3;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  std::free(buffer);
  return out;
}

Image random_image(int64_t width, int64_t height, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, 255);
  Image image;
  image.width = width;
  image.height = height;
  image.rgb.resize(static_cast<size_t>(width * height * 3));
  for (auto& v : image.rgb) v = static_cast<uint8_t>(dist(rng));
  return image;
}

// ---- the golden test (acceptance 1 of issue 5) ----

TEST(VisionImage, FixtureImageMatchesTransformers) {
  auto image = load_image(fixture_file("test_image.png"));
  ASSERT_OK(image);
  EXPECT_EQ(image->width, 96);
  EXPECT_EQ(image->height, 64);
  auto config = ImageProcessorConfig::from_json(fixture_preprocessor_config());
  ASSERT_OK(config);
  auto processed = preprocess_image(*image, *config);
  ASSERT_OK(processed);

  const test::Golden golden = test::Golden::load(kFixture);
  for (const char* backend : {"slow", "fast"}) {
    const auto& grid = golden.at(std::string("image.grid_thw_") + backend);
    ASSERT_EQ(grid.i32.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(processed->grid[i], grid.i32[i]) << backend << " grid " << i;
  }
  double max_error[2] = {0, 0};
  int which = 0;
  for (const char* backend : {"slow", "fast"}) {
    const auto& want = golden.at(std::string("image.pixel_values_") + backend);
    ASSERT_EQ(want.shape, (std::vector<int64_t>{processed->patches, processed->patch_dim})) << backend;
    ASSERT_EQ(want.f32.size(), processed->pixel_values.size());
    for (size_t i = 0; i < want.f32.size(); ++i) {
      max_error[which] = std::max(max_error[which], std::fabs(double(processed->pixel_values[i]) - want.f32[i]));
    }
    ++which;
  }
  std::printf("image.pixel_values max abs error: slow (PIL) %.6g, fast (torchvision) %.6g\n", max_error[0],
              max_error[1]);
  RecordProperty("max_abs_error_slow", std::to_string(max_error[0]));
  RecordProperty("max_abs_error_fast", std::to_string(max_error[1]));
  EXPECT_LE(max_error[0], 2e-2);
  EXPECT_EQ(processed->merged_tokens(config->merge_size), 70);
}

// ---- smart_resize: transformers' formula worked by hand ----

TEST(VisionImage, SmartResizeFollowsTransformers) {
  struct Case {
    int64_t h, w, factor, min_pixels, max_pixels, want_h, want_w;
  };
  const int64_t kMin = 65536, kMax = 16777216;  // the Qwen3-VL preprocessor_config.json
  const Case cases[] = {
      // Already multiples of 32 and in range: unchanged.
      {256, 256, 32, kMin, kMax, 256, 256},
      // 255x257 -> round(7.97)=8, round(8.03)=8: 256x256 (65536, not below min_pixels).
      {255, 257, 32, kMin, kMax, 256, 256},
      // 500x375 -> round(15.6)=16 -> 512, round(11.7)=12 -> 384; 196608 pixels, in range.
      {500, 375, 32, kMin, kMax, 512, 384},
      // 1080 -> round(33.75)=34 -> 1088; 1920 = 60 * 32.
      {1080, 1920, 32, kMin, kMax, 1088, 1920},
      // The fixture image: 64x96 is 6144 < 65536 pixels; beta = sqrt(65536/6144) = 3.266;
      // ceil(64*3.266/32) = ceil(6.53) = 7 -> 224, ceil(96*3.266/32) = ceil(9.80) = 10 -> 320.
      {64, 96, 32, kMin, kMax, 224, 320},
      // Tiny images, below min_pixels and below one factor: beta = sqrt(65536/100) = 25.6;
      // 10*25.6/32 = 8 (+ rounding error in double, as in Python) -> ceil 8 -> 256.
      {10, 10, 32, kMin, kMax, 256, 256},
      {1, 1, 32, kMin, kMax, 256, 256},
      // 20x30: beta = sqrt(65536/600) = 10.45; ceil(6.53) = 7 -> 224, ceil(9.80) = 10 -> 320.
      {20, 30, 32, kMin, kMax, 224, 320},
      // 10x2000 (ratio 200, allowed): round(0.31)=0 -> 0 pixels < min; beta = sqrt(65536/20000)
      // = 1.810; ceil(0.57) = 1 -> 32, ceil(113.1) = 114 -> 3648.
      {10, 2000, 32, kMin, kMax, 32, 3648},
      // Huge images above max_pixels: 6000x8000 rounds to 6016x8000 = 48.1M > 16.8M;
      // beta = sqrt(48e6/16777216) = 1.6914; floor(6000/1.6914/32) = floor(110.85) = 110 -> 3520,
      // floor(8000/1.6914/32) = floor(147.80) = 147 -> 4704.
      {6000, 8000, 32, kMin, kMax, 3520, 4704},
      // 16384^2: beta = 4; floor(16384/4/32) = 128 -> 4096.
      {16384, 16384, 32, kMin, kMax, 4096, 4096},
      // 4000x6000 with max 2^20: beta = sqrt(24e6/1048576) = 4.784; floor(26.13) = 26 -> 832,
      // floor(39.19) = 39 -> 1248.
      {4000, 6000, 32, kMin, 1 << 20, 832, 1248},
      // 3000x4000 with max 2^20: 3008x4000 = 12.0M > 2^20; beta = sqrt(12e6/1048576) = 3.383;
      // floor(3000/3.383/32) = floor(27.71) = 27 -> 864, floor(4000/3.383/32) = floor(36.95) =
      // 36 -> 1152.
      {3000, 4000, 32, kMin, 1 << 20, 864, 1152},
      // Python's round() is half to even: 80/32 = 2.5 -> 2 (64), 48/32 = 1.5 -> 2 (64),
      // 112/32 = 3.5 -> 4 (128), 208/32 = 6.5 -> 6 (192).
      {80, 48, 32, 1024, 1 << 20, 64, 64},
      {112, 208, 32, 1024, 1 << 20, 128, 192},
      // Downscale floors at one factor: 32x6400 with max 4096: beta = sqrt(50) = 7.07;
      // floor(0.14) = 0 -> max(32, 0) = 32; floor(28.28) = 28 -> 896.
      {32, 6400, 32, 0, 4096, 32, 896},
      // Qwen2-VL defaults (factor 28, min 3136, max 1003520): 64x96 -> round(2.29)=2 -> 56,
      // round(3.43)=3 -> 84; 4704 pixels, in range.
      {64, 96, 28, 56 * 56, 28 * 28 * 1280, 56, 84},
  };
  for (const Case& c : cases) {
    auto got = smart_resize(c.h, c.w, c.factor, c.min_pixels, c.max_pixels);
    ASSERT_OK(got);
    EXPECT_EQ(got->first, c.want_h) << c.h << "x" << c.w;
    EXPECT_EQ(got->second, c.want_w) << c.h << "x" << c.w;
  }
  auto too_thin = smart_resize(10, 2001, 32, kMin, kMax);
  ASSERT_FALSE(too_thin.ok());
  EXPECT_NE(too_thin.status().message().find("aspect ratio"), std::string::npos) << too_thin.status().message();
  EXPECT_FALSE(smart_resize(0, 10, 32, kMin, kMax).ok());
}

// ---- bicubic resampling ----

// PIL's algorithm in plain double precision: every input pixel weighted by the cubic kernel
// (a = -0.5) stretched by the downscale factor, weights normalised over the image, each pass
// rounded half up and clipped to [0, 255].
std::vector<uint8_t> reference_pass(const std::vector<uint8_t>& in, int64_t in_size, int64_t out_size,
                                    int64_t lines, bool along_x, int64_t other) {
  auto cubic = [](double x) {
    x = std::fabs(x);
    if (x < 1) return 1.5 * x * x * x - 2.5 * x * x + 1;
    if (x < 2) return -0.5 * x * x * x + 2.5 * x * x - 4 * x + 2;
    return 0.0;
  };
  const double scale = double(in_size) / double(out_size);
  const double stretch = std::max(1.0, scale);
  const int64_t out_w = along_x ? out_size : other;
  const int64_t in_w = along_x ? in_size : other;
  std::vector<uint8_t> out(static_cast<size_t>(out_w * (along_x ? lines : out_size) * 3));
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    std::vector<double> w(in_size);
    double total = 0;
    for (int64_t i = 0; i < in_size; ++i) total += w[i] = cubic((i + 0.5 - center) / stretch);
    for (int64_t line = 0; line < lines; ++line) {
      for (int c = 0; c < 3; ++c) {
        double sum = 0;
        for (int64_t i = 0; i < in_size; ++i) {
          const int64_t x = along_x ? i : line, y = along_x ? line : i;
          sum += w[i] * in[(y * in_w + x) * 3 + c];
        }
        const double v = std::floor(sum / total + 0.5);
        const int64_t x = along_x ? o : line, y = along_x ? line : o;
        out[(y * out_w + x) * 3 + c] = static_cast<uint8_t>(std::min(255.0, std::max(0.0, v)));
      }
    }
  }
  return out;
}

Image reference_resize(const Image& image, int64_t width, int64_t height) {
  Image out = image;
  if (width != image.width) {
    out.rgb = reference_pass(out.rgb, image.width, width, image.height, true, 0);
    out.width = width;
  }
  if (height != image.height) {
    out.rgb = reference_pass(out.rgb, image.height, height, out.width, false, out.width);
    out.height = height;
  }
  return out;
}

TEST(VisionImage, BicubicMatchesPil) {
  std::ifstream in(test::test_data_dir() + "/pil_bicubic.json");
  ASSERT_TRUE(in) << "test/data/pil_bicubic.json";
  const nlohmann::json doc = nlohmann::json::parse(in);
  Image src;
  src.width = doc["width"];
  src.height = doc["height"];
  src.rgb = doc["rgb"].get<std::vector<uint8_t>>();
  ASSERT_EQ(src.rgb.size(), size_t(src.width * src.height * 3));
  for (const auto& c : doc["resized"]) {
    const Image got = resize_bicubic(src, c["width"], c["height"]);
    ASSERT_EQ(got.width, c["width"].get<int64_t>());
    ASSERT_EQ(got.height, c["height"].get<int64_t>());
    EXPECT_EQ(got.rgb, c["rgb"].get<std::vector<uint8_t>>()) << "PIL resize to " << c["width"] << "x" << c["height"];
  }
}

TEST(VisionImage, BicubicMatchesDoubleReference) {
  const Image src = random_image(37, 23, 7);
  const std::pair<int64_t, int64_t> sizes[] = {{11, 7}, {16, 16}, {80, 50}, {60, 9}, {37, 61}, {5, 23}, {224, 320}};
  for (const auto& [w, h] : sizes) {
    const Image got = resize_bicubic(src, w, h);
    const Image want = reference_resize(src, w, h);
    ASSERT_EQ(got.rgb.size(), want.rgb.size());
    // PIL's 22-bit fixed-point weights may move a value sitting on a rounding boundary by one.
    size_t off_by_one = 0;
    for (size_t i = 0; i < got.rgb.size(); ++i) {
      const int d = std::abs(int(got.rgb[i]) - int(want.rgb[i]));
      ASSERT_LE(d, 1) << w << "x" << h << " value " << i;
      off_by_one += d;
    }
    EXPECT_LE(off_by_one, got.rgb.size() / 100) << w << "x" << h;
  }
  // Same size: untouched.
  EXPECT_EQ(resize_bicubic(src, 37, 23).rgb, src.rgb);
}

// ---- patch order ----

TEST(VisionImage, PatchOrderIsTheProcessorTranspose) {
  // No resize (a multiple of 32, in range), no rescale or normalise: pixel_values hold the bytes.
  ImageProcessorConfig config;
  config.patch_size = 4;
  config.merge_size = 2;
  config.temporal_patch_size = 2;
  config.min_pixels = 0;
  config.max_pixels = 1 << 20;
  config.do_rescale = false;
  config.do_normalize = false;
  const Image image = random_image(24, 16, 3);
  auto got = preprocess_image(image, config);
  ASSERT_OK(got);
  const int64_t P = 4, M = 2, T = 2, gh = 4, gw = 6;
  EXPECT_EQ(got->grid, (std::array<int64_t, 3>{1, gh, gw}));
  // patches [T, C, gh/M, M, P, gw/M, M, P] read in the order (gh/M, gw/M, M, M, C, T, P, P).
  std::vector<float> want;
  for (int64_t bh = 0; bh < gh / M; ++bh)
    for (int64_t bw = 0; bw < gw / M; ++bw)
      for (int64_t mh = 0; mh < M; ++mh)
        for (int64_t mw = 0; mw < M; ++mw)
          for (int64_t c = 0; c < 3; ++c)
            for (int64_t t = 0; t < T; ++t)
              for (int64_t ph = 0; ph < P; ++ph)
                for (int64_t pw = 0; pw < P; ++pw) {
                  const int64_t y = (bh * M + mh) * P + ph, x = (bw * M + mw) * P + pw;
                  want.push_back(image.rgb[(y * image.width + x) * 3 + c]);
                }
  EXPECT_EQ(got->patches, gh * gw);
  EXPECT_EQ(got->patch_dim, 3 * T * P * P);
  EXPECT_EQ(got->pixel_values, want);
}

TEST(VisionImage, RescaleAndNormalizeAsNumpy) {
  ImageProcessorConfig config;
  config.patch_size = 2;
  config.merge_size = 1;
  config.temporal_patch_size = 1;
  config.min_pixels = 0;
  config.max_pixels = 1 << 20;
  config.image_mean = {0.5, 0.25, 0.125};
  config.image_std = {0.5, 0.2, 0.3};
  Image image;
  image.width = 2;
  image.height = 2;
  image.rgb = {0, 128, 255, 1, 2, 3, 250, 251, 252, 100, 200, 50};
  auto got = preprocess_image(image, config);
  ASSERT_OK(got);
  ASSERT_EQ(got->pixel_values.size(), 12u);
  for (int c = 0; c < 3; ++c) {
    for (int p = 0; p < 4; ++p) {
      const double want = (image.rgb[p * 3 + c] / 255.0 - config.image_mean[c]) / config.image_std[c];
      EXPECT_NEAR(got->pixel_values[c * 4 + p], want, 1e-6) << "channel " << c << " pixel " << p;
    }
  }
}

// ---- large images ----

TEST(VisionImage, LargeImageIsResizedDownToMaxPixels) {
  // A 4000x3000 PNG in memory (uncompressed deflate): a horizontal ramp in red, a vertical one in
  // green, blue constant.
  const int64_t W = 4000, H = 3000;
  std::vector<uint8_t> rows(static_cast<size_t>(W * H * 3));
  for (int64_t y = 0; y < H; ++y) {
    for (int64_t x = 0; x < W; ++x) {
      uint8_t* p = rows.data() + (y * W + x) * 3;
      p[0] = static_cast<uint8_t>(x * 255 / (W - 1));
      p[1] = static_cast<uint8_t>(y * 255 / (H - 1));
      p[2] = 77;
    }
  }
  const std::vector<uint8_t> png = make_png(W, H, 8, 2, rows);
  rows.clear();
  rows.shrink_to_fit();
  auto image = decode_image(png.data(), png.size(), "large.png");
  ASSERT_OK(image);
  ASSERT_EQ(image->width, W);
  ASSERT_EQ(image->height, H);

  auto json = fixture_preprocessor_config();
  json["size"]["longest_edge"] = 1 << 20;
  auto config = ImageProcessorConfig::from_json(json);
  ASSERT_OK(config);
  auto processed = preprocess_image(*image, *config);
  ASSERT_OK(processed);
  // smart_resize(3000, 4000, 32, 65536, 2^20) = (864, 1152): see SmartResizeFollowsTransformers.
  const int64_t h = 864, w = 1152;
  EXPECT_EQ(processed->grid, (std::array<int64_t, 3>{1, h / 16, w / 16}));
  EXPECT_LE(processed->grid[1] * processed->grid[2] * 16 * 16, config->max_pixels);
  EXPECT_EQ(processed->patches, (h / 16) * (w / 16));
  ASSERT_EQ(processed->pixel_values.size(), size_t(processed->patches * 1536));

  // The resized image keeps the ramps: at output column X the red value is the source's at
  // x = (X + 0.5) * W / w - 0.5 (cubic kernels reproduce linear ramps), blue stays 77.
  const Image resized = resize_bicubic(*image, w, h);
  for (int64_t Y = 4; Y < h - 4; Y += 37) {
    for (int64_t X = 4; X < w - 4; X += 41) {
      const uint8_t* p = resized.rgb.data() + (Y * w + X) * 3;
      const double x = (X + 0.5) * W / double(w) - 0.5, y = (Y + 0.5) * H / double(h) - 0.5;
      EXPECT_NEAR(p[0], x * 255 / (W - 1), 1.5) << X << "," << Y;
      EXPECT_NEAR(p[1], y * 255 / (H - 1), 1.5) << X << "," << Y;
      EXPECT_EQ(p[2], 77);
    }
  }
  // ... and pixel_values are those bytes, normalised: blue is (77/255 - 0.5) / 0.5 everywhere.
  const float blue = (static_cast<float>(77 * (1.0 / 255.0)) - 0.5f) / 0.5f;
  for (int64_t row = 0; row < processed->patches; row += 97) {
    for (int64_t i = 2 * 512; i < 3 * 512; i += 13) {
      ASSERT_EQ(processed->pixel_values[row * 1536 + i], blue);
    }
  }
}

// ---- decoding and bad files ----

// The error names the path and says what is wrong.
void expect_error(const Result<Image>& result, const std::string& path, const std::string& what) {
  ASSERT_FALSE(result.ok()) << path << " loaded, expected: " << what;
  const std::string& message = result.status().message();
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(what), std::string::npos) << message;
}

TEST(VisionImage, BadFilesAreClearErrors) {
  test::TempDir dir;
  expect_error(load_image(dir.file("missing.png")), dir.file("missing.png"), "no such file");
  expect_error(load_image(dir.path()), dir.path(), "directory");

  write_bytes(dir.file("empty.png"), {});
  expect_error(load_image(dir.file("empty.png")), dir.file("empty.png"), "empty");

  const std::string text = "this is not an image, just some text\n";
  write_bytes(dir.file("text.png"), std::vector<uint8_t>(text.begin(), text.end()));
  expect_error(load_image(dir.file("text.png")), dir.file("text.png"), "not a PNG or JPEG");
  const std::vector<uint8_t> gif = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0, 0, 0, 0, ';'};
  write_bytes(dir.file("image.gif"), gif);
  expect_error(load_image(dir.file("image.gif")), dir.file("image.gif"), "not a PNG or JPEG");

  // Zero-sized images: a PNG of 0x0 and one of 0x5, a JPEG whose frame says 0x0.
  write_bytes(dir.file("zero.png"), make_png(0, 0, 8, 2, {}));
  expect_error(load_image(dir.file("zero.png")), dir.file("zero.png"), "zero-sized");
  write_bytes(dir.file("zero_w.png"), make_png(0, 5, 8, 2, {}));
  expect_error(load_image(dir.file("zero_w.png")), dir.file("zero_w.png"), "zero-sized");
  std::vector<uint8_t> jpeg = make_jpeg(random_image(16, 16, 1), 90);
  for (size_t i = 0; i + 8 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {  // SOF0: FF C0, length(2), precision, h(2), w(2)
      std::fill(jpeg.begin() + i + 5, jpeg.begin() + i + 9, 0);
      break;
    }
  }
  write_bytes(dir.file("zero.jpg"), jpeg);
  expect_error(load_image(dir.file("zero.jpg")), dir.file("zero.jpg"), "zero-sized");

  // Truncated PNGs: the fixture cut inside IHDR, inside IDAT, before IEND, inside IEND.
  const std::vector<uint8_t> png = read_bytes(fixture_file("test_image.png"));
  ASSERT_GT(png.size(), 100u);
  for (size_t keep : {size_t(8), size_t(20), png.size() / 2, png.size() - 12, png.size() - 3}) {
    const std::string path = dir.file("cut" + std::to_string(keep) + ".png");
    write_bytes(path, std::vector<uint8_t>(png.begin(), png.begin() + keep));
    expect_error(load_image(path), path, "truncated PNG");
  }
  // Trailing bytes after IEND are ignored (as PIL does).
  std::vector<uint8_t> padded = png;
  padded.insert(padded.end(), 16, 0);
  write_bytes(dir.file("padded.png"), padded);
  auto padded_png = load_image(dir.file("padded.png"));
  ASSERT_OK(padded_png);

  // A complete PNG structure with garbage image data: stb_image's error, with the path.
  std::vector<uint8_t> rows(4 * 4 * 3, 9);
  std::vector<uint8_t> corrupt = make_png(4, 4, 8, 2, rows);
  const size_t idat = 8 + 25 + 8;  // signature, IHDR chunk, IDAT length + type
  corrupt[idat] = 0x00;
  corrupt[idat + 1] = 0x00;  // not a zlib header
  write_bytes(dir.file("corrupt.png"), corrupt);
  expect_error(load_image(dir.file("corrupt.png")), dir.file("corrupt.png"), "cannot decode");

  // Truncated JPEGs: without the EOI marker, and cut in the middle of the scan.
  const std::vector<uint8_t> good_jpeg = make_jpeg(random_image(64, 48, 2), 90);
  ASSERT_EQ(good_jpeg[good_jpeg.size() - 2], 0xFF);
  ASSERT_EQ(good_jpeg.back(), 0xD9);
  for (size_t keep : {good_jpeg.size() - 2, good_jpeg.size() * 3 / 4, size_t(100)}) {
    const std::string path = dir.file("cut" + std::to_string(keep) + ".jpg");
    write_bytes(path, std::vector<uint8_t>(good_jpeg.begin(), good_jpeg.begin() + keep));
    expect_error(load_image(path), path, "truncated JPEG");
  }
  std::vector<uint8_t> padded_jpeg = good_jpeg;
  padded_jpeg.insert(padded_jpeg.end(), 10, 0);
  write_bytes(dir.file("padded.jpg"), padded_jpeg);
  auto padded_jpg = load_image(dir.file("padded.jpg"));
  ASSERT_OK(padded_jpg);
  // A stray byte between two marker segments is skipped (libjpeg and stb_image both do).
  std::vector<uint8_t> stray = good_jpeg;
  ASSERT_EQ(stray[2], 0xFF);
  const size_t first_segment_end = 4 + ((size_t(stray[4]) << 8) | stray[5]);
  stray.insert(stray.begin() + first_segment_end, 0x00);
  write_bytes(dir.file("stray.jpg"), stray);
  auto stray_jpg = load_image(dir.file("stray.jpg"));
  ASSERT_OK(stray_jpg);
  EXPECT_EQ(stray_jpg->rgb, padded_jpg->rgb);
  // A complete JPEG structure with a bad Huffman table (its class / index byte): libjpeg's
  // error, with the path.
  std::vector<uint8_t> bad_table = good_jpeg;
  size_t dht = 2;
  while (dht + 4 < bad_table.size() && !(bad_table[dht] == 0xFF && bad_table[dht + 1] == 0xC4)) ++dht;
  ASSERT_LT(dht + 4, bad_table.size()) << "no DHT segment";
  bad_table[dht + 4] = 0x57;  // table class 5, index 7: neither exists
  write_bytes(dir.file("bad_table.jpg"), bad_table);
  expect_error(load_image(dir.file("bad_table.jpg")), dir.file("bad_table.jpg"), "cannot decode");
}

// A DHT table whose 16 code counts add up past 256: stb_image's table builder (Debian's 2022
// copy, which read every JPEG header first) wrote out of bounds on it; the structure check now
// refuses it before any decoder runs.
TEST(VisionImage, JpegHuffmanCountsPast256AreRefused) {
  test::TempDir dir;
  std::vector<uint8_t> jpeg = make_jpeg(random_image(16, 16, 3), 90);
  size_t dht = 2;
  while (dht + 4 < jpeg.size() && !(jpeg[dht] == 0xFF && jpeg[dht + 1] == 0xC4)) ++dht;
  ASSERT_LT(dht + 21, jpeg.size()) << "no DHT segment";
  for (size_t i = 0; i < 16; ++i) jpeg[dht + 5 + i] = 0xFF;  // 16 x 255 codes
  write_bytes(dir.file("counts.jpg"), jpeg);
  expect_error(load_image(dir.file("counts.jpg")), dir.file("counts.jpg"), "bad Huffman table");
}

// The audit's 13-byte reproducer: a DHT segment cut short, whose counts (stb_image's reader
// reads zeros, or these 0xFF bytes, past the end) pass 256. Refused before any decoder runs.
TEST(VisionImage, ThirteenByteJpegWithHuffmanCountsPast256IsRefused) {
  const std::vector<uint8_t> jpeg = {0xFF, 0xD8, 0xFF, 0xC4, 0x00, 0x43, 0x00,
                                     0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  ASSERT_EQ(jpeg.size(), 13u);
  expect_error(decode_image(jpeg.data(), jpeg.size(), "thirteen.jpg"), "thirteen.jpg", "JPEG");
  std::vector<uint8_t> whole = jpeg;  // the same counts in a segment that is all there
  whole[5] = 0x13;                    // length 19: class byte and 16 counts
  whole.insert(whole.end(), {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF});
  expect_error(decode_image(whole.data(), whole.size(), "whole.jpg"), "whole.jpg", "JPEG");
}

TEST(VisionImage, JpegDecodes) {
  // A smooth image survives JPEG at quality 100 nearly unchanged.
  Image image;
  image.width = 48;
  image.height = 32;
  for (int64_t y = 0; y < image.height; ++y) {
    for (int64_t x = 0; x < image.width; ++x) {
      image.rgb.push_back(static_cast<uint8_t>(x * 5));
      image.rgb.push_back(static_cast<uint8_t>(y * 7));
      image.rgb.push_back(static_cast<uint8_t>(128 + (x - y)));
    }
  }
  test::TempDir dir;
  write_bytes(dir.file("ramp.jpg"), make_jpeg(image, 100));
  auto loaded = load_image(dir.file("ramp.jpg"));
  ASSERT_OK(loaded);
  ASSERT_EQ(loaded->width, 48);
  ASSERT_EQ(loaded->height, 32);
  int max_diff = 0;
  for (size_t i = 0; i < image.rgb.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(int(loaded->rgb[i]) - int(image.rgb[i])));
  }
  EXPECT_LE(max_diff, 6);
}

// EXIF orientation: the files of test/data/exif (scripts/make_image_fixtures.py) come out as
// transformers' load_image shows them (PIL's ImageOps.exif_transpose, then convert("RGB")),
// exactly, for PNG (eXIf chunk) and JPEG (APP1); the JPEGs' pixels are also the orientation-1
// file's, moved.
TEST(VisionImage, ExifOrientationAsPil) {
  const std::string dir = test::test_data_dir() + "/exif/";
  std::ifstream in(dir + "pil_exif.json");
  ASSERT_TRUE(in) << dir << "pil_exif.json";
  const nlohmann::json doc = nlohmann::json::parse(in);
  ASSERT_EQ(doc["png"].size(), 8u);
  ASSERT_EQ(doc["jpeg"].size(), 8u);
  for (const auto& c : doc["png"]) {
    SCOPED_TRACE(c["file"].get<std::string>());
    auto image = load_image(dir + c["file"].get<std::string>());
    ASSERT_OK(image);
    EXPECT_EQ(image->width, c["width"].get<int64_t>());
    EXPECT_EQ(image->height, c["height"].get<int64_t>());
    EXPECT_EQ(image->rgb, c["rgb"].get<std::vector<uint8_t>>());
  }
  auto upright = load_image(dir + "orientation_1.jpg");
  ASSERT_OK(upright);
  for (const auto& c : doc["jpeg"]) {
    SCOPED_TRACE(c["file"].get<std::string>());
    auto image = load_image(dir + c["file"].get<std::string>());
    ASSERT_OK(image);
    ASSERT_EQ(image->width, c["width"].get<int64_t>());
    ASSERT_EQ(image->height, c["height"].get<int64_t>());
    EXPECT_EQ(image->rgb, c["rgb"].get<std::vector<uint8_t>>());
    EXPECT_EQ(image->rgb, apply_orientation(*upright, c["orientation"].get<int>()).rgb);
  }
}

// The orientation tag read from a little-endian TIFF header too (PIL writes big-endian), and
// malformed or out-of-range tags leave the image as decoded.
TEST(VisionImage, ExifOrientationByteOrderAndBadTags) {
  const std::string dir = test::test_data_dir() + "/exif/";
  const std::vector<uint8_t> plain = read_bytes(dir + "orientation_1.jpg");
  ASSERT_GT(plain.size(), 2u);
  // An APP1 "Exif" segment right after SOI: a TIFF header and one IFD entry (tag, type, count,
  // value), in the given byte order.
  auto with_exif = [&](bool little, uint16_t tag, uint16_t type, uint32_t count, uint16_t value) {
    std::vector<uint8_t> tiff;
    auto put16 = [&](uint32_t v) {
      if (little) tiff.insert(tiff.end(), {uint8_t(v), uint8_t(v >> 8)});
      else tiff.insert(tiff.end(), {uint8_t(v >> 8), uint8_t(v)});
    };
    auto put32 = [&](uint32_t v) {
      if (little) { put16(v & 0xFFFF); put16(v >> 16); }
      else { put16(v >> 16); put16(v & 0xFFFF); }
    };
    tiff.insert(tiff.end(), little ? std::initializer_list<uint8_t>{'I', 'I'} : std::initializer_list<uint8_t>{'M', 'M'});
    put16(42);
    put32(8);
    put16(1);
    put16(tag);
    put16(type);
    put32(count);
    put16(value);
    put16(0);
    put32(0);  // no next IFD
    std::vector<uint8_t> segment = {0xFF, 0xE1, 0, 0, 'E', 'x', 'i', 'f', 0, 0};
    segment.insert(segment.end(), tiff.begin(), tiff.end());
    const size_t length = segment.size() - 2;
    segment[2] = uint8_t(length >> 8);
    segment[3] = uint8_t(length);
    std::vector<uint8_t> out(plain.size() + segment.size());
    std::copy(plain.begin(), plain.begin() + 2, out.begin());
    std::copy(segment.begin(), segment.end(), out.begin() + 2);
    std::copy(plain.begin() + 2, plain.end(), out.begin() + 2 + static_cast<std::ptrdiff_t>(segment.size()));
    return out;
  };
  auto decode = [&](const std::vector<uint8_t>& bytes) { return decode_image(bytes.data(), bytes.size(), "exif.jpg"); };
  auto upright = decode(plain);
  auto rotated = load_image(dir + "orientation_6.jpg");
  ASSERT_OK(upright);
  ASSERT_OK(rotated);
  for (bool little : {true, false}) {
    auto image = decode(with_exif(little, 0x0112, 3, 1, 6));
    ASSERT_OK(image);
    EXPECT_EQ(image->width, upright->height);  // rotated a quarter turn
    EXPECT_EQ(image->height, upright->width);
    EXPECT_EQ(image->rgb, rotated->rgb) << (little ? "II" : "MM");
  }
  const std::vector<uint8_t> bad[] = {
      with_exif(true, 0x0112, 3, 1, 9),   // out of range
      with_exif(true, 0x0112, 3, 1, 0),   // out of range
      with_exif(true, 0x0112, 4, 1, 6),   // a LONG, not a SHORT
      with_exif(true, 0x0112, 3, 2, 6),   // two values
      with_exif(true, 0x0111, 3, 1, 6),   // another tag
  };
  for (const auto& bytes : bad) {
    auto image = decode(bytes);
    ASSERT_OK(image);
    EXPECT_EQ(image->width, upright->width);
    EXPECT_EQ(image->rgb, upright->rgb);
  }
  // An IFD offset past the end of the segment: still decodes, upright. (The TIFF header starts
  // at byte 12: SOI, marker, length, "Exif\0\0"; its IFD offset at 16, big-endian.)
  std::vector<uint8_t> cut = with_exif(false, 0x0112, 3, 1, 6);
  cut[18] = 0xFF;
  cut[19] = 0xFF;
  auto image = decode(cut);
  ASSERT_OK(image);
  EXPECT_EQ(image->rgb, upright->rgb);
  EXPECT_EQ(image->width, upright->width);
}

// JPEGs of every common kind decode to exactly PIL's pixels (both through libjpeg-turbo with
// PIL's settings): test/data/jpeg, made and decoded by scripts/make_image_fixtures.py.
TEST(VisionImage, JpegDecodesAsPil) {
  const std::string dir = test::test_data_dir() + "/jpeg/";
  std::ifstream in(dir + "pil_jpeg.json");
  ASSERT_TRUE(in) << dir << "pil_jpeg.json";
  const nlohmann::json doc = nlohmann::json::parse(in);
  ASSERT_EQ(doc.size(), 6u);
  for (const auto& c : doc) {
    SCOPED_TRACE(c["file"].get<std::string>());
    auto image = load_image(dir + c["file"].get<std::string>());
    ASSERT_OK(image);
    EXPECT_EQ(image->width, c["width"].get<int64_t>());
    EXPECT_EQ(image->height, c["height"].get<int64_t>());
    EXPECT_EQ(image->rgb, c["rgb"].get<std::vector<uint8_t>>());
  }
}

TEST(VisionImage, ColourTypesConvertToRgbAsPil) {
  test::TempDir dir;
  auto load = [&](const std::string& name, const std::vector<uint8_t>& png) {
    write_bytes(dir.file(name), png);
    return load_image(dir.file(name));
  };
  // Gray (L): replicated.
  auto gray = load("gray.png", make_png(3, 1, 8, 0, {0, 100, 255}));
  ASSERT_OK(gray);
  EXPECT_EQ(gray->rgb, (std::vector<uint8_t>{0, 0, 0, 100, 100, 100, 255, 255, 255}));
  // Gray + alpha (LA): gray replicated, alpha dropped (not composited on a background).
  auto gray_alpha = load("la.png", make_png(2, 1, 8, 4, {40, 0, 200, 128}));
  ASSERT_OK(gray_alpha);
  EXPECT_EQ(gray_alpha->rgb, (std::vector<uint8_t>{40, 40, 40, 200, 200, 200}));
  // RGBA: alpha dropped.
  auto rgba = load("rgba.png", make_png(2, 1, 8, 6, {10, 20, 30, 0, 40, 50, 60, 255}));
  ASSERT_OK(rgba);
  EXPECT_EQ(rgba->rgb, (std::vector<uint8_t>{10, 20, 30, 40, 50, 60}));
  // Palette (P) with a transparent entry: the palette colours.
  auto palette = load("p.png", make_png(4, 1, 8, 3, {2, 0, 1, 2}, {255, 0, 0, 0, 255, 0, 1, 2, 3}, {0, 255}));
  ASSERT_OK(palette);
  EXPECT_EQ(palette->rgb, (std::vector<uint8_t>{1, 2, 3, 255, 0, 0, 0, 255, 0, 1, 2, 3}));
  // 16-bit RGB: the high byte of each channel (PIL reads RGB;16B as RGB the same way).
  auto deep = load("rgb16.png", make_png(1, 1, 16, 2, {0x12, 0x34, 0xAB, 0xCD, 0xFF, 0x00}));
  ASSERT_OK(deep);
  EXPECT_EQ(deep->rgb, (std::vector<uint8_t>{0x12, 0xAB, 0xFF}));
  // Plain RGB, 2x2: row-major.
  auto rgb = load("rgb.png", make_png(2, 2, 8, 2, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  ASSERT_OK(rgb);
  EXPECT_EQ(rgb->width, 2);
  EXPECT_EQ(rgb->height, 2);
  EXPECT_EQ(rgb->rgb, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
}

// ---- preprocessor_config.json ----

TEST(VisionImage, ConfigFromJson) {
  auto config = ImageProcessorConfig::from_json(fixture_preprocessor_config());
  ASSERT_OK(config);
  EXPECT_EQ(config->min_pixels, 65536);
  EXPECT_EQ(config->max_pixels, 16777216);
  EXPECT_EQ(config->patch_size, 16);
  EXPECT_EQ(config->temporal_patch_size, 2);
  EXPECT_EQ(config->merge_size, 2);
  EXPECT_EQ(config->factor(), 32);
  EXPECT_EQ(config->patch_dim(), 1536);
  EXPECT_EQ(config->image_mean, (std::array<double, 3>{0.5, 0.5, 0.5}));
  EXPECT_EQ(config->image_std, (std::array<double, 3>{0.5, 0.5, 0.5}));
  EXPECT_DOUBLE_EQ(config->rescale_factor, 1.0 / 255.0);
  EXPECT_TRUE(config->do_resize && config->do_rescale && config->do_normalize);

  // Round trip.
  auto again = ImageProcessorConfig::from_json(config->to_json());
  ASSERT_OK(again);
  EXPECT_EQ(again->to_json(), config->to_json());

  // Older Qwen2-VL files: top-level min_pixels / max_pixels (which override size), defaults for
  // the rest (Qwen2VLImageProcessor: patch 14, CLIP mean / std).
  auto old = ImageProcessorConfig::from_json(
      {{"min_pixels", 3136}, {"max_pixels", 12845056}, {"size", {{"shortest_edge", 1}, {"longest_edge", 2}}},
       {"rescale_factor", 0.00392156862745098}, {"do_normalize", false}});
  ASSERT_OK(old);
  EXPECT_EQ(old->min_pixels, 3136);
  EXPECT_EQ(old->max_pixels, 12845056);
  EXPECT_EQ(old->patch_size, 14);
  EXPECT_FALSE(old->do_normalize);
  EXPECT_DOUBLE_EQ(old->image_mean[0], 0.48145466);
  auto in_size = ImageProcessorConfig::from_json({{"size", {{"min_pixels", 4096}, {"max_pixels", 65536}}}});
  ASSERT_OK(in_size);
  EXPECT_EQ(in_size->min_pixels, 4096);
  EXPECT_EQ(in_size->max_pixels, 65536);

  const nlohmann::json bad[] = {
      {{"resample", 2}},
      {{"image_std", {0.5, 0.0, 0.5}}},
      {{"image_mean", {0.5, 0.5}}},
      {{"patch_size", "16"}},
      {{"patch_size", 0}},
      {{"patch_size", 4294967296}},  // factor() squared once overflowed
      {{"merge_size", nlohmann::json::parse("18446744073709551615")}},
      {{"size", {{"shortest_edge", 1}, {"longest_edge", 1e300}}}},
      {{"size", {{"shortest_edge", 100}, {"longest_edge", 10}}}},
      {{"do_resize", "yes"}},
      nlohmann::json::array(),
  };
  for (const auto& j : bad) {
    auto result = ImageProcessorConfig::from_json(j);
    ASSERT_FALSE(result.ok()) << j.dump();
    EXPECT_NE(result.status().message().find("preprocessor_config.json"), std::string::npos)
        << result.status().message();
  }
}

TEST(VisionImage, PreprocessRefusesBadInput) {
  ImageProcessorConfig config;
  EXPECT_FALSE(preprocess_image(Image{}, config).ok());
  Image wrong;
  wrong.width = 4;
  wrong.height = 4;
  wrong.rgb.resize(10);
  EXPECT_FALSE(preprocess_image(wrong, config).ok());
  // do_resize off needs sides that are multiples of patch_size * merge_size.
  config.do_resize = false;
  auto odd = preprocess_image(random_image(30, 28, 1), config);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("multiple of 28"), std::string::npos) << odd.status().message();
  auto even = preprocess_image(random_image(56, 28, 1), config);
  ASSERT_OK(even);
  EXPECT_EQ(even->grid, (std::array<int64_t, 3>{1, 2, 4}));
}

}  // namespace
}  // namespace kuiper
