// Qwen3-VL: the Qwen3 text decoder (QwenModel, with interleaved M-RoPE) fed by a vision tower.
// A prompt with images holds, per image, <|vision_start|> <|image_pad|> x merged_tokens
// <|vision_end|>; the pad tokens' embeddings are replaced by the vision embeddings, deepstack
// feature k is added to the hidden states of those tokens after decoder layer k, and every token
// gets a 3-D (t, h, w) rotary position (text tokens advance all three axes together, an image's
// merged grid spreads over h and w). Tokens after an image continue at cache position + rope
// delta on all three axes, which is ordinary RoPE at that shifted position.
//
// Prefill runs in ModelOptions::prefill_chunk pieces as QwenModel's does (an image may span
// pieces); decode (one token) takes QwenModel's path, the CUDA graph included.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "kuiper/model/model.h"
#include "kuiper/model/qwen_model.h"
#include "kuiper/model/vision_encoder.h"
#include "kuiper/vision/preprocess.h"

namespace kuiper {

// Qwen3-VL's get_rope_index for a prompt holding images, as a plain function.
struct RopeIndex {
  std::vector<int32_t> positions;  // [3, T] row-major: the t row, then the h row, then the w row
  int64_t delta = 0;               // max position + 1 - T: later tokens sit at cache pos + delta
  // Per image, in order: its first image-pad token and how many it has (merged_tokens).
  std::vector<std::pair<int64_t, int64_t>> spans;
};
// grids: (t, h, w) in patches per image, in the order the images appear in ids; merge: the vision
// tower's spatial_merge_size. Every image-pad token must belong to an image: image k takes the
// next t * (h / merge) * (w / merge) tokens, which must all be image_token_id.
Result<RopeIndex> qwen3_vl_rope_index(const std::vector<int32_t>& ids, int64_t image_token_id,
                                      int64_t merge,
                                      const std::vector<std::array<int64_t, 3>>& grids);

class Qwen3VLModel : public Model {
 public:
  static Result<std::unique_ptr<Qwen3VLModel>> create(std::shared_ptr<ModelFile> file,
                                                      const ModelOptions& options);
  ~Qwen3VLModel() override;

  // Text tokens (no image-pad tokens) at cache positions [start, start + T); their rotary
  // positions are shifted by the rope delta of the last image prompt before `start`.
  Result<Tensor> forward(const std::vector<int32_t>& ids, int64_t start,
                         bool all_logits) override;

  // ids holding the images' tokens (see the top of this file) at positions [start, ...): runs
  // the vision tower on the images' pixel values (images in the order of their tokens), then the
  // decoder. Later forward() calls continue with the rope delta.
  Result<Tensor> forward_with_images(const std::vector<int32_t>& ids, int64_t start,
                                     const std::vector<ProcessedImage>& images, bool all_logits);
  // The vision tower alone: embeddings and deepstack features of the images, concatenated in
  // order ([sum of merged_tokens, hidden] each), on the model's device.
  Result<VisionOutput> encode_images(const std::vector<ProcessedImage>& images);

  // A prompt with images, given the vision tower's output: embeds [N, hidden] for the N image-pad
  // tokens of ids (images in order), deepstack[k] [N, hidden] added after decoder layer k
  // (at most num_layers of them). fp32 (or the activation dtype), on any device.
  Result<Tensor> forward_with_vision_embeds(const std::vector<int32_t>& ids, int64_t start,
                                            const std::vector<std::array<int64_t, 3>>& grids,
                                            const Tensor& embeds,
                                            const std::vector<Tensor>& deepstack,
                                            bool all_logits);

  // The rope delta a token at cache position `position` gets (0 before any image).
  int64_t rope_delta_at(int64_t position) const;
  const VisionEncoder& vision() const { return *vision_; }

 private:
  Qwen3VLModel(std::unique_ptr<QwenModel> text, std::unique_ptr<VisionEncoder> vision);
  // Runs on the hidden states x of prompt rows [first, first + x.dim(0)) after the embedding
  // (layer -1) and after each decoder layer.
  using HiddenHook = std::function<Status(int64_t layer, Tensor& x, int64_t first)>;
  // One forward of the decoder, in prefill_chunk pieces: rope3 holds the [3, T] rotary positions
  // (null: cache position + delta on every axis).
  Result<Tensor> run(const std::vector<int32_t>& ids, int64_t start, bool all_logits,
                     const std::vector<int32_t>* rope3, const HiddenHook& hook);
  // Forgets the delta of every image whose last token is at or after `start` (its cache rows
  // are being rewritten).
  void truncate_deltas(int64_t start);

  std::unique_ptr<QwenModel> text_;
  std::unique_ptr<VisionEncoder> vision_;
  // (first cache position, delta): the delta of every later position up to the next entry; an
  // entry starts right after an image's last token and goes when the cache is rewritten from
  // before it.
  std::vector<std::pair<int64_t, int64_t>> deltas_;
};

}  // namespace kuiper
