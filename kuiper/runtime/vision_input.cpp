#include "kuiper/runtime/vision_input.h"

#include <algorithm>

namespace kuiper {

std::string with_image_placeholders(const std::string& text, size_t count) {
  std::string out;
  for (size_t i = 0; i < count; ++i) out += std::string(kVisionStart) + kImagePad + kVisionEnd;
  return out + text;
}

std::vector<ProcessedImage> pixels_of(const std::vector<PromptImage>& images) {
  std::vector<ProcessedImage> pixels;
  pixels.reserve(images.size());
  for (const PromptImage& image : images) pixels.push_back(image.pixels);
  return pixels;
}

Result<ImageInput> ImageInput::from_model_file(const ModelFile& file) {
  const ModelConfig& config = file.config();
  if (!config.vision.has_value() || config.image_token_id < 0) {
    return Status::Error(file.path() + " is a " + architecture_name(config.arch) +
                         " model: it takes no images");
  }
  const auto pre = file.metadata().find("preprocessor_config");
  if (pre == file.metadata().end()) {
    return Status::Error(file.path() + " holds no preprocessor_config: convert the model again");
  }
  ImageInput input;
  Result<ImageProcessorConfig> processor = ImageProcessorConfig::from_json(*pre);
  if (!processor.ok()) return processor.status().With(file.path() + ": preprocessor_config");
  input.processor_ = std::move(processor).value();
  input.image_pad_id_ = static_cast<int32_t>(config.image_token_id);
  input.merge_size_ = config.vision->spatial_merge_size;
  return input;
}

Result<PromptImage> ImageInput::load(const std::string& path) const {
  Result<Image> image = load_image(path);
  if (!image.ok()) {
    const std::string& message = image.status().message();
    if (message.find(path) != std::string::npos) return image.status();
    return Status::Error("image " + path + ": " + message);
  }
  Result<ProcessedImage> pixels = preprocess_image(*image, processor_);
  if (!pixels.ok()) return pixels.status().With("image " + path);
  return PromptImage{path, std::move(pixels).value()};
}

Result<PromptImage> ImageInput::decode(const std::string& bytes, const std::string& name) const {
  Result<Image> image =
      decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
  if (!image.ok()) return image.status().With("image " + name);
  Result<ProcessedImage> pixels = preprocess_image(*image, processor_);
  if (!pixels.ok()) return pixels.status().With("image " + name);
  return PromptImage{name, std::move(pixels).value()};
}

std::vector<int64_t> image_tokens(const ModelConfig& config,
                                  const std::vector<ProcessedImage>& images) {
  std::vector<int64_t> tokens;
  for (const ProcessedImage& image : images) {
    tokens.push_back(config.vision.has_value()
                         ? image.merged_tokens(config.vision->spatial_merge_size)
                         : 0);
  }
  return tokens;
}

std::vector<std::pair<size_t, size_t>> image_pad_runs(const std::vector<int32_t>& ids,
                                                      int32_t image_pad_id) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != image_pad_id) continue;
    size_t end = i;
    while (end < ids.size() && ids[end] == image_pad_id) ++end;
    runs.emplace_back(i, end);
    i = end - 1;
  }
  return runs;
}

