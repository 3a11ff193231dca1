// The Qwen family's one graph: Qwen2/2.5, Qwen3 and Qwen3-VL. The differences are config flags
// and data, not subclasses: Qwen2 adds a bias to the q/k/v projections (qkv_bias), Qwen3
// RMS-normalises each q and k head before RoPE (qk_norm) and sets head_dim independently of
// hidden_size / num_heads, and Qwen3-VL adds a vision tower and interleaved M-RoPE.
//
// Qwen3-VL: a prompt with images holds, per image, <|vision_start|> <|image_pad|> x merged_tokens
// <|vision_end|>. The pad tokens' embeddings are replaced by the image embeddings, deepstack
// feature k is added to those rows after decoder layer k, and every token rotates at a 3-D
// (t, h, w) position (qwen3_vl_rope_index); text tokens after an image rotate at cache position +
// the rope delta on all three axes, which is ordinary RoPE at that shifted position, so they take
// the text models' fused kernel and the decode graph.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "kuiper/base/device_graph.h"
#include "kuiper/base/host_upload.h"
#include "kuiper/model/model.h"
#include "kuiper/model/vision_encoder.h"
#include "kuiper/op/attention.h"

namespace kuiper {

// The dtype of the residual stream (the embedding output, every layer's residual adds, the
// image rows and deepstack adds, the final norm's input) for an activation dtype. Qwen2/2.5
// checkpoints carry residual values beyond fp16's largest number (65504) on some tokens, which
// fp16 turns into inf and then NaN: with fp16 activations the stream stays in fp32, read and
// written by the ops' mixed-dtype forms (op::embedding into fp32, op::rmsnorm and op::linear's
// norm from fp32, op::linear's residual and op::add into fp32), so the down projection's
// product is added in fp32 too. bf16 has fp32's range and keeps the stream in bf16, as
// transformers does; fp32 is fp32.
DataType residual_dtype(DataType activation);

class QwenModel : public Model {
 public:
  // With the vision tower when the file has one (Qwen3-VL).
  static Result<std::unique_ptr<QwenModel>> create(std::shared_ptr<ModelFile> file,
                                                   const ModelOptions& options);
  // Random weights generated on the model's device by op::fill_random (see Model::random), the
  // projections then quantized there as options.quantize says.
  static Result<std::unique_ptr<QwenModel>> create_random(const ModelConfig& config,
                                                          const ModelOptions& options,
                                                          uint64_t seed);
  ~QwenModel() override;

  Result<ImageFeatures> encode_images(const ImagePixels& images) override;

  // Bytes of the decoder's weights where they run, quantized ones as packed with their scales and
  // zeros (the vision tower's not counted).
  int64_t weight_bytes() const { return weight_bytes_; }

 protected:
  Result<Tensor> run_batch(Span<const SequenceInput> batch, const Tensor* tokens) override;

 private:
  struct Layer {
    Tensor input_norm, q_bias, k_bias, v_bias, q_norm, k_norm, post_norm;
    // The projections, plain or quantized (kuiper/op/weight.h).
    op::Weight q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
    Tensor k_cache, v_cache;  // the KV pool: [kv_blocks * kv_block_size, kv_dim]
    // On the GPU q/k/v and gate/up are stored stacked, [q_dim + 2 kv_dim, H] and [2 I, H], and
    // the separate weights above are row views of them: decode reads each stack with one GEMV,
    // one launch over a matrix large enough to stream at full bandwidth. Undefined on the CPU,
    // whose weights stay views of the mapped file, and for quantized parts whose scale blocks
    // straddle the boundaries (FP8 128-row blocks of parts not a multiple of 128 rows).
    op::Weight qkv_proj, gate_up_proj;
    Tensor qkv_bias;
  };
  // Activations and batch metadata for up to `capacity` tokens of one pass. The one-token
  // workspace (decode of one sequence: the fused GEMV forms) and the batch workspace are
  // allocated at load; the batch one grows only for a pass longer than it (prefill_chunk 0), and
  // the decode graphs captured on it are then dropped, since they hold its addresses.
  struct Workspace {
    int64_t capacity = 0;
    // The int32 inputs below are views of `inputs`, at these offsets.
    struct Offsets {
      int64_t ids, positions, rope, query_begin, starts, live, logit_index, fed_from, fed_to,
          block_tables;
    };
    Tensor inputs;
    Offsets offsets{};
    Tensor ids;
    Tensor positions;  // each token's row in the KV pool
    Tensor x;          // the residual stream, in residual_dtype(activation)
    Tensor h, q, k, v, attn, o, gate, up;
    // int32 [axes * capacity], the first axes * T entries the [axes, T] rotary positions (M-RoPE,
    // Qwen3-VL: 3 axes, rows t, h, w; else 1).
    Tensor rope_positions;
    // The pass's sequences (op::PagedBatch): query_begin [capacity + 1], starts [capacity],
    // live [1] (the sequences before a graph's pads), block tables [capacity * table_width] (a
    // pass's [S, W] is its first S * W entries).
    Tensor query_begin, starts, live, block_tables;
    // The rows whose logits a pass wants, when not simply its last ones: their indices and the
    // gathered residual rows.
    Tensor logit_index, picked;
    // The pass's rows whose token is fed (SequenceInput::fed): ids[fed_to[j]] = the fed
    // tokens[fed_from[j]] (op::copy_indexed), after the upload.
    Tensor fed_from, fed_to;
    // q|k|v and gate|up back to back, the outputs of the stacked GEMVs (one-token workspaces:
    // q, k, v, gate and up are views of them) or GEMMs (stacked weights, the GPU: no separate up
    // then); one-token workspaces only: the step's logits [1, vocab].
    Tensor qkv, gate_up, logits;
  };
  // Where a sequence's image-pad rows take their features: span rows [row, row + count) take
  // feature rows [feature_row, feature_row + count).
  struct ImageRun {
    int64_t row, feature_row, count;
  };
  // The images of one sequence: its features (see image_rows) and runs.
  struct ImageRows {
    ImageFeatures features;
    std::vector<ImageRun> runs;
  };
  // Rows [at, at + count) of a pass take rows [feature_row, feature_row + count) of these
  // image features.
  struct PassImage {
    const ImageFeatures* features;
    int64_t at, feature_row, count;
  };
  // One pass through the layers: T rows, the spans (or pieces of spans) of `sequences`
  // sequences one after another, staged in the host vectors below.
  struct Pass {
    int64_t T = 0;
    int64_t sequences = 0;
    int64_t pads = 0;         // the last `pads` sequences pad a graph's bucket (stage_padding)
    int64_t table_width = 0;  // block-table entries per sequence
    int64_t max_queries = 0, max_keys = 0;
    // Every sequence has one row (decode attention; the graphs serve these).
    bool decode = false;
    // Every row's positions agree on all axes (always with one axis; M-RoPE: text), so RoPE at the
    // first axis serves, through the fused qk-norm / RoPE / cache-write kernel.
    bool rope_axes_equal = true;
    std::vector<PassImage> images;
    int64_t logit_rows = 0;  // rows whose logits the pass writes
    bool gather = false;     // they are not the pass's last logit_rows rows
  };
  // The pass being staged on the host, then uploaded into a workspace.
  struct Staging {
    std::vector<int32_t> ids, rows, query_begin, starts, logit_index, fed_from, fed_to;
    std::vector<int32_t> rope;                // [T, axes]: each row's rotary position per axis
    std::vector<Span<const int32_t>> blocks;  // each sequence's blocks
    std::vector<int32_t> host;                // the workspace's inputs as uploaded
    // Empties every list for the next pass, keeping their memory (a step allocates nothing).
    void clear() {
      for (std::vector<int32_t>* v :
           {&ids, &rows, &query_begin, &starts, &logit_index, &fed_from, &fed_to, &rope}) {
        v->clear();
      }
      blocks.clear();
    }
  };

