// kuiper-bench's command-line flags (defined in flags.cpp; README.md says what each does) and
// the parsing of the list-valued ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "kuiper/base/dtype.h"
#include "kuiper/base/status.h"
#include "kuiper/model/config.h"
#include "kuiper/op/attention_kind.h"
#include "kuiper/op/weight.h"

DECLARE_string(config);
DECLARE_string(model);
DECLARE_string(dtype);
DECLARE_int32(prompt);
DECLARE_int32(gen);
DECLARE_string(attention);
DECLARE_bool(cuda_graph);
DECLARE_int32(repeat);
DECLARE_double(max_repeat_s);
DECLARE_string(json);
DECLARE_string(contexts);
DECLARE_string(prefill_lengths);
DECLARE_int32(fill_chunk);
DECLARE_int64(max_context);
DECLARE_double(max_fill_s);
DECLARE_double(max_prefill_s);
DECLARE_double(peak_tflops);
DECLARE_bool(attention_only);
DECLARE_bool(matmul_only);
DECLARE_bool(sample_only);
DECLARE_int32(heads);
DECLARE_int32(kv_heads);
DECLARE_int32(head_dim);
DECLARE_int32(kv_len);
DECLARE_int32(prefill_len);
DECLARE_bool(replay_graph);
DECLARE_int32(decode_grid);
DECLARE_bool(pdl);
DECLARE_string(decode_kv_lens);
DECLARE_string(causal_lens);
DECLARE_string(decode_batch);
DECLARE_int32(block_size);
DECLARE_int32(kv_len_spread);
DECLARE_bool(throughput);
DECLARE_string(device);
DECLARE_int32(num_prompts);
DECLARE_int32(input_len);
DECLARE_int32(output_len);
DECLARE_double(len_jitter);
DECLARE_string(concurrency);
DECLARE_int32(shared_prefix);
DECLARE_int64(max_batch_tokens);
DECLARE_bool(overlap_steps);
DECLARE_double(temperature);
DECLARE_int32(top_k);
DECLARE_double(top_p);
DECLARE_double(min_p);
DECLARE_bool(warmup);
DECLARE_uint64(seed);
DECLARE_string(quantize);
DECLARE_string(quantize_lm_head);
DECLARE_bool(fp8_activations);
DECLARE_int32(group);

namespace kuiper::bench {

// "mha,flash2" -> {"mha", "flash2"}; every item must be an attention kind.
Result<std::vector<std::string>> split_kinds(const std::string& list);
// "512,4096" -> {512, 4096}, sorted; every value must be a positive integer.
Result<std::vector<int64_t>> split_lengths(const std::string& flag, const std::string& list);
// The model shape of --config (a Hugging Face config.json).
Result<ModelConfig> read_config();
// The dtype --config says the checkpoint is stored in ("dtype" or "torch_dtype").
Result<DataType> read_config_dtype();

// --quantize as a weight format: kPlain when unset, else fp8, int8 or int4.
Result<op::WeightFormat> quantize_format();
// The scale block --quantize makes (op::empty_weight's block_rows x block_cols): FP8 128 x 128
// (FineGrainedFP8's block), the integer formats 1 x --group.
struct QuantizeBlock {
  int64_t rows, cols;
};
QuantizeBlock quantize_block(op::WeightFormat format);
// `plain` [N, K] quantized per --quantize (a copy in the plain dtype when unset), on its device.
Result<op::Weight> quantize_weight(const Tensor& plain);

}  // namespace kuiper::bench
