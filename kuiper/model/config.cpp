#include "kuiper/model/config.h"

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

const char* attention_name(AttentionKind a) {
  switch (a) {
    case AttentionKind::kMha: return "mha";
    case AttentionKind::kFlash1: return "flash1";
    case AttentionKind::kFlash2: return "flash2";
  }
  return "?";
}

Result<AttentionKind> parse_attention(const std::string& name) {
  for (AttentionKind a : {AttentionKind::kMha, AttentionKind::kFlash1, AttentionKind::kFlash2}) {
    if (name == attention_name(a)) return a;
  }
  return Status::Error("unknown attention '" + name + "' (expected mha, flash1 or flash2)");
}

Status ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* what) {
    return v > 0 ? Status::Ok()
                 : Status::Error(std::string("config: ") + what + " must be positive, got " +
                                 std::to_string(v));
  };
  KUIPER_RETURN_IF_ERROR(positive(vocab_size, "vocab_size"));
  KUIPER_RETURN_IF_ERROR(positive(hidden_size, "hidden_size"));
  KUIPER_RETURN_IF_ERROR(positive(intermediate_size, "intermediate_size"));
  KUIPER_RETURN_IF_ERROR(positive(num_layers, "num_hidden_layers"));
  KUIPER_RETURN_IF_ERROR(positive(num_heads, "num_attention_heads"));
  KUIPER_RETURN_IF_ERROR(positive(num_kv_heads, "num_key_value_heads"));
  KUIPER_RETURN_IF_ERROR(positive(head_dim, "head_dim"));
  KUIPER_RETURN_IF_ERROR(positive(max_position_embeddings, "max_position_embeddings"));
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
  return validate_vl();
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
  ModelConfig c;
  try {
    KUIPER_ASSIGN_OR_RETURN(c.arch, parse_architecture(j.at("architecture").get<std::string>()));
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.hidden_size = j.at("hidden_size").get<int64_t>();
    c.intermediate_size = j.at("intermediate_size").get<int64_t>();
    c.num_layers = j.at("num_layers").get<int64_t>();
    c.num_heads = j.at("num_heads").get<int64_t>();
    c.num_kv_heads = j.at("num_kv_heads").get<int64_t>();
    c.head_dim = j.at("head_dim").get<int64_t>();
    c.rms_norm_eps = j.at("rms_norm_eps").get<double>();
    c.rope_theta = j.at("rope_theta").get<double>();
    c.max_position_embeddings = j.at("max_position_embeddings").get<int64_t>();
    c.tie_word_embeddings = j.at("tie_word_embeddings").get<bool>();
    c.qkv_bias = j.at("qkv_bias").get<bool>();
    c.qk_norm = j.at("qk_norm").get<bool>();
    c.bos_token_id = j.at("bos_token_id").get<int64_t>();
    c.eos_token_ids = j.at("eos_token_ids").get<std::vector<int64_t>>();
    if (c.arch == Architecture::kQwen3VL) {
      c.mrope_section = j.at("mrope_section").get<std::vector<int64_t>>();
      c.mrope_interleaved = j.at("mrope_interleaved").get<bool>();
      c.image_token_id = j.at("image_token_id").get<int64_t>();
      c.vision_start_token_id = j.at("vision_start_token_id").get<int64_t>();
      c.vision_end_token_id = j.at("vision_end_token_id").get<int64_t>();
      KUIPER_ASSIGN_OR_RETURN(VisionConfig vision, VisionConfig::from_json(j.at("vision")));
      c.vision = vision;
    }
  } catch (const json::exception& e) {
    return Status::Error(std::string("config: ") + e.what());
  }
  KUIPER_RETURN_IF_ERROR(c.validate());
  return c;
}

