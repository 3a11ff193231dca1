#include "kuiper/model/vision_config.h"

#include <cmath>

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

Result<VisionConfig> VisionConfig::from_json(const json& j) {
  VisionConfig c;
  try {
    c.depth = j.at("depth").get<int64_t>();
    c.hidden_size = j.at("hidden_size").get<int64_t>();
    c.intermediate_size = j.at("intermediate_size").get<int64_t>();
    c.num_heads = j.at("num_heads").get<int64_t>();
    c.in_channels = j.at("in_channels").get<int64_t>();
    c.patch_size = j.at("patch_size").get<int64_t>();
    c.temporal_patch_size = j.at("temporal_patch_size").get<int64_t>();
    c.spatial_merge_size = j.at("spatial_merge_size").get<int64_t>();
    c.num_position_embeddings = j.at("num_position_embeddings").get<int64_t>();
    c.out_hidden_size = j.at("out_hidden_size").get<int64_t>();
    c.deepstack_visual_indexes = j.at("deepstack_visual_indexes").get<std::vector<int64_t>>();
    c.layer_norm_eps = j.at("layer_norm_eps").get<double>();
  } catch (const json::exception& e) {
    return Status::Error(std::string("vision config: ") + e.what());
  }
  KUIPER_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<VisionConfig> VisionConfig::from_hf(const json& v) {
  if (!v.is_object()) return Status::Error("config.json: vision_config is not an object");
  VisionConfig c;
  try {
    const std::string act = v.value("hidden_act", "gelu_pytorch_tanh");
    if (act != "gelu_pytorch_tanh") {
      return Status::Error("vision_config: hidden_act '" + act +
                           "' is not supported (expected gelu_pytorch_tanh)");
    }
    c.depth = v.at("depth").get<int64_t>();
    c.hidden_size = v.at("hidden_size").get<int64_t>();
    c.intermediate_size = v.at("intermediate_size").get<int64_t>();
    c.num_heads = v.at("num_heads").get<int64_t>();
    c.in_channels = v.value("in_channels", int64_t{3});
    c.patch_size = v.value("patch_size", int64_t{16});
    c.temporal_patch_size = v.value("temporal_patch_size", int64_t{2});
    c.spatial_merge_size = v.value("spatial_merge_size", int64_t{2});
    c.num_position_embeddings = v.at("num_position_embeddings").get<int64_t>();
    c.out_hidden_size = v.at("out_hidden_size").get<int64_t>();
    c.deepstack_visual_indexes =
        v.value("deepstack_visual_indexes", std::vector<int64_t>{});
  } catch (const json::exception& e) {
    return Status::Error(std::string("config.json vision_config: ") + e.what());
  }
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
