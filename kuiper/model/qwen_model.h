// Qwen2/2.5 and Qwen3 decoder-only transformers. They share one graph; the differences are
// config flags, not subclasses: Qwen2 adds a bias to the q/k/v projections (qkv_bias), Qwen3
// RMS-normalises each q and k head before RoPE (qk_norm) and sets head_dim independently of
// hidden_size / num_heads.
#pragma once

#include "kuiper/model/model.h"
#include "kuiper/op/attention.h"

namespace kuiper {

class QwenModel : public Model {
 public:
  static Result<std::unique_ptr<QwenModel>> create(std::shared_ptr<ModelFile> file,
                                                   const ModelOptions& options);
  Result<Tensor> forward(const std::vector<int32_t>& ids, int64_t start,
                         bool all_logits) override;

 private:
  struct Layer {
    Tensor input_norm, q_proj, k_proj, v_proj, q_bias, k_bias, v_bias, q_norm, k_norm, o_proj;
    Tensor post_norm, gate_proj, up_proj, down_proj;
    Tensor k_cache, v_cache;  // [max_context, kv_dim]
  };
  // Activations for up to `capacity` tokens, reused across calls.
  struct Workspace {
    int64_t capacity = 0;
    Tensor ids, positions, x, h, q, k, v, attn, o, gate, up, logits;
  };

  using Model::Model;
  Status load_weights();
  Status ensure_workspace(int64_t tokens, bool all_logits);
  Status run_layer(Layer& layer, int64_t T, int64_t start);

  Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  std::unique_ptr<op::AttentionOp> prefill_attention_, decode_attention_;
  Workspace ws_;
};

}  // namespace kuiper
