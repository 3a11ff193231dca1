#include "kuiper/model/vision_config.h"

#include <cmath>

#include "kuiper/base/json_reader.h"

namespace kuiper {

using nlohmann::json;

Status VisionConfig::validate() const {
  auto positive = [](int64_t v, const char* what) {
    return v > 0 ? Status::Ok()
                 : Status::Error(std::string("vision_config: ") + what +
                                 " must be positive, got " + std::to_string(v));
  };
  KUIPER_RETURN_IF_ERROR(positive(depth, "depth"));
  KUIPER_RETURN_IF_ERROR(positive(hidden_size, "hidden_size"));
  KUIPER_RETURN_IF_ERROR(positive(intermediate_size, "intermediate_size"));
  KUIPER_RETURN_IF_ERROR(positive(num_heads, "num_heads"));
  KUIPER_RETURN_IF_ERROR(positive(in_channels, "in_channels"));
  KUIPER_RETURN_IF_ERROR(positive(patch_size, "patch_size"));
  KUIPER_RETURN_IF_ERROR(positive(temporal_patch_size, "temporal_patch_size"));
  KUIPER_RETURN_IF_ERROR(positive(spatial_merge_size, "spatial_merge_size"));
  KUIPER_RETURN_IF_ERROR(positive(num_position_embeddings, "num_position_embeddings"));
  KUIPER_RETURN_IF_ERROR(positive(out_hidden_size, "out_hidden_size"));
  if (hidden_size % num_heads != 0 || head_dim() % 4 != 0) {
    return Status::Error("vision_config: hidden_size / num_heads must be a multiple of 4");
  }
  const auto side = static_cast<int64_t>(std::lround(std::sqrt(double(num_position_embeddings))));
  if (side * side != num_position_embeddings) {
    return Status::Error("vision_config: num_position_embeddings must be a square, got " +
                         std::to_string(num_position_embeddings));
  }
  for (int64_t index : deepstack_visual_indexes) {
    if (index < 0 || index >= depth) {
      return Status::Error("vision_config: deepstack index " + std::to_string(index) +
                           " is not a block (depth " + std::to_string(depth) + ")");
    }
  }
  return Status::Ok();
}

json VisionConfig::to_json() const {
  return json{{"depth", depth},
              {"hidden_size", hidden_size},
              {"intermediate_size", intermediate_size},
              {"num_heads", num_heads},
              {"in_channels", in_channels},
              {"patch_size", patch_size},
              {"temporal_patch_size", temporal_patch_size},
              {"spatial_merge_size", spatial_merge_size},
              {"num_position_embeddings", num_position_embeddings},
              {"out_hidden_size", out_hidden_size},
              {"deepstack_visual_indexes", deepstack_visual_indexes},
              {"layer_norm_eps", layer_norm_eps}};
}

namespace {

// The fields both readers share, required in the model file and with Hugging Face's defaults in
// config.json (`hf`), each read within the limits below.
Result<VisionConfig> read_vision(const JsonReader& v, bool hf) {
  constexpr int64_t kMaxSize = int64_t{1} << 17, kMaxCount = 1024, kMaxPositions = 1 << 20;
  auto size = [&](const std::string& key, int64_t fallback, int64_t limit) {
    return hf && fallback > 0 ? v.get_int_or(key, fallback, 1, limit) : v.get_int(key, 1, limit);
  };
  VisionConfig c;
  KUIPER_ASSIGN_OR_RETURN(c.depth, size("depth", 0, kMaxCount));
  KUIPER_ASSIGN_OR_RETURN(c.hidden_size, size("hidden_size", 0, kMaxSize));
  KUIPER_ASSIGN_OR_RETURN(c.intermediate_size, size("intermediate_size", 0, kMaxSize));
  KUIPER_ASSIGN_OR_RETURN(c.num_heads, size("num_heads", 0, kMaxCount));
  KUIPER_ASSIGN_OR_RETURN(c.in_channels, size("in_channels", 3, kMaxCount));
  KUIPER_ASSIGN_OR_RETURN(c.patch_size, size("patch_size", 16, kMaxCount));
  KUIPER_ASSIGN_OR_RETURN(c.temporal_patch_size, size("temporal_patch_size", 2, kMaxCount));
  KUIPER_ASSIGN_OR_RETURN(c.spatial_merge_size, size("spatial_merge_size", 2, kMaxCount));
  KUIPER_ASSIGN_OR_RETURN(c.num_position_embeddings,
                          size("num_position_embeddings", 0, kMaxPositions));
  KUIPER_ASSIGN_OR_RETURN(c.out_hidden_size, size("out_hidden_size", 0, kMaxSize));
  if (!hf || v.has("deepstack_visual_indexes")) {
    KUIPER_ASSIGN_OR_RETURN(JsonReader indexes, v.at("deepstack_visual_indexes"));
    KUIPER_ASSIGN_OR_RETURN(c.deepstack_visual_indexes, indexes.to_int_list());
  }
  return c;
}

}  // namespace

Result<VisionConfig> VisionConfig::from_json(const json& j) {
  const JsonReader v(j, "vision config");
  KUIPER_ASSIGN_OR_RETURN(VisionConfig c, read_vision(v, false));
  KUIPER_ASSIGN_OR_RETURN(c.layer_norm_eps, v.get_double("layer_norm_eps"));
  KUIPER_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<VisionConfig> VisionConfig::from_hf(const json& j) {
  if (!j.is_object()) return Status::Error("config.json: vision_config is not an object");
  const JsonReader v(j, "config.json: vision_config");
  KUIPER_ASSIGN_OR_RETURN(std::string act, v.get_string_or("hidden_act", "gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh") {
    return Status::Error("vision_config: hidden_act '" + act +
                         "' is not supported (expected gelu_pytorch_tanh)");
  }
  KUIPER_ASSIGN_OR_RETURN(VisionConfig c, read_vision(v, true));
  KUIPER_RETURN_IF_ERROR(c.validate());
  return c;
}

std::vector<TensorSpec> expected_vision_tensors(const VisionConfig& c) {
  const std::string v = "model.visual.";
  const int64_t H = c.hidden_size, I = c.intermediate_size, M = c.merged_dim();
  const int64_t O = c.out_hidden_size;
  std::vector<TensorSpec> t;
  t.push_back({v + "patch_embed.proj.weight",
               {H, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}});
  t.push_back({v + "patch_embed.proj.bias", {H}});
  t.push_back({v + "pos_embed.weight", {c.num_position_embeddings, H}});
  for (int64_t b = 0; b < c.depth; ++b) {
    const std::string p = v + "blocks." + std::to_string(b) + ".";
    t.push_back({p + "norm1.weight", {H}});
    t.push_back({p + "norm1.bias", {H}});
    t.push_back({p + "attn.qkv.weight", {3 * H, H}});
    t.push_back({p + "attn.qkv.bias", {3 * H}});
    t.push_back({p + "attn.proj.weight", {H, H}});
    t.push_back({p + "attn.proj.bias", {H}});
    t.push_back({p + "norm2.weight", {H}});
    t.push_back({p + "norm2.bias", {H}});
    t.push_back({p + "mlp.linear_fc1.weight", {I, H}});
    t.push_back({p + "mlp.linear_fc1.bias", {I}});
    t.push_back({p + "mlp.linear_fc2.weight", {H, I}});
    t.push_back({p + "mlp.linear_fc2.bias", {H}});
  }
  // The final merger normalises each patch (width H) before merging; the deepstack mergers
  // normalise the merged token (width M).
  auto merger = [&](const std::string& p, int64_t norm_width) {
    t.push_back({p + "norm.weight", {norm_width}});
    t.push_back({p + "norm.bias", {norm_width}});
    t.push_back({p + "linear_fc1.weight", {M, M}});
    t.push_back({p + "linear_fc1.bias", {M}});
    t.push_back({p + "linear_fc2.weight", {O, M}});
    t.push_back({p + "linear_fc2.bias", {O}});
  };
  merger(v + "merger.", H);
  for (size_t i = 0; i < c.deepstack_visual_indexes.size(); ++i) {
    merger(v + "deepstack_merger_list." + std::to_string(i) + ".", M);
  }
  return t;
}

}  // namespace kuiper
