// A Model for runtime tests, with no network: a token's logits are a hash of everything the KV
// pool holds for its sequence at positions [0, p] (each row: the token, or the image feature
// that replaced it, and its rotary positions), read through the entry's block table. A block
// table naming the wrong blocks, a prefix that was never written, a wrong position or image row
// gives other logits (or an error), so a runtime that gets paging, prefix sharing or
// preemption wrong gives other tokens than a sequence run alone. Its pool can have small blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kuiper/model/model.h"

namespace kuiper::test {

struct FakeModelShape {
  int64_t block_size = 4;
  int64_t blocks = 32;
  int64_t max_context = 64;
  int64_t vocab = 32;
  // A vision-language config: M-RoPE, image-pad token vocab - 1, merge size 2.
  bool vision = false;
  std::vector<int64_t> eos_token_ids;
};

class FakeModel : public Model {
 public:
  static std::unique_ptr<FakeModel> create(const FakeModelShape& shape);

  int32_t image_pad_id() const { return static_cast<int32_t>(config_.image_token_id); }
  // Per forward(): its entries' (start, token count).
  const std::vector<std::vector<std::pair<int64_t, int64_t>>>& batches() const { return batches_; }
  // forward() calls given tokens on the device (a step fed by the one before).
  int64_t fed_steps() const { return fed_steps_; }
  // Of those, the ones in which some entry's tokens all came from the host (a prefill chunk, a
  // request sitting a step out of the fed rows).
  int64_t mixed_fed_steps() const { return mixed_fed_steps_; }
  // Images encoded by encode_images() so far.
  int64_t encoded_images() const { return encoded_images_; }

  Result<ImageFeatures> encode_images(const ImagePixels& images) override;

 protected:
  Result<Tensor> run_batch(Span<const SequenceInput> batch, const Tensor* tokens) override;

 private:
  FakeModel(ModelConfig config, const ModelOptions& options, int64_t block_size, int64_t blocks);

  std::vector<uint64_t> rows_;  // per pool row: the hash of what it holds; 0 never written
  std::vector<std::vector<std::pair<int64_t, int64_t>>> batches_;
  int64_t encoded_images_ = 0;
  int64_t fed_steps_ = 0;
  int64_t mixed_fed_steps_ = 0;
};

}  // namespace kuiper::test