namespace {

// rope_theta lives at the top level (older configs) or inside rope_parameters (newer ones);
// only unscaled ("default") rotary embeddings are supported.
Status read_rope(const json& hf, ModelConfig& c) {
  const json* scaling = nullptr;
  if (hf.contains("rope_parameters") && hf["rope_parameters"].is_object()) {
    const json& p = hf["rope_parameters"];
    if (p.contains("rope_theta")) c.rope_theta = p["rope_theta"].get<double>();
    scaling = &p;
  }
  if (hf.contains("rope_theta") && hf["rope_theta"].is_number()) {
    c.rope_theta = hf["rope_theta"].get<double>();
  }
  if (hf.contains("rope_scaling") && hf["rope_scaling"].is_object()) scaling = &hf["rope_scaling"];
  if (scaling != nullptr) {
    std::string type = scaling->value("rope_type", scaling->value("type", std::string("default")));
    if (type != "default") {
      return Status::Error("config.json: rope scaling type '" + type +
                           "' is not supported (only default rotary embeddings)");
    }
  }
  return Status::Ok();
}

std::vector<int64_t> id_list(const json& v) {
  if (v.is_number_integer()) return {v.get<int64_t>()};
  if (v.is_array()) return v.get<std::vector<int64_t>>();
  return {};
}

// Qwen3-VL's multimodal rotary layout, from the text config's rope_scaling or rope_parameters.
Status read_mrope(const json& text, ModelConfig& c) {
  const json* rope = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (text.contains(key) && text[key].is_object() && text[key].contains("mrope_section")) {
      rope = &text[key];
    }
  }
  if (rope == nullptr) {
    return Status::Error("config.json: text_config has no mrope_section (in rope_scaling or "
                         "rope_parameters)");
  }
  const json& section = (*rope)["mrope_section"];
  if (!section.is_array()) return Status::Error("config.json: mrope_section is not an array");
  for (const json& v : section) {
    if (!v.is_number_integer()) {
      return Status::Error("config.json: mrope_section holds a non-integer " + v.dump());
    }
    c.mrope_section.push_back(v.get<int64_t>());
  }
  // Qwen3-VL interleaves the axes; a config that says otherwise asks for another layout.
  c.mrope_interleaved = rope->value("mrope_interleaved", true);
  return Status::Ok();
}

int64_t required_id(const json& hf, const char* key) {
  return hf.contains(key) && hf[key].is_number_integer() ? hf[key].get<int64_t>() : -1;
}

}  // namespace

Result<ModelConfig> ModelConfig::from_hf(const json& hf) {
  if (!hf.is_object()) return Status::Error("config.json is not a JSON object");
  std::string arch_name;
  if (hf.contains("architectures") && hf["architectures"].is_array() &&
      !hf["architectures"].empty()) {
    arch_name = hf["architectures"][0].get<std::string>();
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
  // The text model's fields: at the top level, or in text_config for Qwen3-VL.
  const json& t = vl ? hf["text_config"] : hf;
  try {
    c.vocab_size = t.at("vocab_size").get<int64_t>();
    c.hidden_size = t.at("hidden_size").get<int64_t>();
    c.intermediate_size = t.at("intermediate_size").get<int64_t>();
    c.num_layers = t.at("num_hidden_layers").get<int64_t>();
    c.num_heads = t.at("num_attention_heads").get<int64_t>();
    c.num_kv_heads = t.value("num_key_value_heads", c.num_heads);
    c.head_dim = t.contains("head_dim") && t["head_dim"].is_number()
                     ? t["head_dim"].get<int64_t>()
                     : c.hidden_size / c.num_heads;
    c.rms_norm_eps = t.value("rms_norm_eps", 1e-6);
    c.max_position_embeddings = t.value("max_position_embeddings", int64_t{32768});
    // Qwen3-VL keeps tie_word_embeddings at the top level (the text_config copy may be stale).
    c.tie_word_embeddings = hf.contains("tie_word_embeddings")
                                ? hf.value("tie_word_embeddings", false)
                                : t.value("tie_word_embeddings", false);
    if (t.contains("attention_bias") && t["attention_bias"].is_boolean()) {
      c.qkv_bias = t["attention_bias"].get<bool>() || c.arch == Architecture::kQwen2;
    }
    if (t.contains("bos_token_id")) {
      auto bos = id_list(t["bos_token_id"]);
      if (!bos.empty()) c.bos_token_id = bos[0];
    }
    if (t.contains("eos_token_id")) c.eos_token_ids = id_list(t["eos_token_id"]);
    std::string act = t.value("hidden_act", std::string("silu"));
    if (act != "silu") {
      return Status::Error("config.json: hidden_act '" + act + "' is not supported (silu only)");
    }
  } catch (const json::exception& e) {
    return Status::Error(std::string("config.json: ") + e.what());
  }
  KUIPER_RETURN_IF_ERROR(read_rope(t, c));
  if (vl) {
    KUIPER_RETURN_IF_ERROR(read_mrope(t, c));
    c.image_token_id = required_id(hf, "image_token_id");
    c.vision_start_token_id = required_id(hf, "vision_start_token_id");
    c.vision_end_token_id = required_id(hf, "vision_end_token_id");
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
