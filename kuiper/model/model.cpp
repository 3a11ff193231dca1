#include "kuiper/model/model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>

#include <glog/logging.h>

#include "kuiper/model/activation_dtype.h"
#include "kuiper/model/qwen_model.h"

namespace kuiper {

namespace {

// `options` with the choices it leaves to the loader made (ModelOptions::auto_*), for weights
// stored as `stored` (none for random weights).
Result<ModelOptions> resolve_options(const ModelOptions& options,
                                     std::optional<DataType> stored) {
  ModelOptions r = options;
  std::optional<DataType> requested;
  if (!options.auto_activation) {
    requested = options.activation;
  } else if (!stored.has_value()) {
    return Status::Error("random weights have no stored dtype to follow: set the activation "
                         "dtype instead of auto");
  }
  KUIPER_ASSIGN_OR_RETURN(r.activation, resolve_activation(requested,
                                                           stored.value_or(options.activation),
                                                           options.device));
  if (options.auto_cuda_graph) r.cuda_graph = options.device == DeviceType::kCuda;
  return r;
}

// "bf16 activations (auto: the checkpoint's dtype)": the dtype chosen and why.
std::string activation_summary(const ModelOptions& o, DataType stored) {
  std::string why;
  if (!o.auto_activation) {
    why = std::string("requested; checkpoint ") + dtype_name(stored);
  } else if (o.device == DeviceType::kCpu) {
    why = "auto: the CPU computes in fp32";
  } else {
    why = "auto: the checkpoint's dtype";
  }
  return std::string(dtype_name(o.activation)) + " activations (" + why + ")";
}

// The load summary logged at --v=1: what was built, how large, how long it took.
std::string load_summary(const std::string& path, const Model& model, DataType stored,
                         int64_t weight_bytes, double seconds) {
  const ModelOptions& o = model.options();
  char sizes[96];
  std::snprintf(sizes, sizeof(sizes), "decoder weights %.1f MiB, loaded in %.2f s",
                static_cast<double>(weight_bytes) / (1 << 20), seconds);
  return path + ": " + device_name(o.device) + ", " + activation_summary(o, stored) + ", " +
         attention_name(o.attention) + " attention, " +
         (o.cuda_graph ? "CUDA graph decode" : "eager decode") + ", max_context " +
         std::to_string(model.max_context()) + ", KV pool " + std::to_string(model.kv_blocks()) +
         " x " + std::to_string(model.kv_block_size()) + " tokens, " + sizes;
}

}  // namespace

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  KUIPER_ASSIGN_OR_RETURN(std::shared_ptr<ModelFile> file, ModelFile::open(path));
  const DataType stored = checkpoint_dtype(*file);
  Result<ModelOptions> resolved = resolve_options(options, stored);
  if (!resolved.ok()) return resolved.status().With(path);
  switch (file->config().arch) {
    case Architecture::kQwen2:
    case Architecture::kQwen3:
    case Architecture::kQwen3VL: {
      KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<QwenModel> model,
                              QwenModel::create(std::move(file), *resolved));
      VLOG(1) << load_summary(
          path, *model, stored, model->weight_bytes(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      return std::unique_ptr<Model>(std::move(model));
    }
    default:
      return Status::Error(path + ": architecture '" + architecture_name(file->config().arch) +
                           "' is not supported by this build");
  }
}

Result<std::unique_ptr<Model>> Model::random(const ModelConfig& config,
                                             const ModelOptions& options, uint64_t seed) {
  KUIPER_ASSIGN_OR_RETURN(ModelOptions resolved, resolve_options(options, std::nullopt));
  switch (config.arch) {
    case Architecture::kQwen2:
    case Architecture::kQwen3: {
      KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<QwenModel> model,
                              QwenModel::create_random(config, resolved, seed));
      return std::unique_ptr<Model>(std::move(model));
    }
    default:
      return Status::Error(std::string("architecture '") + architecture_name(config.arch) +
                           "' has no random-weight model");
  }
}

Result<Tensor> Model::forward(Span<const SequenceInput> batch) {
  KUIPER_RETURN_IF_ERROR(check_batch(batch, nullptr));
  return run_batch(batch, nullptr);
}

Result<Tensor> Model::forward(Span<const SequenceInput> batch, const Tensor& tokens) {
  KUIPER_RETURN_IF_ERROR(check_batch(batch, &tokens));
  return run_batch(batch, &tokens);
}

Result<Tensor> Model::forward(const std::vector<int32_t>& ids, int64_t start, bool all_logits) {
  const std::vector<int32_t> blocks = first_blocks(start + static_cast<int64_t>(ids.size()));
  SequenceInput sequence;
  sequence.tokens = ids;
  sequence.start = start;
  sequence.blocks = blocks;
  sequence.logits = all_logits ? LogitRows::kAll : LogitRows::kLast;
  return forward(Span<const SequenceInput>(&sequence, 1));
}

std::vector<int32_t> Model::first_blocks(int64_t tokens) const {
  const int64_t bs = kv_block_size();
  std::vector<int32_t> blocks(static_cast<size_t>(std::min(kv_blocks(), (tokens + bs - 1) / bs)));
  for (size_t j = 0; j < blocks.size(); ++j) blocks[j] = static_cast<int32_t>(j);
  return blocks;
}

Result<ImageFeatures> Model::encode_images(const ImagePixels&) {
  return Status::Error(std::string("a ") + architecture_name(config_.arch) +
                       " model takes no images");
}

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Whether `t` is [rows, hidden] (the shape of image features for `rows` image-pad tokens).
bool feature_shape(const Tensor& t, int64_t rows, int64_t hidden) {
  return t.defined() && t.ndim() == 2 && t.dim(0) == rows && t.dim(1) == hidden;
}

}  // namespace

