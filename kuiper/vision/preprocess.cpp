#include "kuiper/vision/preprocess.h"

#include <algorithm>
#include <cmath>

#include "kuiper/base/json_reader.h"

namespace kuiper {

namespace {

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
  if (v.is_number_float()) {  // an integral float (12845056.0) is the integer, as Python's int()
    const double d = v.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9.0e15) {
      *out = static_cast<int64_t>(d);
      return Status::Ok();
    }
  }
  KUIPER_ASSIGN_OR_RETURN(*out, JsonReader(v, std::string("\"") + key + "\"").to_int());
  return Status::Ok();
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

// ---- configuration ----

Status ImageProcessorConfig::validate() const {
  // Bounded, so factor() squared and the pixel counts below cannot overflow.
  constexpr int64_t kMaxPatch = 1024, kMaxPixels = int64_t{1} << 40;
  if (patch_size <= 0 || temporal_patch_size <= 0 || merge_size <= 0 || patch_size > kMaxPatch ||
      temporal_patch_size > kMaxPatch || merge_size > kMaxPatch) {
    return Status::Error("patch_size, temporal_patch_size and merge_size must be in [1, " +
                         std::to_string(kMaxPatch) + "]");
  }
  if (max_pixels > kMaxPixels) {
    return Status::Error("size.longest_edge (max_pixels) " + std::to_string(max_pixels) +
                         " is beyond the limit " + std::to_string(kMaxPixels));
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
