// The cost model the figures are judged by: bytes a decode step reads, bytes the model holds,
// FLOPs of attention and of a prefill.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kuiper/model/config.h"
#include "kuiper/model/quantization.h"

namespace kuiper::bench {

// Parameters of the matrices one token multiplies by (q/k/v/o, gate/up/down in every layer).
double layer_matrix_params(const kuiper::ModelConfig& c);
// Bytes a layer matrix holds per weight: the activation dtype's size `elem`, or a quantized
// format's code with its share of the scales and zeros (int4 with groups of 128: 0.5 + 3/128).
double matrix_bytes_per_weight(const kuiper::QuantizeSpec& q, size_t elem);
// Bytes one decode step must read: every weight matrix (the matrices are stored in the
// activation dtype on the GPU, or quantized as `q` says, an untied lm_head as q.lm_head says),
// one embedding row, and the K and V cache rows so far.
double decode_bytes(const kuiper::ModelConfig& c, size_t elem, double context,
                    const kuiper::QuantizeSpec& q = {});
// Bytes of every weight as the GPU stores them (activation dtype; layer matrices and an untied
// lm_head as `q` says).
double weight_bytes(const kuiper::ModelConfig& c, size_t elem, const kuiper::QuantizeSpec& q = {});
double kv_cache_bytes(const kuiper::ModelConfig& c, size_t elem, int64_t max_context);
// Activations of a forward of T tokens (QwenModel's Workspace) plus one row of fp32 logits.
double workspace_bytes(const kuiper::ModelConfig& c, size_t elem, int64_t T);
// FLOPs of causal attention for T queries starting at position `start` (query t sees
// start + t + 1 keys): QK^T and PV, 2 flops per multiply-add each. Same count as
// scripts/peer_bench.py uses for PyTorch.
double causal_attention_flops(int64_t heads, int64_t head_dim, int64_t start, int64_t T);
// FLOPs of a prefill of T tokens from position 0: every layer matrix for every token, attention
// in every layer, and the lm_head for the last token only.
double prefill_flops(const kuiper::ModelConfig& c, int64_t T);

// One served request as the model runs it: a prompt of `prompt` tokens whose first `cached` came
// from the prefix cache, then `output` sampled tokens (the last one never runs).
struct ServedRequest {
  int64_t prompt = 0;
  int64_t cached = 0;
  int64_t output = 0;
};
// FLOPs of serving `r`: every layer matrix for each token run, causal attention over the cache in
// every layer, and the lm_head for each sampled token.
double served_flops(const kuiper::ModelConfig& c, const ServedRequest& r);
// Bytes the decode steps of `r` read from the KV cache: each token after the first attends to
// every row before it.
double served_decode_kv_bytes(const kuiper::ModelConfig& c, size_t elem, const ServedRequest& r);

}  // namespace kuiper::bench
