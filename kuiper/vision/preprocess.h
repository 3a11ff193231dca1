// The Qwen2-VL / Qwen3-VL image processor (Hugging Face's Qwen2VLImageProcessor, PIL back end):
// smart resize to multiples of patch_size * merge_size within [min_pixels, max_pixels], PIL-exact
// bicubic resampling, rescale and normalise, the frame repeated temporal_patch_size times, and
// patches flattened in the order the vision tower reads them.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/base/status.h"
#include "kuiper/vision/image.h"

namespace kuiper {

// preprocessor_config.json of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoint.
struct ImageProcessorConfig {
  bool do_resize = true;
  bool do_rescale = true;
  bool do_normalize = true;
  int64_t min_pixels = 56 * 56;          // size.shortest_edge
  int64_t max_pixels = 28 * 28 * 1280;   // size.longest_edge
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  double rescale_factor = 1.0 / 255.0;
  std::array<double, 3> image_mean{0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN
  std::array<double, 3> image_std{0.26862954, 0.26130258, 0.27577711};   // OPENAI_CLIP_STD

  // Resized sides are multiples of this.
  int64_t factor() const { return patch_size * merge_size; }
  // Values in one flattened patch: 3 * temporal_patch_size * patch_size^2.
  int64_t patch_dim() const { return 3 * temporal_patch_size * patch_size * patch_size; }

  Status validate() const;
  // Hugging Face keys (size.shortest_edge / longest_edge, ...): from_json(to_json()) round-trips.
  nlohmann::json to_json() const;
  // Missing keys take the Hugging Face Qwen2VLImageProcessor defaults above. The older top-level
  // min_pixels / max_pixels keys override size, as in transformers. Only BICUBIC resampling
  // ("resample": 3) is supported.
  static Result<ImageProcessorConfig> from_json(const nlohmann::json& preprocessor_config);
};

struct ProcessedImage {
  std::vector<float> pixel_values;  // [patches, patch_dim] row-major, processor order
  int64_t patches = 0, patch_dim = 0;
  std::array<int64_t, 3> grid{};    // (t, h, w) in patches
  int64_t merged_tokens(int64_t merge) const { return grid[0] * grid[1] * grid[2] / (merge * merge); }
};

// transformers' smart_resize: (height, width) rounded (half to even) to multiples of `factor`;
// when that holds more than max_pixels pixels, scaled down by sqrt(h*w/max_pixels) and floored
// (at least one factor); when fewer than min_pixels, scaled up by sqrt(min_pixels/(h*w)) and
// ceiled. An aspect ratio above 200 or a non-positive side is an error.
Result<std::pair<int64_t, int64_t>> smart_resize(int64_t height, int64_t width, int64_t factor,
                                                 int64_t min_pixels, int64_t max_pixels);

// PIL's Image.resize(..., BICUBIC) on an RGB image (libImaging/Resample.c): separable, horizontal
// pass then vertical, the a = -0.5 cubic kernel widened by the downscale factor, normalised
// coefficients in 22-bit fixed point, each pass rounded and clipped to uint8. A side that keeps
// its size is not resampled. A non-positive size gives an empty image.
Image resize_bicubic(const Image& image, int64_t width, int64_t height);

// Hugging Face's Qwen2VLImageProcessor (PIL back end) on one image: pixel_values
// [grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size^2] and grid (1, h/patch, w/patch).
Result<ProcessedImage> preprocess_image(const Image& image, const ImageProcessorConfig& config);

}  // namespace kuiper
