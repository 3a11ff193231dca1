#include "kuiper/model/hf_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "kuiper/base/json_reader.h"
#include "kuiper/model/model_file.h"
#include "kuiper/op/ops.h"

namespace kuiper {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

Result<std::string> read_text(const std::string& path) {
  KUIPER_ASSIGN_OR_RETURN(MappedFile file, map_file(path));
  return std::string(reinterpret_cast<const char*>(file.data()), file.size);
}

// A file the model file embeds: required, and checked to be JSON now rather than when a
// tokenizer first reads it from the converted file.
Result<std::string> read_required_json_text(const std::string& dir, const std::string& name,
                                            const std::string& why) {
  const std::string path = (fs::path(dir) / name).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::Error(dir + ": " + name + " is missing (" + why + ")");
  KUIPER_ASSIGN_OR_RETURN(std::string text, read_text(path));
  Result<json> parsed = parse_json(text, path);
  if (!parsed.ok()) return parsed.status();
  return text;
}

bool is_float_type(DataType t) {
  return t == DataType::kFp32 || t == DataType::kFp16 || t == DataType::kBf16;
}

}  // namespace

Result<HfCheckpoint> read_hf_checkpoint(const std::string& dir) {
  std::error_code ec;
  fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return Status::Error(dir + ": no such directory");
  if (!fs::is_directory(st)) return Status::Error(dir + ": not a directory");

  HfCheckpoint ckpt;
  ckpt.dir = dir;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path, ec)) {
    return Status::Error(dir + ": no config.json (not a Hugging Face checkpoint directory)");
  }
  KUIPER_ASSIGN_OR_RETURN(std::string config_text, read_text(config_path));
  KUIPER_ASSIGN_OR_RETURN(ckpt.hf_config, parse_json(config_text, config_path));
  // Quantized releases (FP8, AWQ, GPTQ, ...) say so here; their matrices are read repacked.
  Result<HfQuantization> quantization = parse_hf_quantization(ckpt.hf_config);
  if (!quantization.ok()) return quantization.status().With(config_path);
  ckpt.quantization = *quantization;
  Result<ModelConfig> config = ModelConfig::from_hf(ckpt.hf_config);
  if (!config.ok()) return config.status().With(dir);
  ckpt.config = *config;

  KUIPER_ASSIGN_OR_RETURN(ckpt.tokenizer_json,
                          read_required_json_text(dir, "tokenizer.json",
                                                  "the model file embeds the tokenizer"));
  KUIPER_ASSIGN_OR_RETURN(ckpt.tokenizer_config_json,
                          read_required_json_text(dir, "tokenizer_config.json",
                                                  "the model file embeds the chat template"));
  const std::string preprocessor_path = (fs::path(dir) / "preprocessor_config.json").string();
  if (fs::exists(preprocessor_path, ec)) {
    KUIPER_ASSIGN_OR_RETURN(std::string text, read_text(preprocessor_path));
    KUIPER_ASSIGN_OR_RETURN(ckpt.preprocessor_config, parse_json(text, preprocessor_path));
  } else if (ckpt.config.arch == Architecture::kQwen3VL) {
    return Status::Error(dir + ": preprocessor_config.json is missing (the model file embeds the "
                              "image processor settings of a vision model)");
  }
  KUIPER_ASSIGN_OR_RETURN(ckpt.weights, SafetensorsCheckpoint::open(dir));
  return ckpt;
}

