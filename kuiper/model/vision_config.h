// VisionConfig: the Qwen3-VL vision tower's shape, from config.json's "vision_config", and the
// tensors it needs by their Hugging Face names ("model.visual.*").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/base/status.h"
#include "kuiper/model/tensor_spec.h"

namespace kuiper {

struct VisionConfig {
  int64_t depth = 0;                    // number of vision blocks
  int64_t hidden_size = 0;              // width of the vision blocks
  int64_t intermediate_size = 0;        // vision MLP width
  int64_t num_heads = 0;                // vision attention heads (head dim = hidden / heads)
  int64_t in_channels = 3;
  int64_t patch_size = 16;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  int64_t num_position_embeddings = 0;  // learned grid, side sqrt(n), interpolated to the image
  int64_t out_hidden_size = 0;          // merger output width (= text hidden size)
  std::vector<int64_t> deepstack_visual_indexes;  // blocks whose output feeds a deepstack merger
  double layer_norm_eps = 1e-6;

  int64_t head_dim() const { return hidden_size / num_heads; }
  // Values in one flattened patch: in_channels * temporal_patch_size * patch_size^2.
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  // Width of a merged token before the merger MLP: hidden * merge^2.
  int64_t merged_dim() const { return hidden_size * spatial_merge_size * spatial_merge_size; }

  Status validate() const;
  nlohmann::json to_json() const;
  static Result<VisionConfig> from_json(const nlohmann::json& j);
  // From config.json's "vision_config" object. Only hidden_act gelu_pytorch_tanh is supported.
  static Result<VisionConfig> from_hf(const nlohmann::json& vision_config);
};

// Every vision tensor by its Hugging Face name, with the shape the config implies.
std::vector<TensorSpec> expected_vision_tensors(const VisionConfig& config);

}  // namespace kuiper
