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
  // Random weights generated on the model's device by op::fill_random (see Model::random).
  static Result<std::unique_ptr<QwenModel>> create_random(const ModelConfig& config,
                                                          const ModelOptions& options,
                                                          uint64_t seed);
  ~QwenModel() override;
  Result<Tensor> forward(const std::vector<int32_t>& ids, int64_t start,
                         bool all_logits) override;

 private:
  struct Layer {
    Tensor input_norm, q_proj, k_proj, v_proj, q_bias, k_bias, v_bias, q_norm, k_norm, o_proj;
    Tensor post_norm, gate_proj, up_proj, down_proj;
    Tensor k_cache, v_cache;  // [max_context, kv_dim]
    // On the GPU q/k/v and gate/up are stored stacked, [q_dim + 2 kv_dim, H] and [2 I, H], and
    // the separate tensors above are row views of them: decode reads each stack with one GEMV,
    // one launch over a matrix large enough to stream at full bandwidth. Undefined on the CPU,
    // whose weights stay views of the mapped file.
    Tensor qkv_proj, qkv_bias, gate_up_proj;
  };
  // Activations for up to `capacity` tokens. Prefill's grows with the longest prompt; decode has
  // its own of one token, allocated at load, so its addresses (baked into the decode graph)
  // never change.
  struct Workspace {
    int64_t capacity = 0;
    Tensor ids, positions, x, h, q, k, v, attn, o, gate, up, logits;
    // M-RoPE models (Qwen3-VL): int32 [3 * capacity], the first 3T entries the [3, T] rotary
    // positions (rows t, h, w); positions stays the tokens' cache rows.
    Tensor rope_positions;
    // One-token workspaces only: q|k|v and gate|up back to back, the outputs of the stacked
    // GEMVs; q, k, v, gate and up are views of them.
    Tensor qkv, gate_up;
  };
  struct DecodeGraph;  // the captured decode step (CUDA builds), defined in qwen_model.cpp

  QwenModel(ModelConfig config, std::shared_ptr<ModelFile> file, const ModelOptions& options,
            int64_t max_context);
  // Checks options, creates the attention ops and the decode workspace; weights come after.
  static Result<std::unique_ptr<QwenModel>> make(ModelConfig config,
                                                 std::shared_ptr<ModelFile> file,
                                                 const ModelOptions& options);
  // Fills every weight with `get(name, shape, out)` and allocates the KV cache.
  template <typename Get>
  Status build_weights(Get&& get);
  // Stacks each layer's q/k/v and gate/up matrices (see Layer); device models only.
  Status stack_projections();
  Result<Workspace> make_workspace(int64_t tokens, int64_t logit_rows) const;
  Status run_layer(Layer& layer, const Workspace& ws, int64_t T, int64_t start);
  // Embedding, every layer and the logits of the last `logit_rows` tokens (into logits rows
  // logit_row0...), all queued on the device; ids and positions are already in ws.
  Status run_forward(const Workspace& ws, int64_t T, int64_t start, int64_t logit_rows,
                     int64_t logit_row0 = 0);
  Status run_decode_graph(int64_t start);

  Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  std::unique_ptr<op::AttentionOp> prefill_attention_, decode_attention_;
  Workspace prefill_ws_, decode_ws_;
  std::unique_ptr<DecodeGraph> graph_;
  // Runs on the hidden states x [T, hidden] after the embedding (layer -1) and after each decoder
  // layer; Qwen3-VL sets it for a prefill with images (vision embeddings, deepstack).
  std::function<Status(int64_t layer, Tensor& x)> hidden_hook_;
  // M-RoPE (Qwen3-VL): set by the caller of run_forward when every token's three rotary
  // positions are equal (text), where M-RoPE is plain RoPE and the fused qk-norm / RoPE /
  // cache-write kernel serves, rotating at rope_positions' first axis.
  bool rope_axes_equal_ = false;
  friend class Qwen3VLModel;  // drives the layers with its own positions and hook
};

}  // namespace kuiper
