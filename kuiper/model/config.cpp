#include "kuiper/model/config.h"

#include <algorithm>
#include <cmath>

#include "kuiper/base/json_reader.h"

namespace kuiper {

using nlohmann::json;

const char* architecture_name(Architecture a) {
  switch (a) {
    case Architecture::kQwen2: return "qwen2";
    case Architecture::kQwen3: return "qwen3";
    case Architecture::kQwen3VL: return "qwen3_vl";
  }
  return "?";
}

Result<Architecture> parse_architecture(const std::string& name) {
  for (Architecture a : {Architecture::kQwen2, Architecture::kQwen3, Architecture::kQwen3VL}) {
    if (name == architecture_name(a)) return a;
  }
  return Status::Error("unknown architecture '" + name + "'");
}

Status ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* what) {
    return v > 0 ? Status::Ok()
                 : Status::Error(std::string("config: ") + what + " must be positive, got " +
                                 std::to_string(v));
  };
  auto within = [&positive](int64_t v, int64_t limit, const char* what) {
    if (v > limit) {
      return Status::Error(std::string("config: ") + what + " " + std::to_string(v) +
                           " is beyond the limit " + std::to_string(limit));
    }
    return positive(v, what);
  };
  KUIPER_RETURN_IF_ERROR(within(vocab_size, kMaxVocab, "vocab_size"));
  KUIPER_RETURN_IF_ERROR(within(hidden_size, kMaxHidden, "hidden_size"));
  KUIPER_RETURN_IF_ERROR(within(intermediate_size, kMaxHidden, "intermediate_size"));
  KUIPER_RETURN_IF_ERROR(within(num_layers, kMaxLayers, "num_hidden_layers"));
  KUIPER_RETURN_IF_ERROR(within(num_heads, kMaxHeads, "num_attention_heads"));
  KUIPER_RETURN_IF_ERROR(within(num_kv_heads, kMaxHeads, "num_key_value_heads"));
  KUIPER_RETURN_IF_ERROR(within(head_dim, kMaxHeadDim, "head_dim"));
  KUIPER_RETURN_IF_ERROR(within(max_position_embeddings, kMaxPositions, "max_position_embeddings"));
  if (num_heads % num_kv_heads != 0) {
    return Status::Error("config: num_attention_heads (" + std::to_string(num_heads) +
                         ") is not a multiple of num_key_value_heads (" +
                         std::to_string(num_kv_heads) + ")");
  }
  if (head_dim % 2 != 0) {
    return Status::Error("config: head_dim must be even for rotary embeddings, got " +
                         std::to_string(head_dim));
  }
  if (!(rms_norm_eps > 0) || !(rope_theta > 0)) {
    return Status::Error("config: rms_norm_eps and rope_theta must be positive");
  }
  KUIPER_RETURN_IF_ERROR(validate_yarn());
  return validate_vl();
}

Status ModelConfig::validate_yarn() const {
  if (!yarn) return Status::Ok();
  const YarnConfig& y = *yarn;
  auto fail = [](const std::string& why) {
    return Status::Error("config: yarn rope scaling: " + why);
  };
  if (is_mrope()) return fail("not supported with M-RoPE (Qwen3-VL)");
  if (!(y.factor >= 1) || !std::isfinite(y.factor)) {
    return fail("factor must be a number >= 1, got " + std::to_string(y.factor));
  }
  const int64_t original = y.original_max_position_embeddings;
  if (original < 1 || original > kMaxPositions) {
    return fail("original_max_position_embeddings " + std::to_string(original) +
                " is not in [1, " + std::to_string(kMaxPositions) + "]");
  }
  if (!(y.beta_slow > 0) || !(y.beta_fast > y.beta_slow) || !std::isfinite(y.beta_fast)) {
    return fail("beta_fast and beta_slow must be positive with beta_fast > beta_slow, got " +
                std::to_string(y.beta_fast) + " and " + std::to_string(y.beta_slow));
  }
  if (!(y.attention_factor > 0) || !std::isfinite(y.attention_factor)) {
    return fail("attention_factor must be positive, got " + std::to_string(y.attention_factor));
  }
  const op::RopeParams p = rope();
  if (!(p.low < p.high)) {
    return fail("the frequency ramp [" + std::to_string(p.low) + ", " + std::to_string(p.high) +
                "] is empty for head_dim " + std::to_string(head_dim));
  }
  return Status::Ok();
}

