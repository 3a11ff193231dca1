// A Hugging Face checkpoint directory as published (config.json, tokenizer files, safetensors)
// and its conversion into one Kuiper model file.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kuiper/base/dtype.h"
#include "kuiper/model/config.h"
#include "kuiper/model/hf_quantized.h"
#include "kuiper/model/quantization.h"
#include "kuiper/model/safetensors.h"

namespace kuiper {

struct HfCheckpoint {
  std::string dir;
  nlohmann::json hf_config;            // config.json as published
  ModelConfig config;                  // ModelConfig::from_hf(hf_config)
  std::string tokenizer_json;          // tokenizer.json, verbatim
  std::string tokenizer_config_json;   // tokenizer_config.json (chat template), verbatim
  nlohmann::json preprocessor_config;  // preprocessor_config.json; null when there is none
  HfQuantization quantization;         // config.json's quantization_config (hf_quantized.h)
  SafetensorsCheckpoint weights;
};

// Reads `dir`: config.json (an unsupported architecture or quantization is an error),
// tokenizer.json and tokenizer_config.json (both required: the model file embeds them),
// preprocessor_config.json if present, and the safetensors (single or sharded). Tensors are
// checked by convert_checkpoint, not here.
Result<HfCheckpoint> read_hf_checkpoint(const std::string& dir);

struct ConvertProgress {
  size_t tensors_done = 0;
  size_t tensors_total = 0;
  uint64_t bytes_done = 0;  // tensor data written so far, in the output dtype
  uint64_t bytes_total = 0;
};

// Converts the checkpoint in `hf_dir` into the model file `out_path`. Every tensor the config
// needs must be present with the shape it implies (a missing or mis-shaped tensor is an error
// naming it); others (lm_head.weight of a tied model, say) are left out. `dtype` (fp32, fp16 or
// bf16) converts every tensor; without it each keeps its stored dtype. A tensor whose values do
// not fit `dtype` (beyond fp16's 65504) is an error naming it and its largest |value|. On error
// no output file is left behind. `progress` is called after each tensor.
//
// A quantized checkpoint (FP8, AWQ, GPTQ: hf_quantized.h) keeps its quantized matrices, repacked
// into Kuiper's layouts; `dtype` then applies to the plain tensors only. `quantize` quantizes a
// 16-bit checkpoint's decoder projections (quantization.h; op::quantize on the CPU): the
// embeddings, norms, lm_head and a vision tower stay as they are. A shape the format cannot hold
// (a group that does not divide a row) is an error naming the matrix, as is quantizing an
// already quantized checkpoint.
Status convert_checkpoint(const std::string& hf_dir, const std::string& out_path,
                          std::optional<DataType> dtype,
                          const std::function<void(const ConvertProgress&)>& progress = nullptr,
                          const QuantizeSpec& quantize = {});

}  // namespace kuiper
