// The Qwen3-VL vision tower: image patches in, one embedding per merged token out (the rows that
// replace the image-pad tokens of the prompt), plus the deepstack features the first decoder
// layers add to those rows.
//
// The graph, as Hugging Face's Qwen3VLVisionModel:
//   patch embedding (the stride = kernel Conv3d is a matmul of each flattened patch)
//   + learned position embeddings, bilinearly interpolated to the image's patch grid
//   -> blocks: x += proj(attention(LayerNorm1(x))) with a 2-D rotary embedding on q and k and
//      attention within each frame only; x += fc2(gelu_tanh(fc1(LayerNorm2(x))))
//   -> after block deepstack_visual_indexes[j]: deepstack merger j on the merged tokens
//   -> final merger: LayerNorm per patch, 4 patches -> 1 token, fc2(gelu(fc1(.))).
// Patches arrive in the image processor's order, where each run of merge^2 consecutive rows is
// one merged token's spatial block; positions and rotary angles are laid out the same way.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kuiper/model/images.h"
#include "kuiper/model/vision_config.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper {

class VisionEncoder {
 public:
  // A weight by its Hugging Face name ("model.visual.*"): a CPU tensor, bf16/f16/f32. On the CPU
  // the encoder keeps the tensor it is given (a view keeps its owner alive through the Tensor);
  // on the GPU it uploads a copy, matrices converted to the activation dtype.
  using WeightGetter = std::function<Result<Tensor>(const std::string& hf_name)>;

  // Every tensor of expected_vision_tensors(config) is fetched and its shape checked.
  // activation: fp32, or fp16 or bf16 on CUDA.
  static Result<std::unique_ptr<VisionEncoder>> create(const VisionConfig& config,
                                                       const WeightGetter& get,
                                                       DeviceType device, DataType activation);

  // pixel_values: CPU fp32 [total_patches, patch_dim], the images' patches concatenated in
  // order; grids: (t, h, w) in patches per image, h and w multiples of the merge size. Each
  // frame attends only to itself (Hugging Face's cu_seqlens), never to another image. Outputs
  // live on the encoder's device in the activation dtype: embeds [merged_tokens, out_hidden] and
  // one deepstack feature of that shape per deepstack index.
  Result<ImageFeatures> forward(const Tensor& pixel_values,
                                const std::vector<std::array<int64_t, 3>>& grids);

  const VisionConfig& config() const { return config_; }
  DeviceType device() const { return device_; }
  DataType activation() const { return activation_; }

 private:
  struct Block {
    Tensor norm1_w, norm1_b, q_w, q_b, k_w, k_b, v_w, v_b, proj_w, proj_b;
    Tensor norm2_w, norm2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  struct Merger {
    Tensor norm_w, norm_b, fc1_w, fc1_b, fc2_w, fc2_b;
    bool postshuffle_norm = false;  // LayerNorm over the merged token (deepstack) or per patch
  };

  VisionEncoder() = default;
  Result<Tensor> run_merger(const Merger& merger, const Tensor& x) const;

  VisionConfig config_;
  DeviceType device_ = DeviceType::kCpu;
  DataType activation_ = DataType::kFp32;
  Tensor patch_w_, patch_b_;              // [hidden, patch_dim], [hidden]
  std::vector<float> pos_embed_;          // host fp32 [num_position_embeddings, hidden]
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deepstack_;
};

// The host-side layout helpers of forward(), exposed for tests.
namespace vision {

// Learned position embeddings for every patch of `grids`, in processor (merge-block) order and
// repeated over t: each patch's embedding is bilinearly interpolated from the side x side table
// `table` (fp32 [side * side, hidden]) at torch.linspace(0, side - 1, h) x linspace(0, side - 1, w),
// as Hugging Face's fast_pos_embed_interpolate. Returns [total_patches * hidden].
std::vector<float> interpolated_position_embeddings(const std::vector<float>& table,
                                                    int64_t side, int64_t hidden, int64_t merge,
                                                    const std::vector<std::array<int64_t, 3>>& grids);

// (row, col) of every patch in processor order, repeated over t: int32 [total_patches * 2].
std::vector<int32_t> patch_positions(int64_t merge,
                                     const std::vector<std::array<int64_t, 3>>& grids);

// Sequence bounds for attention: one sequence per frame, [0, h*w, 2*h*w, ..., total].
std::vector<int32_t> frame_cu_seqlens(const std::vector<std::array<int64_t, 3>>& grids);

// torch.linspace(start, end, steps) in fp32 (its CPU kernel: from the start for the first half,
// from the end for the rest).
std::vector<float> linspace_f32(float start, float end, int64_t steps);

}  // namespace vision

}  // namespace kuiper