int64_t ModelConfig::context_limit() const {
  if (!yarn) return max_position_embeddings;
  const double scaled =
      yarn->factor * static_cast<double>(yarn->original_max_position_embeddings);
  return std::max(max_position_embeddings,
                  static_cast<int64_t>(std::min(scaled, static_cast<double>(kMaxPositions))));
}

op::RopeParams ModelConfig::rope() const {
  if (!yarn) return op::RopeParams(rope_theta);
  return op::yarn_rope(rope_theta, head_dim, yarn->factor, yarn->original_max_position_embeddings,
                       yarn->beta_fast, yarn->beta_slow, yarn->attention_factor,
                       yarn->truncate);
}

Status ModelConfig::validate_vl() const {
  const bool vl = arch == Architecture::kQwen3VL;
  if (!vl) {
    if (is_mrope() || vision.has_value()) {
      return Status::Error(std::string("config: ") + architecture_name(arch) +
                           " has no vision tower or multimodal rotary embedding");
    }
    return Status::Ok();
  }
  if (!vision.has_value()) return Status::Error("config: qwen3_vl needs a vision config");
  KUIPER_RETURN_IF_ERROR(vision->validate());
  if (vision->out_hidden_size != hidden_size) {
    return Status::Error("config: the vision tower's out_hidden_size (" +
                         std::to_string(vision->out_hidden_size) +
                         ") must equal the text hidden_size (" + std::to_string(hidden_size) + ")");
  }
  if (mrope_section.size() != 3) {
    return Status::Error("config: qwen3_vl needs mrope_section with 3 entries (t, h, w), got " +
                         std::to_string(mrope_section.size()));
  }
  int64_t sum = 0;
  for (int64_t s : mrope_section) {
    if (s < 0) return Status::Error("config: mrope_section entries must be non-negative");
    sum += s;
  }
  if (sum != head_dim / 2) {
    return Status::Error("config: mrope_section sums to " + std::to_string(sum) +
                         " but head_dim / 2 is " + std::to_string(head_dim / 2));
  }
  if (!mrope_interleaved) {
    return Status::Error(
        "config: only interleaved M-RoPE (mrope_interleaved: true, Qwen3-VL) is supported");
  }
  const std::pair<const char*, int64_t> ids[] = {{"image_token_id", image_token_id},
                                                 {"vision_start_token_id", vision_start_token_id},
                                                 {"vision_end_token_id", vision_end_token_id}};
  for (const auto& [what, id] : ids) {
    if (id < 0 || id >= vocab_size) {
      return Status::Error(std::string("config: ") + what + " " + std::to_string(id) +
                           " is not a token of the vocabulary (" + std::to_string(vocab_size) +
                           ")");
    }
  }
  return Status::Ok();
}

std::string ModelConfig::text_prefix() const {
  return arch == Architecture::kQwen3VL ? "model.language_model." : "model.";
}

json ModelConfig::to_json() const {
  json j{{"architecture", architecture_name(arch)},
              {"vocab_size", vocab_size},
              {"hidden_size", hidden_size},
              {"intermediate_size", intermediate_size},
              {"num_layers", num_layers},
              {"num_heads", num_heads},
              {"num_kv_heads", num_kv_heads},
              {"head_dim", head_dim},
              {"rms_norm_eps", rms_norm_eps},
              {"rope_theta", rope_theta},
              {"max_position_embeddings", max_position_embeddings},
              {"tie_word_embeddings", tie_word_embeddings},
              {"qkv_bias", qkv_bias},
              {"qk_norm", qk_norm},
              {"bos_token_id", bos_token_id},
              {"eos_token_ids", eos_token_ids}};
  if (yarn) {
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", yarn->factor},
                         {"original_max_position_embeddings",
                          yarn->original_max_position_embeddings},
                         {"beta_fast", yarn->beta_fast},
                         {"beta_slow", yarn->beta_slow},
                         {"attention_factor", yarn->attention_factor},
                         {"truncate", yarn->truncate}};
  }
  if (arch == Architecture::kQwen3VL) {
    j["mrope_section"] = mrope_section;
    j["mrope_interleaved"] = mrope_interleaved;
    j["image_token_id"] = image_token_id;
    j["vision_start_token_id"] = vision_start_token_id;
    j["vision_end_token_id"] = vision_end_token_id;
    if (vision) j["vision"] = vision->to_json();
  }
  return j;
}