namespace {

std::string plural(size_t n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

}  // namespace

Result<std::vector<int32_t>> expand_image_pads(const std::vector<int32_t>& ids,
                                               int32_t image_pad_id,
                                               const std::vector<int64_t>& tokens) {
  size_t pads = 0;
  for (int32_t id : ids) pads += id == image_pad_id ? 1 : 0;
  if (pads != tokens.size()) {
    return Status::Error("the prompt holds " + plural(pads, std::string(kImagePad) + " token") +
                         " for " + plural(tokens.size(), "image") +
                         (pads > tokens.size() ? " (is " + std::string(kImagePad) +
                                                     " written in the text?)"
                                               : ""));
  }
  std::vector<int32_t> out;
  out.reserve(ids.size());
  size_t image = 0;
  for (int32_t id : ids) {
    if (id != image_pad_id) {
      out.push_back(id);
      continue;
    }
    out.insert(out.end(), static_cast<size_t>(tokens[image++]), image_pad_id);
  }
  return out;
}

Status check_image_pads(const std::vector<int32_t>& ids, int32_t image_pad_id,
                        const std::vector<int64_t>& tokens) {
  const std::vector<std::pair<size_t, size_t>> runs = image_pad_runs(ids, image_pad_id);
  const std::string pad = std::string(kImagePad) + " (" + std::to_string(image_pad_id) + ")";
  if (runs.size() != tokens.size()) {
    return Status::Error("the tokens hold " + plural(runs.size(), "run") + " of " + pad +
                         " tokens, one per image is needed, for " +
                         plural(tokens.size(), "image"));
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const size_t have = runs[i].second - runs[i].first;
    if (static_cast<int64_t>(have) != tokens[i]) {
      return Status::Error("image " + std::to_string(i + 1) + " needs " +
                           std::to_string(tokens[i]) + " " + pad + " tokens; the run at position " +
                           std::to_string(runs[i].first) + " has " + std::to_string(have));
    }
  }
  return Status::Ok();
}

Result<ImagePixels> image_pixels(const std::vector<ProcessedImage>& images) {
  if (images.empty()) return Status::Error("no images");
  int64_t patches = 0;
  const int64_t patch_dim = images[0].patch_dim;
  ImagePixels out;
  for (size_t i = 0; i < images.size(); ++i) {
    const ProcessedImage& im = images[i];
    if (im.patch_dim != patch_dim || im.patches != im.grid[0] * im.grid[1] * im.grid[2] ||
        static_cast<int64_t>(im.pixel_values.size()) != im.patches * im.patch_dim) {
      return Status::Error("image " + std::to_string(i) + ": " + std::to_string(im.patches) +
                           " patches of " + std::to_string(im.patch_dim) + " values (" +
                           std::to_string(im.pixel_values.size()) + " in all) for grid (" +
                           std::to_string(im.grid[0]) + ", " + std::to_string(im.grid[1]) + ", " +
                           std::to_string(im.grid[2]) + "), beside images of patches of " +
                           std::to_string(patch_dim));
    }
    patches += im.patches;
    out.grids.push_back(im.grid);
  }
  KUIPER_ASSIGN_OR_RETURN(out.values, Tensor::empty({patches, patch_dim}, DataType::kFp32));
  float* dst = out.values.data<float>();
  for (const ProcessedImage& im : images) {
    dst = std::copy(im.pixel_values.begin(), im.pixel_values.end(), dst);
  }
  return out;
}

Result<ImageSpan> encode_image_span(Model& model, const std::vector<int32_t>& ids,
                                    int64_t rope_start, const std::vector<ProcessedImage>& images) {
  const ModelConfig& config = model.config();
  if (!config.vision.has_value()) {
    return Status::Error(std::string("a ") + architecture_name(config.arch) +
                         " model takes no images");
  }
  ImageSpan span;
  KUIPER_ASSIGN_OR_RETURN(ImagePixels pixels, image_pixels(images));
  KUIPER_ASSIGN_OR_RETURN(span.index, qwen3_vl_rope_index(ids, config.image_token_id,
                                                          config.vision->spatial_merge_size,
                                                          pixels.grids));
  for (int32_t& p : span.index.positions) p += static_cast<int32_t>(rope_start);
  KUIPER_ASSIGN_OR_RETURN(span.features, model.encode_images(pixels));
  return span;
}

int64_t RopeDeltas::at(int64_t position) const {
  int64_t delta = 0;
  for (const auto& [first, d] : entries_) {
    if (first <= position) delta = d;
  }
  return delta;
}

void RopeDeltas::add(const RopeIndex& index, int64_t start, int64_t T) {
  // One entry per image, so a cache cut back to between two images keeps the first one's delta.
  // The t row of the positions gives it for a token after the image in this span.
  truncate(start);
  const int64_t before = at(start);
  for (const auto& [first, count] : index.spans) {
    const int64_t after = first + count;
    const int64_t delta = after < T ? index.positions[static_cast<size_t>(after)] - (start + after)
                                    : before + index.delta;
    entries_.emplace_back(start + after, delta);
  }
}

void RopeDeltas::truncate(int64_t length) {
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [length](const auto& e) { return e.first > length; }),
                 entries_.end());
}

}  // namespace kuiper