Status convert_checkpoint(const std::string& hf_dir, const std::string& out_path,
                          std::optional<DataType> dtype,
                          const std::function<void(const ConvertProgress&)>& progress,
                          const QuantizeSpec& quantize) {
  if (dtype && !is_float_type(*dtype)) {
    return Status::Error(std::string("cannot convert weights to ") + dtype_name(*dtype) +
                         " (fp32, fp16 or bf16)");
  }
  KUIPER_ASSIGN_OR_RETURN(HfCheckpoint ckpt, read_hf_checkpoint(hf_dir));
  if (quantize.quantized() && ckpt.quantization.quantized()) {
    return Status::Error(hf_dir + ": the checkpoint is already quantized; quantize its 16-bit "
                                  "release instead");
  }
  if (quantize.lm_head_quantized() && ckpt.config.tie_word_embeddings) {
    return Status::Error(hf_dir + ": lm_head is tied to the embeddings (tie_word_embeddings), "
                                  "so it stays as stored; leave lm_head unquantized");
  }

  // Check the whole tensor list before writing a byte, so a bad checkpoint fails at once.
  std::vector<TensorSource> sources;
  std::vector<uint64_t> bytes_through;  // output bytes up to and including tensor i
  std::vector<std::string> missing;
  uint64_t total_bytes = 0;
  json quantization = json::object();
  // A quantized matrix: its values, scales and zeros written one after another from one
  // op::Weight, made when the values are written and dropped after its last part, so memory
  // holds one matrix at a time.
  auto add_quantized = [&](const TensorSpec& spec, const QuantizedEntry& e,
                           std::function<Result<op::Weight>()> make) -> Status {
    Result<op::Weight> layout = op::empty_weight(e.format, spec.shape[0], spec.shape[1],
                                                 e.block_rows, e.block_cols, DeviceType::kCpu);
    if (!layout.ok()) return layout.status().With(hf_dir + ": tensor '" + spec.name + "'");
    const std::vector<std::pair<std::string, Tensor>> parts = [&] {
      std::vector<std::pair<std::string, Tensor>> p = {{spec.name, layout->values},
                                                       {spec.name + kScalesSuffix, layout->scales}};
      if (layout->zeros.defined()) p.emplace_back(spec.name + kZerosSuffix, layout->zeros);
      return p;
    }();
    auto made = std::make_shared<op::Weight>();
    for (size_t i = 0; i < parts.size(); ++i) {
      const Tensor& part = parts[i].second;
      const bool last = i + 1 == parts.size();
      sources.push_back({parts[i].first, part.dtype(), part.shape(),
                         [made, make, i, last](void* dst) -> Status {
                           if (i == 0) {
                             KUIPER_ASSIGN_OR_RETURN(*made, make());
                           }
                           const Tensor& t =
                               i == 0 ? made->values : i == 1 ? made->scales : made->zeros;
                           std::memcpy(dst, t.raw(), t.nbytes());
                           if (last) *made = op::Weight();
                           return Status::Ok();
                         }});
      total_bytes += part.nbytes();
      bytes_through.push_back(total_bytes);
    }
    quantization[spec.name] = quantization_json(e);
    return Status::Ok();
  };
  const std::vector<std::string> quantizable = quantizable_tensors(ckpt.config);
  for (const TensorSpec& spec : expected_tensors(ckpt.config)) {
    const bool projection =
        std::find(quantizable.begin(), quantizable.end(), spec.name) != quantizable.end();
    if (projection && ckpt.quantization.quantized()) {
      const int64_t N = spec.shape[0], K = spec.shape[1];
      Result<std::optional<QuantizedEntry>> e =
          describe_hf_quantized(ckpt.quantization, ckpt.weights, spec.name, N, K);
      if (!e.ok()) return e.status().With(hf_dir);
      if (e->has_value()) {
        const HfCheckpoint* c = &ckpt;
        KUIPER_RETURN_IF_ERROR(add_quantized(spec, **e, [c, name = spec.name, N, K] {
          return read_hf_quantized(c->quantization, c->weights, name, N, K);
        }));
        continue;
      }
    }
    const SafetensorsTensor* t = ckpt.weights.find(spec.name);
    if (t == nullptr) {
      missing.push_back(spec.name);
      continue;
    }
    if (t->shape != spec.shape) {
      return Status::Error(hf_dir + ": tensor '" + spec.name + "' has shape " +
                           shape_string(t->shape) + " in " + ckpt.weights.file_of(spec.name) +
                           " but config.json implies " + shape_string(spec.shape));
    }
    if (!is_float_type(t->dtype)) {
      return Status::Error(hf_dir + ": tensor '" + spec.name + "' is " + dtype_name(t->dtype) +
                           ", not a float type, and the quantization_config does not say how "
                           "to read it");
    }
    const QuantizeSpec as =
        spec.name == "lm_head.weight" ? quantize.for_lm_head() : QuantizeSpec{quantize.format,
                                                                              quantize.block};
    if (projection && as.quantized()) {
      KUIPER_RETURN_IF_ERROR(add_quantized(spec, as.entry_for(spec.shape[1]), [t, as] {
        const Tensor w = Tensor::view(const_cast<void*>(t->data), t->shape, t->dtype,
                                      DeviceType::kCpu);
        return quantize_matrix(w, as);
      }));
      continue;
    }
    const DataType out = dtype.value_or(t->dtype);
    const size_t n = t->nbytes / dtype_size(t->dtype);
    sources.push_back({spec.name, out, spec.shape, [t, out, n](void* dst) {
                         const Status s = convert_elements(t->data, t->dtype, dst, out, n);
                         if (s.ok() || out != DataType::kFp16) return s;
                         // Values past 65504 would be inf in the file: refuse, pointing at bf16.
                         return Status::Error(s.message() +
                                              "; convert to bf16 (--dtype bf16), which has "
                                              "fp32's range, or keep the stored dtype");
                       }});
    total_bytes += n * dtype_size(out);
    bytes_through.push_back(total_bytes);
  }
  if (!missing.empty()) {
    std::string more = missing.size() > 1
                           ? " (and " + std::to_string(missing.size() - 1) + " more)"
                           : std::string();
    return Status::Error(hf_dir + ": tensor '" + missing[0] +
                         "' is missing from the checkpoint" + more);
  }

  json metadata = {{"hf_config", ckpt.hf_config},
                   {"tokenizer_json", ckpt.tokenizer_json},
                   {"tokenizer_config_json", ckpt.tokenizer_config_json}};
  if (!ckpt.preprocessor_config.is_null()) {
    metadata["preprocessor_config"] = ckpt.preprocessor_config;
  }
  if (!quantization.empty()) metadata["quantization"] = quantization;
  auto on_tensor = [&](size_t done, size_t total) {
    if (progress) progress({done, total, bytes_through[done - 1], total_bytes});
  };
  return write_model_file(out_path, ckpt.config, std::move(metadata), sources, on_tensor);
}

}  // namespace kuiper