Status Model::check_batch(Span<const SequenceInput> batch, const Tensor* tokens) const {
  if (batch.empty()) return Status::Error("forward: the batch is empty");
  if (tokens != nullptr &&
      (tokens->dtype() != DataType::kInt32 || tokens->device() != options_.device ||
       tokens->ndim() != 1)) {
    return Status::Error("forward: the fed tokens " + tokens->describe() +
                         " are not 1-D int32 ids on the " + device_name(options_.device));
  }
  const ModelConfig& c = config_;
  const int64_t block_size = kv_block_size();
  // The blocks each entry writes, when there is more than one entry to collide.
  std::vector<int32_t> written;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& s = batch[i];
    const std::string where =
        batch.size() == 1 ? "forward: " : "forward: sequence " + std::to_string(i) + ": ";
    auto fail = [&where](const std::string& message) { return Status::Error(where + message); };
    const int64_t T = static_cast<int64_t>(s.tokens.size());
    if (T == 0) return fail("no tokens");
    if (s.fed >= 0) {
      if (tokens == nullptr || s.fed >= tokens->numel()) {
        return fail("its last token is row " + str(s.fed) + " of the fed tokens " +
                    (tokens == nullptr ? std::string("(none given)") : tokens->describe()));
      }
      if (c.image_token_id >= 0 && s.tokens[static_cast<size_t>(T - 1)] == c.image_token_id) {
        return fail("a fed token stands in for an image token");
      }
    }
    if (s.start < 0 || s.start + T > max_context_) {
      return fail("positions " + str(s.start) + ".." + str(s.start + T) +
                  " exceed the context of " + str(max_context_) + " tokens");
    }
    const int64_t first_block = s.start / block_size, end_block = (s.start + T - 1) / block_size + 1;
    if (static_cast<int64_t>(s.blocks.size()) < end_block) {
      return fail("the block table holds " + str(static_cast<int64_t>(s.blocks.size())) +
                  " blocks; positions 0.." + str(s.start + T) + " need " + str(end_block) +
                  " of " + str(block_size) + " tokens");
    }
    for (int64_t j = 0; j < end_block; ++j) {
      const int32_t block = s.blocks[static_cast<size_t>(j)];
      if (block < 0 || block >= kv_blocks()) {
        return fail("block id " + str(block) + " is outside the KV pool of " + str(kv_blocks()) +
                    " blocks");
      }
      if (batch.size() > 1 && j >= first_block) written.push_back(block);
    }
    int64_t pads = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t id = s.tokens[static_cast<size_t>(t)];
      if (id < 0 || id >= c.vocab_size) {
        return fail("token id " + str(id) + " is outside the vocabulary (" + str(c.vocab_size) +
                    ")");
      }
      if (c.image_token_id >= 0 && id == c.image_token_id) ++pads;
    }
    if (!c.is_mrope() && !s.rope_positions.empty()) {
      return fail(std::string("3-D positions are for M-RoPE models; a ") +
                  architecture_name(c.arch) + " model rotates at 1-D positions");
    }
    if (s.start + s.rope_offset < 0 ||
        s.start + s.rope_offset + T > std::numeric_limits<int32_t>::max()) {
      return fail("rotary positions " + str(s.start + s.rope_offset) + " + [0, " + str(T) +
                  ") are outside [0, 2^31)");
    }
    if (!s.rope_positions.empty() && static_cast<int64_t>(s.rope_positions.size()) != 3 * T) {
      return fail("3-D positions must be [3, " + str(T) + "] for " + str(T) + " tokens, got " +
                  str(static_cast<int64_t>(s.rope_positions.size())) + " values");
    }
    if (s.image == nullptr) {
      if (pads > 0) {
        return fail("the span holds " + str(pads) + " image tokens (" + str(c.image_token_id) +
                    ") but no image features");
      }
      continue;
    }
    if (c.image_token_id < 0) {
      return fail(std::string("a ") + architecture_name(c.arch) + " model takes no images");
    }
    if (pads > 0 && s.rope_positions.empty()) {
      return fail("a span holding image tokens needs 3-D positions");
    }
    const ImageFeatures& f = *s.image;
    const int64_t rows = f.embeds.defined() && f.embeds.ndim() == 2 ? f.embeds.dim(0) : 0;
    auto shape = [&](const Tensor& t, const std::string& what) -> Status {
      if (feature_shape(t, rows, c.hidden_size)) return Status::Ok();
      return fail(what + " must be [" + str(rows) + ", " + str(c.hidden_size) + "], got " +
                  (t.defined() ? t.describe() : std::string("nothing")));
    };
    KUIPER_RETURN_IF_ERROR(shape(f.embeds, "image embeddings"));
    if (static_cast<int64_t>(f.deepstack.size()) > c.num_layers) {
      return fail("more deepstack features (" + str(static_cast<int64_t>(f.deepstack.size())) +
                  ") than decoder layers (" + str(c.num_layers) + ")");
    }
    for (size_t k = 0; k < f.deepstack.size(); ++k) {
      KUIPER_RETURN_IF_ERROR(shape(f.deepstack[k], "deepstack feature " + std::to_string(k)));
    }
    if (s.image_row < 0 || s.image_row + pads > rows) {
      return fail("the span's " + str(pads) + " image tokens take feature rows " +
                  str(s.image_row) + ".." + str(s.image_row + pads) + " of " + str(rows));
    }
  }
  std::sort(written.begin(), written.end());
  const auto twice = std::adjacent_find(written.begin(), written.end());
  if (twice != written.end()) {
    return Status::Error("forward: KV block " + str(*twice) +
                         " is written by two sequences of the batch");
  }
  return Status::Ok();
}

}  // namespace kuiper