  QwenModel(ModelConfig config, std::shared_ptr<ModelFile> file, const ModelOptions& options,
            int64_t max_context);
  // Checks options, creates the attention ops; weights, the KV pool and workspaces come after.
  static Result<std::unique_ptr<QwenModel>> make(ModelConfig config,
                                                 std::shared_ptr<ModelFile> file,
                                                 const ModelOptions& options);
  // Fills every weight with `fetch(name, shape, out)` (an op::Weight: quantized only for the
  // projection matrices), counting its bytes, then sizes and allocates the KV pool.
  template <typename Fetch>
  Status build_weights(Fetch&& fetch);
  // The number of KV blocks the options ask for (ModelOptions' pool sizing), the pad block not
  // counted.
  Result<int64_t> pool_blocks() const;
  // Stacks each layer's q/k/v and gate/up matrices (see Layer); device models only.
  Status stack_projections();
  Result<Workspace> make_workspace(int64_t tokens) const;
  // The image rows of a sequence carrying image features: the embeddings in the residual dtype,
  // the deepstack features in the activation dtype, on the model's device.
  Result<ImageRows> image_rows(const SequenceInput& sequence) const;
  // Stages rows [t, t + n) of `sequence`'s span (images: `image`) into the pass.
  void stage(const SequenceInput& sequence, const ImageRows* image, int64_t t, int64_t n,
             Pass* pass);
  // Uploads the staged pass into `ws`.
  Status upload(const Workspace& ws, const Pass& pass);
  // Runs a staged decode pass through the graph of its bucket (captured on first use), its
  // logits in graph_logits_; `bucket` rows were staged (the padding included).
  Status run_decode_graph(const Pass& pass, int64_t bucket);
  Status run_layer(Layer& layer, const Workspace& ws, const Pass& pass);
  // Embedding, image rows, every layer and the logits of the pass's logit rows into `logits`,
  // all queued on the device; the pass is already uploaded into ws.
  Status run_forward(const Workspace& ws, const Pass& pass, Tensor logits);
  Status apply_image_rows(const Pass& pass, int64_t layer, Tensor& x) const;
  // The decode graph bucket for `sequences` sequences: the smallest captured size that holds
  // them (1, 2, 4, 8, 16, 32, then multiples of 32), or 0 when no graph serves them.
  int64_t graph_bucket(int64_t sequences) const;
  // Stages `sequences` pad sequences after the pass's own (graph buckets), each one token at
  // position 0 of the pad block; the attention is told where they begin (PagedBatch::live).
  void stage_padding(Pass* pass, int64_t sequences);

  Tensor embed_, final_norm_;
  op::Weight lm_head_;
  std::vector<Layer> layers_;
  std::unique_ptr<VisionEncoder> vision_;  // null for a text-only model
  std::unique_ptr<op::AttentionOp> prefill_attention_, decode_attention_;
  Workspace decode_ws_, batch_ws_;
  int64_t table_width_ = 0;  // block-table entries for the whole context
  int32_t pad_block_ = 0;    // the pool's last block, written and read only by graph padding
  Tensor logits_;        // the rows an eager batch returns
  Tensor graph_logits_;  // the rows of the decode graphs of more than one sequence
  // Decode graphs (ModelOptions::cuda_graph) by bucket; empty until a bucket's first step.
  std::map<int64_t, DeviceGraph> decode_graphs_;
  Staging staging_;
  HostUpload inputs_upload_;  // a pass's inputs into its workspace, not waited for
  int64_t weight_bytes_ = 0;
};

}  // namespace kuiper
