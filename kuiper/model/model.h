// Model: a loaded Qwen-family checkpoint on one device with its KV cache. The runtime drives it
// with forward(); everything device-specific lives below in the op layer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kuiper/model/config.h"
#include "kuiper/model/model_file.h"
#include "kuiper/tensor/tensor.h"

namespace kuiper {

struct ModelOptions {
  DeviceType device = DeviceType::kCpu;
  AttentionKind attention = AttentionKind::kFlash2;
  // Activation (and KV cache) dtype: fp32 on the CPU; fp16 or fp32 on CUDA.
  DataType activation = DataType::kFp32;
  // KV cache length in tokens; 0 means the model's max_position_embeddings.
  int64_t max_context = 4096;
  // Decode steps (one token) run as a CUDA graph captured at the first step and replayed at
  // every later one; the step's token and position are read from device memory. CUDA only.
  bool cuda_graph = false;
  // Prompts longer than this run through the layers this many tokens at a time (the KV cache
  // carries the earlier chunks), so prefill activations stay bounded by the chunk, not the
  // prompt; 0: the whole prompt at once.
  int64_t prefill_chunk = 2048;
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

  // Runs ids at positions [start, start + ids.size()) and stores their keys and values in the
  // cache; earlier positions must already be there. Returns fp32 logits on the model's device:
  // [ids.size(), vocab] when all_logits, else [1, vocab] for the last position. The tensor is
  // the model's own buffer: valid until the next call.
  virtual Result<Tensor> forward(const std::vector<int32_t>& ids, int64_t start,
                                 bool all_logits) = 0;

 protected:
  Model(ModelConfig config, std::shared_ptr<ModelFile> file, const ModelOptions& options,
        int64_t max_context)
      : config_(std::move(config)),
        file_(std::move(file)),
        options_(options),
        max_context_(max_context) {}

  ModelConfig config_;
  std::shared_ptr<ModelFile> file_;
  ModelOptions options_;
  int64_t max_context_;
};

}  // namespace kuiper
