#include "kuiper/model/quantization.h"

#include "kuiper/base/json_reader.h"
#include "kuiper/op/ops.h"

namespace kuiper {

using nlohmann::json;

std::vector<std::string> quantizable_tensors(const ModelConfig& c) {
  std::vector<std::string> names;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = c.text_prefix() + "layers." + std::to_string(l) + ".";
    for (const char* m : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      names.push_back(p + m + ".weight");
    }
  }
  if (!c.tie_word_embeddings) names.push_back("lm_head.weight");
  return names;
}

Result<std::vector<std::pair<std::string, QuantizedEntry>>> parse_quantization(
    const json& metadata) {
  std::vector<std::pair<std::string, QuantizedEntry>> entries;
  const JsonReader root(metadata, "metadata");
  if (!root.is_object() || !root.has("quantization")) return entries;
  KUIPER_ASSIGN_OR_RETURN(JsonReader q, root.at("quantization"));
  KUIPER_ASSIGN_OR_RETURN(auto members, q.members());
  for (const auto& [name, value] : members) {
    QuantizedEntry e;
    KUIPER_ASSIGN_OR_RETURN(std::string format, value.get_string("format"));
    Result<op::WeightFormat> parsed = op::parse_weight_format(format);
    if (!parsed.ok() || *parsed == op::WeightFormat::kPlain) {
      return value.error("format '" + format + "' is not fp8, int8 or int4");
    }
    e.format = *parsed;
    KUIPER_ASSIGN_OR_RETURN(JsonReader block, value.at("block"));
    // Far above any real block, so products with matrix sizes cannot overflow.
    KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> b, block.to_int_list(1, int64_t{1} << 30));
    if (b.size() != 2) return block.error("must be two positive integers [rows, cols]");
    e.block_rows = b[0];
    e.block_cols = b[1];
    entries.emplace_back(name, e);
  }
  return entries;
}

json quantization_json(const QuantizedEntry& e) {
  return {{"format", op::weight_format_name(e.format)}, {"block", {e.block_rows, e.block_cols}}};
}

QuantizedEntry QuantizeSpec::entry_for(int64_t K) const {
  if (format == op::WeightFormat::kFp8) {
    return block == 0 ? QuantizedEntry{format, 1, K} : QuantizedEntry{format, block, block};
  }
  return {format, 1, block};
}

std::string QuantizeSpec::describe() const {
  std::string name = op::weight_format_name(format);
  if (format == op::WeightFormat::kFp8) {
    name += block == 0 ? " per-channel" : " block " + std::to_string(block) + "x" +
                                              std::to_string(block);
  } else if (format != op::WeightFormat::kPlain) {
    name += " group " + std::to_string(block);
  }
  return lm_head_quantized() ? name + ", lm_head " + for_lm_head().describe() : name;
}

Result<QuantizeSpec> parse_quantize_spec(const std::string& format, int64_t block,
                                         const std::string& lm_head) {
  QuantizeSpec spec;
  spec.block = block;
  for (const auto& [flag, out] : {std::make_pair(&format, &spec.format),
                                  std::make_pair(&lm_head, &spec.lm_head)}) {
    if (flag->empty()) continue;
    KUIPER_ASSIGN_OR_RETURN(*out, op::parse_weight_format(*flag));
    const bool fp8 = *out == op::WeightFormat::kFp8;
    if (*out == op::WeightFormat::kPlain) continue;
    if (block < (fp8 ? 0 : 1) || block > (int64_t{1} << 20)) {
      return Status::Error("the " + *flag + (fp8 ? " block " : " group ") +
                           std::to_string(block) + " is out of range" +
                           (fp8 ? " (0: per-channel)" : ""));
    }
    if (*out == op::WeightFormat::kInt4 && block % 2 != 0) {
      return Status::Error("the int4 group must be even, not " + std::to_string(block));
    }
  }
  return spec;
}

Result<op::Weight> quantize_matrix(const Tensor& w, const QuantizeSpec& spec) {
  if (w.ndim() != 2) return Status::Error("cannot quantize " + w.describe() + ": not a matrix");
  const QuantizedEntry e = spec.entry_for(w.dim(1));
  KUIPER_ASSIGN_OR_RETURN(op::Weight out, op::empty_weight(e.format, w.dim(0), w.dim(1),
                                                           e.block_rows, e.block_cols,
                                                           w.device()));
  KUIPER_RETURN_IF_ERROR(op::quantize(w, out));
  return out;
}

}  // namespace kuiper
