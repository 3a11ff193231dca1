// Quantized Hugging Face checkpoints as published, read into Kuiper's layouts (op::Weight,
// kuiper/op/weight.h). config.json's "quantization_config" says which; three are read:
//
//   fp8   FineGrainedFP8 (Qwen3-*-FP8, transformers' FineGrainedFP8Config): "weight" F8_E4M3
//         [N, K] and "weight_scale_inv" [ceil(N / br), ceil(K / bc)] for weight_block_size
//         [br, bc]; w = weight * weight_scale_inv[n / br, k / bc]. Only dynamic activation
//         scaling (activations stay unquantized here, as the dynamic scheme computes them).
//   awq   AutoAWQ's GEMM version (Qwen2.5-*-AWQ): 4 bits, zero point, "qweight" int32
//         [K, N / 8] holding columns 8j + c of row k in bits 4 * kAwqSlot[c] of word [k, j]
//         (AutoAWQ packs them in the order 0, 2, 4, 6, 1, 3, 5, 7), "qzeros" int32 [K / g, N / 8]
//         packed alike, "scales" fp16 [K / g, N]; w[n, k] = (q - z) * s of group k / g.
//   gptq  AutoGPTQ / GPTQModel (Qwen2.5-*-GPTQ-Int4 / -Int8): 4 or 8 bits, "qweight" int32
//         [K / p, N] (p = 32 / bits codes a word, along K: row k in bits bits * (k % p) of word
//         [k / p, n]), "qzeros" int32 [K / g, N / p] packed along N, "scales" fp16 [K / g, N],
//         "g_idx" int32 [K]; w = (q - z) * s. checkpoint_format "gptq" (the default, "v1")
//         stores z - 1, "gptq_v2" z itself. Act-order (desc_act, or a g_idx other than k / g)
//         is refused.
//
// Other quant_methods and options are refused by name. Modules the checkpoint stores plain
// (modules_to_not_convert, lm_head, the embeddings) are read as before.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kuiper/model/quantization.h"
#include "kuiper/model/safetensors.h"
#include "kuiper/op/weight.h"

namespace kuiper {

enum class HfQuantMethod { kNone, kFp8, kAwq, kGptq };

struct HfQuantization {
  HfQuantMethod method = HfQuantMethod::kNone;
  int64_t bits = 0;                       // awq, gptq
  int64_t group = 0;                      // awq, gptq; 0: one group of the whole row (-1)
  int64_t block_rows = 0, block_cols = 0;  // fp8 weight_block_size
  bool gptq_zero_offset = true;           // gptq v1: the stored zero is z - 1

  bool quantized() const { return method != HfQuantMethod::kNone; }
};

// config.json's "quantization_config" (none: kNone). Errors name the unsupported method or
// option ("quant_method bitsandbytes is not supported (fp8, awq or gptq)", "desc_act ...").
Result<HfQuantization> parse_hf_quantization(const nlohmann::json& hf_config);

// AutoAWQ's slot of column c within a packed word: the inverse of its order 0,2,4,6,1,3,5,7.
inline constexpr int kAwqSlot[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// The published layouts repacked into op::Weight (CPU). The inputs are the checkpoint's raw
// arrays as described above, for an [N, K] matrix; shapes are the caller's to check.
Result<op::Weight> repack_awq(const int32_t* qweight, const int32_t* qzeros,
                              const uint16_t* scales_fp16, int64_t N, int64_t K, int64_t group);
Result<op::Weight> repack_gptq(const int32_t* qweight, const int32_t* qzeros,
                               const uint16_t* scales_fp16, int64_t N, int64_t K, int64_t group,
                               int64_t bits, bool zero_offset);
Result<op::Weight> repack_fp8(const uint8_t* weight, const float* scale_inv, int64_t N, int64_t K,
                              int64_t block_rows, int64_t block_cols);

// The matrix `name` ("...q_proj.weight", [N, K]) of a quantized checkpoint, repacked, with the
// scale block it has; nullopt when the checkpoint stores it plain (no quantized tensors for its
// module). `describe` gives the entry without reading data (the converter plans first).
Result<std::optional<QuantizedEntry>> describe_hf_quantized(const HfQuantization& q,
                                                            const SafetensorsCheckpoint& weights,
                                                            const std::string& name, int64_t N,
                                                            int64_t K);
Result<op::Weight> read_hf_quantized(const HfQuantization& q,
                                     const SafetensorsCheckpoint& weights,
                                     const std::string& name, int64_t N, int64_t K);

}  // namespace kuiper
