// Quantized projections in the model file and the model: which tensors may be quantized, how a
// quantized one is stored, and the round-to-nearest recipe (format and block) the converter and
// random-weight models apply.
//
// A quantized matrix "X.weight" (op::Weight, kuiper/op/weight.h) is stored as the tensors
// "X.weight" (its values: the codes or FP8 numbers), "X.weight.scales" and, for the integer
// formats, "X.weight.zeros", and the file metadata's "quantization" object names its format and
// scale block: {"X.weight": {"format": "int4", "block": [1, 128]}, ...}. Tensors not named
// there are plain. Only the decoder's projections and an untied lm_head may be quantized.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/model/config.h"
#include "kuiper/op/weight.h"

namespace kuiper {

inline const char* const kScalesSuffix = ".scales";
inline const char* const kZerosSuffix = ".zeros";

// The names of the matrices `config` allows to be quantized: each layer's q/k/v/o and
// gate/up/down projections and, when not tied to the embeddings, lm_head.
std::vector<std::string> quantizable_tensors(const ModelConfig& config);

// The "quantization" entry of one matrix.
struct QuantizedEntry {
  op::WeightFormat format = op::WeightFormat::kPlain;
  int64_t block_rows = 1, block_cols = 1;
};
// The metadata's "quantization" object by tensor name; a missing one is empty. Errors say which
// entry is malformed (an unknown format, a block that is not two positive integers).
Result<std::vector<std::pair<std::string, QuantizedEntry>>> parse_quantization(
    const nlohmann::json& metadata);
nlohmann::json quantization_json(const QuantizedEntry& entry);

// How to quantize a 16-bit checkpoint's matrices (kuiper-convert --quantize, random-weight
// models): the decoder's projections in `format`, and an untied lm_head in `lm_head` (kPlain by
// default: it stays as stored, as the published FP8, AWQ and GPTQ releases keep it; llama.cpp
// and calm quantize theirs). Both use `block`.
struct QuantizeSpec {
  op::WeightFormat format = op::WeightFormat::kPlain;  // kPlain: leave weights as they are
  // kInt8 / kInt4: columns per group (a scale and zero point each). kFp8: the side of the square
  // scale block (128 is FineGrainedFP8's), or 0 for one scale per row (per-channel, 1 x K).
  int64_t block = 128;
  op::WeightFormat lm_head = op::WeightFormat::kPlain;

  bool quantized() const { return format != op::WeightFormat::kPlain || lm_head_quantized(); }
  bool lm_head_quantized() const { return lm_head != op::WeightFormat::kPlain; }
  // The scale block for an [N, K] matrix.
  QuantizedEntry entry_for(int64_t K) const;
  // The spec lm_head is quantized by: its format with the same block.
  QuantizeSpec for_lm_head() const { return QuantizeSpec{lm_head, block}; }
  // "int4 group 128", "fp8 block 128x128", "fp8 per-channel", "plain"; then ", lm_head int8
  // group 128" when lm_head is quantized.
  std::string describe() const;
};
// From the programs' flags: format and lm_head "fp8", "int8" or "int4" ("" or "plain": none);
// block as above. An integer format needs a group (block 0 is FP8's per-channel only).
Result<QuantizeSpec> parse_quantize_spec(const std::string& format, int64_t block,
                                         const std::string& lm_head = "");

// op::quantize of `w` (fp32/fp16/bf16 [N, K]) as `spec` says, on w's device.
Result<op::Weight> quantize_matrix(const Tensor& w, const QuantizeSpec& spec);

}  // namespace kuiper
