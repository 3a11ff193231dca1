#include "tools/bench/cost_model.h"

namespace kuiper::bench {

double layer_matrix_params(const kuiper::ModelConfig& c) {
  const double H = c.hidden_size, I = c.intermediate_size;
  return (H * c.q_dim() * 2 + H * c.kv_dim() * 2 + 3 * H * I) * c.num_layers;
}

double matrix_bytes_per_weight(const kuiper::QuantizeSpec& q, size_t elem) {
  const double b = static_cast<double>(q.block);
  switch (q.format) {
    case kuiper::op::WeightFormat::kPlain: return static_cast<double>(elem);
    case kuiper::op::WeightFormat::kFp8: return 1.0 + (q.block > 0 ? 4.0 / (b * b) : 0.0);
    case kuiper::op::WeightFormat::kInt8: return 1.0 + 3.0 / b;  // fp16 scale, uint8 zero
    case kuiper::op::WeightFormat::kInt4: return 0.5 + 3.0 / b;
  }
  return static_cast<double>(elem);
}

namespace {

// lm_head's bytes: the embeddings' when tied, else its own format's.
double lm_head_bytes(const kuiper::ModelConfig& c, size_t elem, const kuiper::QuantizeSpec& q) {
  const double per_weight = c.tie_word_embeddings
                                ? static_cast<double>(elem)
                                : matrix_bytes_per_weight(q.for_lm_head(), elem);
  return static_cast<double>(c.vocab_size) * c.hidden_size * per_weight;
}

}  // namespace

double decode_bytes(const kuiper::ModelConfig& c, size_t elem, double context,
                    const kuiper::QuantizeSpec& q) {
  const double H = c.hidden_size;
  const double weights = layer_matrix_params(c) * matrix_bytes_per_weight(q, elem) +
                         lm_head_bytes(c, elem, q) + H * elem;
  const double kv = 2.0 * c.num_layers * c.kv_dim() * context * elem;
  return weights + kv;
}

double weight_bytes(const kuiper::ModelConfig& c, size_t elem, const kuiper::QuantizeSpec& q) {
  const double H = c.hidden_size;
  double per_layer = 2 * H;  // the two norms
  if (c.qk_norm) per_layer += 2.0 * c.head_dim;
  if (c.qkv_bias) per_layer += c.q_dim() + 2.0 * c.kv_dim();
  const double lm_head = c.tie_word_embeddings ? 0.0 : lm_head_bytes(c, elem, q);
  return layer_matrix_params(c) * matrix_bytes_per_weight(q, elem) + lm_head +
         (per_layer * c.num_layers + c.vocab_size * H + H) * elem;
}

double kv_cache_bytes(const kuiper::ModelConfig& c, size_t elem, int64_t max_context) {
  return 2.0 * c.num_layers * static_cast<double>(max_context) * c.kv_dim() * elem;
}

double workspace_bytes(const kuiper::ModelConfig& c, size_t elem, int64_t T) {
  const double per_token = 8 + elem * (3.0 * c.hidden_size + 2.0 * c.q_dim() + 2.0 * c.kv_dim() +
                                       2.0 * c.intermediate_size);
  return per_token * static_cast<double>(T) + 4.0 * c.vocab_size;
}

double causal_attention_flops(int64_t heads, int64_t head_dim, int64_t start, int64_t T) {
  const double keys = static_cast<double>(T) * static_cast<double>(start) +
                      static_cast<double>(T) * static_cast<double>(T + 1) / 2.0;
  return 4.0 * static_cast<double>(heads) * static_cast<double>(head_dim) * keys;
}

double prefill_flops(const kuiper::ModelConfig& c, int64_t T) {
  return 2.0 * layer_matrix_params(c) * static_cast<double>(T) +
         c.num_layers * causal_attention_flops(c.num_heads, c.head_dim, 0, T) +
         2.0 * c.vocab_size * c.hidden_size;
}

double served_flops(const kuiper::ModelConfig& c, const ServedRequest& r) {
  const int64_t run = r.prompt - r.cached + r.output - 1;
  return 2.0 * layer_matrix_params(c) * static_cast<double>(run) +
         c.num_layers * causal_attention_flops(c.num_heads, c.head_dim, r.cached, run) +
         2.0 * c.vocab_size * c.hidden_size * static_cast<double>(r.output);
}

double served_decode_kv_bytes(const kuiper::ModelConfig& c, size_t elem, const ServedRequest& r) {
  // Decode token k = 1 .. output-1 runs at position prompt + k - 1 and reads prompt + k rows.
  const double steps = static_cast<double>(r.output - 1);
  const double rows = steps * static_cast<double>(r.prompt) + steps * (steps + 1) / 2.0;
  return 2.0 * c.num_layers * c.kv_dim() * rows * static_cast<double>(elem);
}

}  // namespace kuiper::bench
