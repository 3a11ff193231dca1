#include "kuiper/runtime/vision_input.h"

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

}  // namespace kuiper