Result<ModelConfig> ModelConfig::from_json(const json& j) {
  const JsonReader r(j, "config");
  ModelConfig c;
  KUIPER_ASSIGN_OR_RETURN(std::string arch, r.get_string("architecture"));
  KUIPER_ASSIGN_OR_RETURN(c.arch, parse_architecture(arch));
  // Every size is range-checked by validate(); here only the type and the int64 range.
  KUIPER_ASSIGN_OR_RETURN(c.vocab_size, r.get_int("vocab_size"));
  KUIPER_ASSIGN_OR_RETURN(c.hidden_size, r.get_int("hidden_size"));
  KUIPER_ASSIGN_OR_RETURN(c.intermediate_size, r.get_int("intermediate_size"));
  KUIPER_ASSIGN_OR_RETURN(c.num_layers, r.get_int("num_layers"));
  KUIPER_ASSIGN_OR_RETURN(c.num_heads, r.get_int("num_heads"));
  KUIPER_ASSIGN_OR_RETURN(c.num_kv_heads, r.get_int("num_kv_heads"));
  KUIPER_ASSIGN_OR_RETURN(c.head_dim, r.get_int("head_dim"));
  KUIPER_ASSIGN_OR_RETURN(c.rms_norm_eps, r.get_double("rms_norm_eps"));
  KUIPER_ASSIGN_OR_RETURN(c.rope_theta, r.get_double("rope_theta"));
  KUIPER_ASSIGN_OR_RETURN(c.max_position_embeddings, r.get_int("max_position_embeddings"));
  KUIPER_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.get_bool("tie_word_embeddings"));
  KUIPER_ASSIGN_OR_RETURN(c.qkv_bias, r.get_bool("qkv_bias"));
  KUIPER_ASSIGN_OR_RETURN(c.qk_norm, r.get_bool("qk_norm"));
  KUIPER_ASSIGN_OR_RETURN(c.bos_token_id, r.get_int("bos_token_id"));
  KUIPER_ASSIGN_OR_RETURN(JsonReader eos, r.at("eos_token_ids"));
  KUIPER_ASSIGN_OR_RETURN(c.eos_token_ids, eos.to_int_list());
  if (r.has("rope_scaling")) {  // absent in files of unscaled models (and in older files)
    KUIPER_ASSIGN_OR_RETURN(JsonReader s, r.at("rope_scaling"));
    KUIPER_ASSIGN_OR_RETURN(std::string type, s.get_string("rope_type"));
    if (type != "yarn") return s.error("rope_type '" + type + "' is not supported (yarn only)");
    YarnConfig y;
    KUIPER_ASSIGN_OR_RETURN(y.factor, s.get_double("factor"));
    KUIPER_ASSIGN_OR_RETURN(y.original_max_position_embeddings,
                            s.get_int("original_max_position_embeddings"));
    KUIPER_ASSIGN_OR_RETURN(y.beta_fast, s.get_double("beta_fast"));
    KUIPER_ASSIGN_OR_RETURN(y.beta_slow, s.get_double("beta_slow"));
    KUIPER_ASSIGN_OR_RETURN(y.attention_factor, s.get_double("attention_factor"));
    KUIPER_ASSIGN_OR_RETURN(y.truncate, s.get_bool("truncate"));
    c.yarn = y;
  }
  if (c.arch == Architecture::kQwen3VL) {
    KUIPER_ASSIGN_OR_RETURN(JsonReader section, r.at("mrope_section"));
    KUIPER_ASSIGN_OR_RETURN(c.mrope_section, section.to_int_list());
    KUIPER_ASSIGN_OR_RETURN(c.mrope_interleaved, r.get_bool("mrope_interleaved"));
    KUIPER_ASSIGN_OR_RETURN(c.image_token_id, r.get_int("image_token_id"));
    KUIPER_ASSIGN_OR_RETURN(c.vision_start_token_id, r.get_int("vision_start_token_id"));
    KUIPER_ASSIGN_OR_RETURN(c.vision_end_token_id, r.get_int("vision_end_token_id"));
    KUIPER_ASSIGN_OR_RETURN(JsonReader vision_json, r.at("vision"));
    KUIPER_ASSIGN_OR_RETURN(VisionConfig vision, VisionConfig::from_json(vision_json.json()));
    c.vision = vision;
  }
  KUIPER_RETURN_IF_ERROR(c.validate());
  return c;
}

