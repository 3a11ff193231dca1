// ModelConfig: the engine's normalised view of a Hugging Face config.json, stored in the model
// file's metadata under "config".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/base/status.h"
#include "kuiper/model/tensor_spec.h"
#include "kuiper/model/vision_config.h"
#include "kuiper/op/rope_params.h"

namespace kuiper {

enum class Architecture { kQwen2, kQwen3, kQwen3VL };

// YaRN rope scaling as config.json gives it (rope_scaling or rope_parameters with rope_type
// "yarn"), transformers' defaults filled in: the attention factor is resolved (given, or from
// factor and mscale / mscale_all_dim).
struct YarnConfig {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 1.0;
  bool truncate = true;
};
const char* architecture_name(Architecture a);  // "qwen2", "qwen3", "qwen3_vl"
Result<Architecture> parse_architecture(const std::string& name);

struct ModelConfig {
  Architecture arch = Architecture::kQwen3;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<YarnConfig> yarn;  // none: unscaled RoPE
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: q/k/v projections carry a bias
  bool qk_norm = false;   // Qwen3: per-head RMSNorm of q and k before RoPE
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;

  // Sanity limits on sizes read from a file, far above any published Qwen model (151936 tokens,
  // hidden 8192, 94 layers, 64 heads of 128, 262144 positions): checked before anything is sized
  // from them, and small enough that their products cannot overflow int64.
  static constexpr int64_t kMaxVocab = int64_t{1} << 24;
  static constexpr int64_t kMaxHidden = int64_t{1} << 17;  // hidden and intermediate sizes
  static constexpr int64_t kMaxLayers = 1024;
  static constexpr int64_t kMaxHeads = 1024;
  static constexpr int64_t kMaxHeadDim = 1024;
  static constexpr int64_t kMaxPositions = int64_t{1} << 24;

  // Qwen3-VL (kQwen3VL) only. Interleaved multimodal RoPE: rotary frequency j takes its position
  // from axis h when j % 3 == 1 and j < 3 * mrope_section[1], from axis w when j % 3 == 2 and
  // j < 3 * mrope_section[2], else from axis t; the sections sum to head_dim / 2. Empty for
  // text-only models (ordinary RoPE).
  std::vector<int64_t> mrope_section;
  bool mrope_interleaved = false;  // the only layout supported (Qwen3-VL's)
  int64_t image_token_id = -1;         // <|image_pad|>, one per merged vision token
  int64_t vision_start_token_id = -1;  // <|vision_start|>
  int64_t vision_end_token_id = -1;    // <|vision_end|>
  std::optional<VisionConfig> vision;  // the vision tower; set exactly for kQwen3VL

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  bool is_mrope() const { return !mrope_section.empty(); }
  // How the text model's RoPE turns (theta and, with yarn, its scaling).
  op::RopeParams rope() const;
  // The longest context the rotary embedding is made for: max_position_embeddings, or YaRN's
  // factor x original_max_position_embeddings where larger (Qwen3 keeps 40960 beside factor 4
  // over 32768 and documents 131072).
  int64_t context_limit() const;
  // Where the text model's tensors live: "model.language_model." for Qwen3-VL, else "model.".
  std::string text_prefix() const;

  // Checks the numbers are consistent (sizes positive and within the limits above, heads
  // divisible by kv heads, ...).
  Status validate() const;
  Status validate_vl() const;    // the Qwen3-VL fields (part of validate)
  Status validate_yarn() const;  // the rope scaling (part of validate)
  nlohmann::json to_json() const;
  static Result<ModelConfig> from_json(const nlohmann::json& j);
  // From a Hugging Face config.json (older rope_theta/rope_scaling style or newer
  // rope_parameters style). Unknown architectures and unsupported rope scaling are errors.
  static Result<ModelConfig> from_hf(const nlohmann::json& hf);
};

// Every tensor the model needs (text model, lm_head and, for Qwen3-VL, the vision tower).
std::vector<TensorSpec> expected_tensors(const ModelConfig& config);

}  // namespace kuiper
