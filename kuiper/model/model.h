// Model: a loaded Qwen-family checkpoint on one device with its KV cache pool. The runtime drives
// it with forward() over a batch of sequences (kuiper/model/batch.h); everything device-specific
// lives below in the op layer and the backend (base/).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kuiper/model/batch.h"
#include "kuiper/model/config.h"
#include "kuiper/model/images.h"
#include "kuiper/model/model_file.h"
#include "kuiper/model/quantization.h"
#include "kuiper/op/attention_kind.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper {

struct ModelOptions {
  DeviceType device = DeviceType::kCpu;
  AttentionKind attention = AttentionKind::kFlash2;
  // Activation (and KV cache) dtype: fp32 on the CPU; bf16, fp16 or fp32 on CUDA.
  DataType activation = DataType::kFp32;
  // KV cache length of one sequence in tokens; 0 means the model's context_limit() (its
  // max_position_embeddings, more with YaRN).
  int64_t max_context = 4096;
  // Sequences one forward may carry (the decode graphs are captured for up to this many), and
  // the default size of the KV pool: room for this many sequences of max_context tokens.
  int64_t max_sequences = 1;
  // The paged KV pool (see batch.h): blocks of kv_block_size token rows. Its size is
  // kv_cache_bytes when set, else kv_cache_fraction (0 < f <= 1) of the device memory free after
  // the weights and workspaces (CUDA only), else max_sequences * max_context tokens.
  int64_t kv_block_size = 16;
  int64_t kv_cache_bytes = 0;
  double kv_cache_fraction = 0.0;
  // Decode steps (one text token) run as a CUDA graph captured at a sequence block's first step
  // and replayed at every later one; the step's token and position are read from device memory.
  // CUDA only: an error on the CPU.
  bool cuda_graph = false;
  // Prompts longer than this run through the layers this many tokens at a time (the KV cache
  // carries the earlier chunks), so prefill activations stay bounded by the chunk, not the
  // prompt; 0: the whole prompt at once.
  int64_t prefill_chunk = 2048;
  // Choices left to the loader (the programs' defaults, --dtype auto and no --[no-]cuda-graph;
  // off here, so library callers get what they set). With auto_activation, `activation` is
  // ignored and resolve_activation (activation_dtype.h) picks it: the checkpoint's stored dtype
  // on CUDA, fp32 on the CPU; Model::random, with no stored dtype, refuses it. With
  // auto_cuda_graph, `cuda_graph` is ignored and decode runs through the graph wherever the
  // device has one (CUDA). The model's options() hold what was chosen, these flags still set.
  bool auto_activation = false;
  bool auto_cuda_graph = false;
  // Model::random only: quantize the decoder's projections (op::quantize on the model's device)
  // as a converted checkpoint would hold them, so each format's speed is measured without one.
  // Embeddings, norms and (unless quantize.lm_head says) lm_head stay in the activation dtype. A
  // loaded model ignores it: its file says what is quantized.
  QuantizeSpec quantize;
  // FP8 weights multiply x rounded to FP8 (W8A8: op::Weight::fp8_activations, a scale per row and
  // 128 columns), as transformers' FineGrainedFP8 forward, vLLM and SGLang run FP8 checkpoints:
  // faster for many rows (one FP8 tensor-core GEMM), the logits a little further from the
  // dequantized weights' product. Off: that product. An error for a model without FP8 weights.
  bool fp8_activations = false;
};

class Model {
 public:
  virtual ~Model() = default;

  // Opens the model file and builds the model it describes. Unsupported option combinations
  // (for example an attention kind with no kernel for the dtype) are refused here.
  static Result<std::unique_ptr<Model>> load(const std::string& path, const ModelOptions& options);
  // A model of `config` with random weights generated where it runs (benchmarks, tests): no
  // file, no tokenizer. The same seed gives the same weights on every device.
  static Result<std::unique_ptr<Model>> random(const ModelConfig& config,
                                               const ModelOptions& options, uint64_t seed = 1);

  const ModelConfig& config() const { return config_; }
  // The file the model was loaded from; null for a random-weight model.
  const ModelFile* file() const { return file_.get(); }
  const ModelOptions& options() const { return options_; }
  int64_t max_context() const { return max_context_; }

  // The KV pool: kv_blocks() blocks of kv_block_size() token rows (see batch.h).
  int64_t kv_block_size() const { return kv_block_size_; }
  int64_t kv_blocks() const { return kv_blocks_; }
  // The block table 0, 1, 2, ... of a sequence of `tokens` positions that has the pool to itself
  // (tools and tests; no more blocks than the pool has).
  std::vector<int32_t> first_blocks(int64_t tokens) const;

  // Runs a batch of sequences (see batch.h for what an entry means and what the caller
  // guarantees). Every entry is checked before anything runs: token ids in the vocabulary,
  // positions within the context, block ids in the pool and no block written twice, the shape of
  // 3-D positions, image features for every image-pad token and rows for each; an invalid entry is
  // an error naming it and nothing is written. Returns fp32 logits on the model's device, one row
  // per requested row ([sum of the entries' rows, vocab]), entries in batch order and each
  // entry's rows in token order. The tensor is the model's own buffer: valid until the next call.
  Result<Tensor> forward(Span<const SequenceInput> batch);
  // The same where entries take their last token from `tokens` (SequenceInput::fed): int32 on
  // the model's device, each fed row within it.
  Result<Tensor> forward(Span<const SequenceInput> batch, const Tensor& tokens);
  // One sequence in KV blocks 0, 1, 2, ... at 1-D positions [start, start + ids.size()): the
  // last row's logits [1, vocab], or every row's when all_logits.
  Result<Tensor> forward(const std::vector<int32_t>& ids, int64_t start, bool all_logits);

  // The vision tower (vision-language models): the features of `images`, on the model's device
  // in its activation dtype. An error for a model without a vision tower.
  virtual Result<ImageFeatures> encode_images(const ImagePixels& images);

 protected:
  Model(ModelConfig config, std::shared_ptr<ModelFile> file, const ModelOptions& options,
        int64_t max_context)
      : config_(std::move(config)),
        file_(std::move(file)),
        options_(options),
        max_context_(max_context),
        kv_block_size_(options.kv_block_size),
        kv_blocks_(0) {}

  // forward() after the batch passed check_batch(); `tokens`, when not null, the device's ids
  // the entries' fed rows name (forward(batch, tokens)).
  virtual Result<Tensor> run_batch(Span<const SequenceInput> batch, const Tensor* tokens) = 0;
  // `tokens`: forward(batch, tokens)'s, null for forward(batch) (where no entry may be fed).
  Status check_batch(Span<const SequenceInput> batch, const Tensor* tokens) const;

  ModelConfig config_;
  std::shared_ptr<ModelFile> file_;
  ModelOptions options_;
  int64_t max_context_;
  // Set by the subclass once it has sized its pool.
  int64_t kv_block_size_;
  int64_t kv_blocks_;
};

}  // namespace kuiper