namespace {

// YaRN's fields with transformers' defaults (_compute_yarn_parameters and
// standardize_rope_params): original_max_position_embeddings is max_position_embeddings when
// absent, and a top-level one takes precedence over the scaling's (Phi3 keeps it there); factor
// absent is max_position_embeddings / original; beta_fast and beta_slow absent or 0 are 32 and 1;
// attention_factor absent comes from factor (and mscale / mscale_all_dim when both are given).
Status read_yarn(const JsonReader& t, const JsonReader& s, ModelConfig& c) {
  const int64_t max = ModelConfig::kMaxPositions;
  YarnConfig y;
  KUIPER_ASSIGN_OR_RETURN(int64_t original, s.get_int_or("original_max_position_embeddings",
                                                         c.max_position_embeddings, 1, max));
  KUIPER_ASSIGN_OR_RETURN(y.original_max_position_embeddings,
                          t.get_int_or("original_max_position_embeddings", original, 1, max));
  const double ratio = static_cast<double>(c.max_position_embeddings) /
                       static_cast<double>(y.original_max_position_embeddings);
  KUIPER_ASSIGN_OR_RETURN(y.factor, s.get_double_or("factor", ratio));
  KUIPER_ASSIGN_OR_RETURN(y.beta_fast, s.get_double_or("beta_fast", 0.0));
  KUIPER_ASSIGN_OR_RETURN(y.beta_slow, s.get_double_or("beta_slow", 0.0));
  if (y.beta_fast == 0) y.beta_fast = 32.0;
  if (y.beta_slow == 0) y.beta_slow = 1.0;
  KUIPER_ASSIGN_OR_RETURN(double mscale, s.get_double_or("mscale", 0.0));
  KUIPER_ASSIGN_OR_RETURN(double mscale_all_dim, s.get_double_or("mscale_all_dim", 0.0));
  KUIPER_ASSIGN_OR_RETURN(
      y.attention_factor,
      s.get_double_or("attention_factor",
                      op::yarn_attention_factor(y.factor, mscale, mscale_all_dim)));
  KUIPER_ASSIGN_OR_RETURN(y.truncate, s.get_bool_or("truncate", true));
  c.yarn = y;
  return Status::Ok();
}

// rope_theta lives at the top level (older configs) or inside rope_parameters (newer ones);
// rotary embeddings are unscaled ("default") or YaRN-scaled.
Status read_rope(const JsonReader& t, ModelConfig& c) {
  std::optional<JsonReader> scaling;
  if (t.has("rope_parameters")) {
    KUIPER_ASSIGN_OR_RETURN(JsonReader p, t.at("rope_parameters"));
    KUIPER_ASSIGN_OR_RETURN(c.rope_theta, p.get_double_or("rope_theta", c.rope_theta));
    scaling = p;
  }
  KUIPER_ASSIGN_OR_RETURN(c.rope_theta, t.get_double_or("rope_theta", c.rope_theta));
  if (t.has("rope_scaling")) {
    KUIPER_ASSIGN_OR_RETURN(scaling, t.at("rope_scaling"));
  }
  if (scaling) {
    KUIPER_ASSIGN_OR_RETURN(std::string old_type, scaling->get_string_or("type", "default"));
    KUIPER_ASSIGN_OR_RETURN(std::string type, scaling->get_string_or("rope_type", old_type));
    if (type == "yarn") return read_yarn(t, *scaling, c);
    if (type != "default") {
      return Status::Error("config.json: rope scaling type '" + type +
                           "' is not supported (supported: default, yarn)");
    }
  }
  return Status::Ok();
}

// A token id or a list of them (bos_token_id, eos_token_id); absent or null is none.
Result<std::vector<int64_t>> id_list(const JsonReader& t, const std::string& key) {
  if (!t.has(key)) return std::vector<int64_t>{};
  KUIPER_ASSIGN_OR_RETURN(JsonReader v, t.at(key));
  if (v.is_array()) return v.to_int_list(0, ModelConfig::kMaxVocab - 1);
  KUIPER_ASSIGN_OR_RETURN(int64_t id, v.to_int(0, ModelConfig::kMaxVocab - 1));
  return std::vector<int64_t>{id};
}

// Qwen3-VL's multimodal rotary layout, from the text config's rope_scaling or rope_parameters.
Status read_mrope(const JsonReader& text, ModelConfig& c) {
  std::optional<JsonReader> rope;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!text.has(key)) continue;
    KUIPER_ASSIGN_OR_RETURN(JsonReader candidate, text.at(key));
    if (candidate.has("mrope_section")) rope = candidate;
  }
  if (!rope) {
    return Status::Error("config.json: text_config has no mrope_section (in rope_scaling or "
                         "rope_parameters)");
  }
  KUIPER_ASSIGN_OR_RETURN(JsonReader section, rope->at("mrope_section"));
  KUIPER_ASSIGN_OR_RETURN(c.mrope_section, section.to_int_list(0, ModelConfig::kMaxHeadDim));
  // Qwen3-VL interleaves the axes; a config that says otherwise asks for another layout.
  KUIPER_ASSIGN_OR_RETURN(c.mrope_interleaved, rope->get_bool_or("mrope_interleaved", true));
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ModelConfig::from_hf(const json& hf) {
  if (!hf.is_object()) return Status::Error("config.json is not a JSON object");
  const JsonReader root(hf, "config.json");
  std::string arch_name;
  if (root.has("architectures")) {
    KUIPER_ASSIGN_OR_RETURN(JsonReader archs, root.at("architectures"));
    if (archs.is_array() && !archs.json().empty()) {
      KUIPER_ASSIGN_OR_RETURN(JsonReader first, archs.at(size_t{0}));
      KUIPER_ASSIGN_OR_RETURN(arch_name, first.to_string());
    }
  }
  if (arch_name.empty()) {
    return Status::Error("config.json: \"architectures\" is missing or empty; it names the model "
                         "class (Qwen2ForCausalLM, Qwen3ForCausalLM or "
                         "Qwen3VLForConditionalGeneration), as transformers saves it");
  }
  ModelConfig c;
  if (arch_name == "Qwen2ForCausalLM") {
    c.arch = Architecture::kQwen2;
    c.qkv_bias = true;
  } else if (arch_name == "Qwen3ForCausalLM") {
    c.arch = Architecture::kQwen3;
    c.qk_norm = true;
  } else if (arch_name == "Qwen3VLForConditionalGeneration") {
    c.arch = Architecture::kQwen3VL;
    c.qk_norm = true;
  } else {
    return Status::Error("config.json: unsupported architecture '" + arch_name +
                         "' (supported: Qwen2ForCausalLM, Qwen3ForCausalLM, "
                         "Qwen3VLForConditionalGeneration)");
  }
  const bool vl = c.arch == Architecture::kQwen3VL;
  if (vl && (!hf.contains("text_config") || !hf["text_config"].is_object())) {
    return Status::Error("config.json: Qwen3VLForConditionalGeneration needs a text_config object");
  }
  if (vl && (!hf.contains("vision_config") || !hf["vision_config"].is_object())) {
    return Status::Error(
        "config.json: Qwen3VLForConditionalGeneration needs a vision_config object");
  }
  // The text model's fields: at the top level, or in text_config for Qwen3-VL. Sizes are read
  // in the limits validate() enforces, so the division below and every later product is safe.
  KUIPER_ASSIGN_OR_RETURN(const JsonReader t,
                          vl ? root.at("text_config") : Result<JsonReader>(root));
  KUIPER_ASSIGN_OR_RETURN(c.vocab_size, t.get_int("vocab_size", 1, kMaxVocab));
  KUIPER_ASSIGN_OR_RETURN(c.hidden_size, t.get_int("hidden_size", 1, kMaxHidden));
  KUIPER_ASSIGN_OR_RETURN(c.intermediate_size, t.get_int("intermediate_size", 1, kMaxHidden));
  KUIPER_ASSIGN_OR_RETURN(c.num_layers, t.get_int("num_hidden_layers", 1, kMaxLayers));
  KUIPER_ASSIGN_OR_RETURN(c.num_heads, t.get_int("num_attention_heads", 1, kMaxHeads));
  KUIPER_ASSIGN_OR_RETURN(c.num_kv_heads,
                          t.get_int_or("num_key_value_heads", c.num_heads, 1, kMaxHeads));
  KUIPER_ASSIGN_OR_RETURN(c.head_dim, t.get_int_or("head_dim", c.hidden_size / c.num_heads, 1,
                                                   kMaxHeadDim));
  KUIPER_ASSIGN_OR_RETURN(c.rms_norm_eps, t.get_double_or("rms_norm_eps", 1e-6));
  KUIPER_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          t.get_int_or("max_position_embeddings", 32768, 1, kMaxPositions));
  // Qwen3-VL keeps tie_word_embeddings at the top level (the text_config copy may be stale).
  KUIPER_ASSIGN_OR_RETURN(bool text_tie, t.get_bool_or("tie_word_embeddings", false));
  KUIPER_ASSIGN_OR_RETURN(c.tie_word_embeddings, root.get_bool_or("tie_word_embeddings", text_tie));
  if (t.has("attention_bias")) {
    KUIPER_ASSIGN_OR_RETURN(bool bias, t.get_bool("attention_bias"));
    c.qkv_bias = bias || c.arch == Architecture::kQwen2;
  }
  KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> bos, id_list(t, "bos_token_id"));
  if (!bos.empty()) c.bos_token_id = bos[0];
  KUIPER_ASSIGN_OR_RETURN(c.eos_token_ids, id_list(t, "eos_token_id"));
  KUIPER_ASSIGN_OR_RETURN(std::string act, t.get_string_or("hidden_act", "silu"));
  if (act != "silu") {
    return Status::Error("config.json: hidden_act '" + act + "' is not supported (silu only)");
  }
  KUIPER_RETURN_IF_ERROR(read_rope(t, c));
  if (vl) {
    KUIPER_RETURN_IF_ERROR(read_mrope(t, c));
    KUIPER_ASSIGN_OR_RETURN(c.image_token_id, root.get_int_or("image_token_id", -1));
    KUIPER_ASSIGN_OR_RETURN(c.vision_start_token_id, root.get_int_or("vision_start_token_id", -1));
    KUIPER_ASSIGN_OR_RETURN(c.vision_end_token_id, root.get_int_or("vision_end_token_id", -1));
    KUIPER_ASSIGN_OR_RETURN(VisionConfig vision, VisionConfig::from_hf(hf["vision_config"]));
    c.vision = vision;
  }
  KUIPER_RETURN_IF_ERROR(c.validate());
  return c;
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::string text = c.text_prefix();
  specs.push_back({text + "embed_tokens.weight", {c.vocab_size, H}});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = text + "layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", {H}});
    specs.push_back({p + "self_attn.q_proj.weight", {c.q_dim(), H}});
    specs.push_back({p + "self_attn.k_proj.weight", {c.kv_dim(), H}});
    specs.push_back({p + "self_attn.v_proj.weight", {c.kv_dim(), H}});
    if (c.qkv_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {c.q_dim()}});
      specs.push_back({p + "self_attn.k_proj.bias", {c.kv_dim()}});
      specs.push_back({p + "self_attn.v_proj.bias", {c.kv_dim()}});
    }
    if (c.qk_norm) {
      specs.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      specs.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    specs.push_back({p + "self_attn.o_proj.weight", {H, c.q_dim()}});
    specs.push_back({p + "post_attention_layernorm.weight", {H}});
    specs.push_back({p + "mlp.gate_proj.weight", {I, H}});
    specs.push_back({p + "mlp.up_proj.weight", {I, H}});
    specs.push_back({p + "mlp.down_proj.weight", {H, I}});
  }
  specs.push_back({text + "norm.weight", {H}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, H}});
  if (c.vision) {
    for (TensorSpec& spec : expected_vision_tensors(*c.vision)) specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace kuiper
