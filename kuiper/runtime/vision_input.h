// Images in a prompt, for vision-language models (Qwen3-VL): reading and preprocessing an image
// file as the model file's image processor says, the placeholder a user message holds per image,
// and the image-pad tokens that placeholder becomes once the image's size is known.
//
// A message with images is written as Qwen3-VL's chat template renders content
// [{type: image}, ..., {type: text}]: per image <|vision_start|><|image_pad|><|vision_end|>, then
// the text. Putting the placeholders in the message text works with any template, the text-only
// Qwen3 one included. After tokenization each <|image_pad|> is repeated merged_tokens times.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kuiper/base/status.h"
#include "kuiper/model/model.h"
#include "kuiper/model/model_file.h"
#include "kuiper/model/rope_index.h"
#include "kuiper/vision/image.h"
#include "kuiper/vision/preprocess.h"

namespace kuiper {

constexpr const char* kVisionStart = "<|vision_start|>";
constexpr const char* kImagePad = "<|image_pad|>";
constexpr const char* kVisionEnd = "<|vision_end|>";

// `count` placeholders followed by `text`.
std::string with_image_placeholders(const std::string& text, size_t count);

// An image ready for the model: where it came from and its pixel values.
struct PromptImage {
  std::string path;
  ProcessedImage pixels;
};

// The pixel values of `images`, in order.
std::vector<ProcessedImage> pixels_of(const std::vector<PromptImage>& images);

// What a vision-language model file says about its image input.
class ImageInput {
 public:
  // Fails, naming the file, for a model without a vision tower or without a usable
  // preprocessor_config.
  static Result<ImageInput> from_model_file(const ModelFile& file);

  // Reads and preprocesses an image file (PNG or JPEG). Every error names the file: missing,
  // not an image, zero size, truncated.
  Result<PromptImage> load(const std::string& path) const;
  // The same for an image file's bytes held in memory; errors say `name`.
  Result<PromptImage> decode(const std::string& bytes, const std::string& name) const;

  int32_t image_pad_id() const { return image_pad_id_; }
  int64_t merge_size() const { return merge_size_; }
  // How many <|image_pad|> tokens the image takes in the prompt.
  int64_t tokens(const PromptImage& image) const { return image.pixels.merged_tokens(merge_size_); }

 private:
  ImageProcessorConfig processor_;
  int32_t image_pad_id_ = -1;
  int64_t merge_size_ = 1;
};

// How many <|image_pad|> tokens each image takes with `config`'s merge size (0 each for a model
// without a vision tower).
std::vector<int64_t> image_tokens(const ModelConfig& config,
                                  const std::vector<ProcessedImage>& images);

// Where the runs of <|image_pad|> tokens are in `ids`: [begin, end) per run, in order.
std::vector<std::pair<size_t, size_t>> image_pad_runs(const std::vector<int32_t>& ids,
                                                      int32_t image_pad_id);

// Replaces the i-th single <|image_pad|> of `ids` (as the tokenizer gives a rendered placeholder)
// by tokens[i] copies. Fails when `ids` hold a different number of image pads than images.
Result<std::vector<int32_t>> expand_image_pads(const std::vector<int32_t>& ids,
                                               int32_t image_pad_id,
                                               const std::vector<int64_t>& tokens);

// Checks expanded `ids` hold one run of exactly tokens[i] <|image_pad|> tokens per image, in
// order; the message says which image and how many pads it needs and has.
Status check_image_pads(const std::vector<int32_t>& ids, int32_t image_pad_id,
                        const std::vector<int64_t>& tokens);

// The images' pixel values as the model's vision tower takes them: every image's patches in one
// fp32 [patches, patch_dim] tensor, and their grids. Fails for no images, images of different
// patch sizes, or an image whose pixel values do not fill its grid.
Result<ImagePixels> image_pixels(const std::vector<ProcessedImage>& images);

// The model input for a span of a prompt holding the image-pad runs of `images` (in order): the
// images' features from the model's vision tower, and the span's [3, T] rotary positions (its first
// token at rotary position `rope_start`) with their delta and image spans. The pad layout is
// checked before the tower runs.
struct ImageSpan {
  RopeIndex index;
  ImageFeatures features;
};
Result<ImageSpan> encode_image_span(Model& model, const std::vector<int32_t>& ids,
                                    int64_t rope_start, const std::vector<ProcessedImage>& images);

// The rope deltas of one sequence's cache (M-RoPE models): text after an image rotates at cache
// position + the delta the image leaves, until the next image. The deltas belong to the cache rows
// after each image: cutting the cache back before an image forgets its delta.
class RopeDeltas {
 public:
  // The delta of the token at cache position `position` (0 before any image).
  int64_t at(int64_t position) const;
  // Records the images of a span of T tokens run at cache position `start` with `index` (its
  // positions already shifted to the span's rotary start); the cache keeps [0, start) before it.
  void add(const RopeIndex& index, int64_t start, int64_t T);
  // The cache keeps positions [0, length): forgets the delta of every image whose last token is
  // at or after `length`.
  void truncate(int64_t length);
  void clear() { entries_.clear(); }

 private:
  // (first cache position, delta): the delta of every later position up to the next entry.
  std::vector<std::pair<int64_t, int64_t>> entries_;
};

}  // namespace kuiper
