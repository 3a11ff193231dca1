#include "kuiper/model/qwen_model.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <utility>

#include "kuiper/base/allocator.h"
#include "kuiper/op/ops.h"

namespace kuiper {

DataType residual_dtype(DataType activation) {
  return activation == DataType::kFp16 ? DataType::kFp32 : activation;
}

QwenModel::QwenModel(ModelConfig config, std::shared_ptr<ModelFile> file,
                     const ModelOptions& options, int64_t max_context)
    : Model(std::move(config), std::move(file), options, max_context) {}

QwenModel::~QwenModel() = default;

Result<std::unique_ptr<QwenModel>> QwenModel::make(ModelConfig config,
                                                   std::shared_ptr<ModelFile> file,
                                                   const ModelOptions& options) {
  KUIPER_RETURN_IF_ERROR(config.validate());
  if (options.device == DeviceType::kCpu && options.activation != DataType::kFp32) {
    return Status::Error(std::string("the CPU backend computes in fp32, not ") +
                         dtype_name(options.activation));
  }
  if (options.activation != DataType::kFp32 && options.activation != DataType::kFp16 &&
      options.activation != DataType::kBf16) {
    return Status::Error(std::string("activations must be fp32, fp16 or bf16, not ") +
                         dtype_name(options.activation));
  }
  if (options.cuda_graph && options.device != DeviceType::kCuda) {
    return Status::Error(std::string("CUDA graph decode needs the cuda device, not ") +
                         device_name(options.device));
  }
  if (options.max_sequences < 1) {
    return Status::Error("max_sequences must be at least 1, not " +
                         std::to_string(options.max_sequences));
  }
  const int64_t max_context =
      options.max_context > 0 ? options.max_context : config.context_limit();
  std::unique_ptr<QwenModel> model(
      new QwenModel(std::move(config), std::move(file), options, max_context));
  const ModelConfig& c = model->config_;

  op::AttentionRequest request;
  request.kind = options.attention;
  request.dtype = options.activation;
  request.device = options.device;
  request.head_dim = c.head_dim;
  request.phase = op::AttentionPhase::kPrefill;
  KUIPER_ASSIGN_OR_RETURN(model->prefill_attention_, op::make_attention(request));
  request.phase = op::AttentionPhase::kDecode;
  request.device_position = options.cuda_graph;
  Result<std::unique_ptr<op::AttentionOp>> decode = op::make_attention(request);
  if (!decode.ok()) {
    return options.cuda_graph ? decode.status().With("CUDA graph decode") : decode.status();
  }
  model->decode_attention_ = std::move(decode).value();
  if (options.kv_block_size < 1) {
    return Status::Error("the KV block size must be at least 1, not " +
                         std::to_string(options.kv_block_size));
  }
  const int64_t bs = options.kv_block_size;
  model->table_width_ = (max_context + bs - 1) / bs;
  KUIPER_ASSIGN_OR_RETURN(model->decode_ws_, model->make_workspace(1));
  const int64_t largest_bucket = model->graph_bucket(options.max_sequences);
  KUIPER_ASSIGN_OR_RETURN(
      model->batch_ws_,
      model->make_workspace(std::max({options.prefill_chunk, options.max_sequences,
                                      largest_bucket, int64_t{2}})));
  KUIPER_ASSIGN_OR_RETURN(model->logits_,
                          Tensor::empty({1, c.vocab_size}, DataType::kFp32, options.device));
  if (options.cuda_graph && largest_bucket > 1) {
    KUIPER_ASSIGN_OR_RETURN(model->graph_logits_, Tensor::empty({largest_bucket, c.vocab_size},
                                                                DataType::kFp32, options.device));
  }
  return model;
}

namespace {

// A weight ready for the device: CPU tensors view the mapped file in place; on a GPU, matrices
// are converted to the activation dtype (cuBLAS multiplies like types) and uploaded.
Result<Tensor> place(const Tensor& host, DeviceType device, DataType matrix_dtype) {
  if (device == DeviceType::kCpu) return host;
  Tensor src = host;
  if (host.ndim() == 2 && host.dtype() != matrix_dtype) {
    KUIPER_ASSIGN_OR_RETURN(src, Tensor::empty(host.shape(), matrix_dtype));
    KUIPER_RETURN_IF_ERROR(convert_elements(host.raw(), host.dtype(), src.raw(), matrix_dtype,
                                            static_cast<size_t>(host.numel())));
  }
  return src.to(device);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<std::unique_ptr<QwenModel>> QwenModel::create(std::shared_ptr<ModelFile> file,
                                                     const ModelOptions& options) {
  ModelConfig config = file->config();
  const std::string path = file->path();
  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<QwenModel> model,
                          make(std::move(config), std::move(file), options));
  const ModelFile& f = *model->file_;
  const DeviceType dev = options.device;
  const DataType act = options.activation;
  auto get = [&](const std::string& name, const std::vector<int64_t>&, op::Weight& out) -> Status {
    KUIPER_ASSIGN_OR_RETURN(op::Weight host, f.weight(name));
    if (host.quantized()) {  // the packed form runs as stored, on the CPU in place
      KUIPER_ASSIGN_OR_RETURN(out, host.to(dev));
      return Status::Ok();
    }
    KUIPER_ASSIGN_OR_RETURN(out, place(host.values, dev, act));
    return Status::Ok();
  };
  KUIPER_RETURN_IF_ERROR(model->build_weights(get).With(path));
  if (model->config_.vision.has_value()) {
    // The vision tower reads its weights from the same mapped file (the model file checked them).
    Result<std::unique_ptr<VisionEncoder>> vision = VisionEncoder::create(
        *model->config_.vision,
        [file = model->file_](const std::string& name) { return file->tensor(name); }, dev, act);
    if (!vision.ok()) return vision.status().With(path + ": vision tower");
    model->vision_ = std::move(vision).value();
  }
  return model;
}

Result<std::unique_ptr<QwenModel>> QwenModel::create_random(const ModelConfig& config,
                                                            const ModelOptions& options,
                                                            uint64_t seed) {
  if (options.quantize.lm_head_quantized() && config.tie_word_embeddings) {
    return Status::Error("lm_head is tied to the embeddings (tie_word_embeddings), so it stays "
                         "as stored; leave lm_head unquantized");
  }
  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<QwenModel> model, make(config, nullptr, options));
  // Every weight in the activation dtype, as place() leaves matrices of a loaded model. Scales
  // keep activations O(1) through the layers: uniform(-s, s) has variance s^2/3, so matrices use
  // s = sqrt(3 / fan_in); norm weights sit near 1.
  uint64_t index = 0;
  const std::vector<std::string> quantizable = quantizable_tensors(config);
  auto get = [&](const std::string& name, const std::vector<int64_t>& shape,
                 op::Weight& out) -> Status {
    KUIPER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(shape, options.activation, options.device));
    float scale = 0.1f, offset = 0.0f;
    if (ends_with(name, "norm.weight")) {
      offset = 1.0f;
    } else if (ends_with(name, "embed_tokens.weight")) {
      scale = 1.0f;
    } else if (shape.size() == 2) {
      scale = std::sqrt(3.0f / static_cast<float>(shape[1]));
    }
    KUIPER_RETURN_IF_ERROR(op::fill_random(t, seed * 1000003u + index++, scale, offset).With(name));
    const QuantizeSpec as = name == "lm_head.weight"
                                ? options.quantize.for_lm_head()
                                : QuantizeSpec{options.quantize.format, options.quantize.block};
    const bool quantize = as.quantized() && std::find(quantizable.begin(), quantizable.end(),
                                                      name) != quantizable.end();
    if (!quantize) {
      out = std::move(t);
      return Status::Ok();
    }
    Result<op::Weight> q = quantize_matrix(t, as);
    if (!q.ok()) return q.status().With(name);
    out = std::move(q).value();
    return Status::Ok();
  };
  KUIPER_RETURN_IF_ERROR(model->build_weights(get).With("random weights"));
  return model;
}

template <typename Fetch>
Status QwenModel::build_weights(Fetch&& fetch) {
  bool any_fp8 = false;
  auto get_weight = [&](const std::string& name, const std::vector<int64_t>& shape,
                        op::Weight& out) -> Status {
    KUIPER_RETURN_IF_ERROR(fetch(name, shape, out));
    weight_bytes_ += static_cast<int64_t>(out.nbytes());
    if (options_.fp8_activations && out.format == op::WeightFormat::kFp8) {
      any_fp8 = true;
      out.fp8_activations = true;
      KUIPER_RETURN_IF_ERROR(op::check_weight(out).With(name));
    }
    return Status::Ok();
  };
  auto get = [&](const std::string& name, const std::vector<int64_t>& shape, Tensor& out) {
    op::Weight w;
    KUIPER_RETURN_IF_ERROR(get_weight(name, shape, w));
    out = std::move(w.values);  // not a projection: plain (the model file checked it)
    return Status::Ok();
  };
  const ModelConfig& c = config_;
  const DeviceType dev = options_.device;
  const DataType act = options_.activation;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::string text = c.text_prefix();  // "model." ("model.language_model." for Qwen3-VL)
  KUIPER_RETURN_IF_ERROR(get(text + "embed_tokens.weight", {c.vocab_size, H}, embed_));
  KUIPER_RETURN_IF_ERROR(get(text + "norm.weight", {H}, final_norm_));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    KUIPER_RETURN_IF_ERROR(get_weight("lm_head.weight", {c.vocab_size, H}, lm_head_));
  }
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = text + "layers." + std::to_string(l) + ".";
    KUIPER_RETURN_IF_ERROR(get(p + "input_layernorm.weight", {H}, L.input_norm));
    KUIPER_RETURN_IF_ERROR(get_weight(p + "self_attn.q_proj.weight", {c.q_dim(), H}, L.q_proj));
    KUIPER_RETURN_IF_ERROR(get_weight(p + "self_attn.k_proj.weight", {c.kv_dim(), H}, L.k_proj));
    KUIPER_RETURN_IF_ERROR(get_weight(p + "self_attn.v_proj.weight", {c.kv_dim(), H}, L.v_proj));
    if (c.qkv_bias) {
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.q_proj.bias", {c.q_dim()}, L.q_bias));
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.k_proj.bias", {c.kv_dim()}, L.k_bias));
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.v_proj.bias", {c.kv_dim()}, L.v_bias));
    }
    if (c.qk_norm) {
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.q_norm.weight", {c.head_dim}, L.q_norm));
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.k_norm.weight", {c.head_dim}, L.k_norm));
    }
    KUIPER_RETURN_IF_ERROR(get_weight(p + "self_attn.o_proj.weight", {H, c.q_dim()}, L.o_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "post_attention_layernorm.weight", {H}, L.post_norm));
    KUIPER_RETURN_IF_ERROR(get_weight(p + "mlp.gate_proj.weight", {I, H}, L.gate_proj));
    KUIPER_RETURN_IF_ERROR(get_weight(p + "mlp.up_proj.weight", {I, H}, L.up_proj));
    KUIPER_RETURN_IF_ERROR(get_weight(p + "mlp.down_proj.weight", {H, I}, L.down_proj));
  }
  if (options_.fp8_activations && !any_fp8) {
    return Status::Error("FP8 activations were asked for, but the model has no FP8 weights");
  }
  if (dev != DeviceType::kCpu) KUIPER_RETURN_IF_ERROR(stack_projections());
  // The KV pool last, so that a pool sized from free memory sees the weights in place; one
  // block more than the runtime gets, the pad block the decode graphs' padding writes.
  KUIPER_ASSIGN_OR_RETURN(kv_blocks_, pool_blocks());
  pad_block_ = static_cast<int32_t>(kv_blocks_);
  const int64_t pool_rows = (kv_blocks_ + 1) * kv_block_size();
  for (Layer& L : layers_) {
    KUIPER_ASSIGN_OR_RETURN(L.k_cache, Tensor::empty({pool_rows, c.kv_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(L.v_cache, Tensor::empty({pool_rows, c.kv_dim()}, act, dev));
  }
  return Status::Ok();
}

Result<int64_t> QwenModel::pool_blocks() const {
  const ModelConfig& c = config_;
  const ModelOptions& o = options_;
  const int64_t bs = kv_block_size();
  const int64_t token_bytes =
      c.num_layers * 2 * c.kv_dim() * static_cast<int64_t>(dtype_size(o.activation));
  // By default whole contexts: max_sequences of them, each rounded up to whole blocks.
  int64_t tokens = o.max_sequences * ((max_context_ + bs - 1) / bs) * bs;
  if (o.kv_cache_bytes < 0) {
    return Status::Error("the KV cache size must be positive, not " +
                         std::to_string(o.kv_cache_bytes) + " bytes");
  }
  if (o.kv_cache_bytes > 0) {
    tokens = o.kv_cache_bytes / token_bytes;
  } else if (o.kv_cache_fraction != 0.0) {
    if (!(o.kv_cache_fraction > 0.0 && o.kv_cache_fraction <= 1.0)) {
      return Status::Error("the KV cache fraction must be in (0, 1], not " +
                           std::to_string(o.kv_cache_fraction));
    }
    KUIPER_ASSIGN_OR_RETURN(Allocator * allocator, allocator_for(o.device));
    Result<size_t> free = allocator->free_bytes();
    if (!free.ok()) return free.status().With("a KV cache given as a fraction of free memory");
    tokens = static_cast<int64_t>(static_cast<double>(*free) * o.kv_cache_fraction) / token_bytes;
  }
  const int64_t blocks = tokens / bs;
  if (blocks < 1) {
    return Status::Error("the KV cache holds " + std::to_string(tokens) +
                         " tokens, less than one block of " + std::to_string(bs) + " (" +
                         std::to_string(token_bytes) + " bytes a token)");
  }
  // The kernels index pool rows with 32-bit integers.
  if ((blocks + 1) * bs > (int64_t{1} << 30)) {
    return Status::Error("the KV cache of " + std::to_string(tokens) +
                         " tokens exceeds the 2^30 rows the kernels index");
  }
  return blocks;
}

namespace {

// One tensor holding `parts` one after another along dimension 0; each part is then replaced by
// its row view of the stack, so the separate copies are freed.
Result<Tensor> stack_rows(const std::vector<Tensor*>& parts) {
  std::vector<int64_t> shape = parts.front()->shape();
  shape[0] = 0;
  for (const Tensor* p : parts) shape[0] += p->dim(0);
  const Tensor& first = *parts.front();
  KUIPER_ASSIGN_OR_RETURN(Tensor stack, Tensor::empty(shape, first.dtype(), first.device()));
  int64_t row = 0;
  for (Tensor* p : parts) {
    Tensor view = stack.rows(row, p->dim(0));
    KUIPER_RETURN_IF_ERROR(view.copy_from(*p));
    *p = view;
    row += view.dim(0);
  }
  return stack;
}

// Columns [begin, begin + count) of a one-row tensor [1, N], as a [1, count] view.
Result<Tensor> row_slice(const Tensor& one_row, int64_t begin, int64_t count) {
  KUIPER_ASSIGN_OR_RETURN(Tensor flat, one_row.reshape({one_row.numel()}));
  return flat.rows(begin, count).reshape({1, count});
}

// stack_rows for matrices: a quantized one stacks its values, scales and zeros alike, each part
// left a row view (Weight::rows) of the stack. Quantized parts whose scale blocks would straddle
// a boundary (every part but the last must be whole blocks of rows), or that differ in format
// or block, stay apart: the result is undefined and the layer multiplies them separately.
Result<op::Weight> stack_weights(std::initializer_list<op::Weight*> parts) {
  const op::Weight& first = **parts.begin();
  size_t i = 0;
  for (const op::Weight* p : parts) {
    const bool last = ++i == parts.size();
    if (p->format != first.format || p->block_rows != first.block_rows ||
        p->block_cols != first.block_cols || (!last && p->rows() % p->block_rows != 0)) {
      return op::Weight();
    }
  }
  op::Weight stack = first;
  std::vector<Tensor*> values, scales, zeros;
  for (op::Weight* p : parts) {
    values.push_back(&p->values);
    scales.push_back(&p->scales);
    zeros.push_back(&p->zeros);
  }
  KUIPER_ASSIGN_OR_RETURN(stack.values, stack_rows(values));
  if (first.scales.defined()) {
    KUIPER_ASSIGN_OR_RETURN(stack.scales, stack_rows(scales));
  }
  if (first.zeros.defined()) {
    KUIPER_ASSIGN_OR_RETURN(stack.zeros, stack_rows(zeros));
  }
  return stack;
}

}  // namespace

Status QwenModel::stack_projections() {
  for (Layer& L : layers_) {
    KUIPER_ASSIGN_OR_RETURN(L.qkv_proj, stack_weights({&L.q_proj, &L.k_proj, &L.v_proj}));
    if (config_.qkv_bias) {
      KUIPER_ASSIGN_OR_RETURN(L.qkv_bias, stack_rows({&L.q_bias, &L.k_bias, &L.v_bias}));
    }
    KUIPER_ASSIGN_OR_RETURN(L.gate_up_proj, stack_weights({&L.gate_proj, &L.up_proj}));
  }
  // int8 / int4 projections go in the GEMV's tiled byte order (weight.h; a warp load reads 512
  // contiguous bytes; H100, Qwen2.5-7B int4 batch-1 decode 381-388 -> 387-394 tok/s, Qwen3-8B
  // 317-323 -> 326-328, docs/PERFORMANCE.md). A stack is tiled with its parts (row views of it)
  // when each part holds whole groups of 8 rows; a part not stacked, alone. op::tile leaves
  // the CPU's and other formats' weights as they are.
  auto tile_stack = [](op::Weight& stack, std::initializer_list<op::Weight*> parts) -> Status {
    if (!stack.defined()) {
      for (op::Weight* p : parts) KUIPER_RETURN_IF_ERROR(op::tile(*p).status());
      return Status::Ok();
    }
    for (op::Weight* p : parts) {
      if (p->rows() % 8 != 0) return Status::Ok();
    }
    KUIPER_ASSIGN_OR_RETURN(const bool tiled, op::tile(stack));
    for (op::Weight* p : parts) p->tiled = tiled;
    return Status::Ok();
  };
  for (Layer& L : layers_) {
    KUIPER_RETURN_IF_ERROR(tile_stack(L.qkv_proj, {&L.q_proj, &L.k_proj, &L.v_proj}));
    KUIPER_RETURN_IF_ERROR(tile_stack(L.gate_up_proj, {&L.gate_proj, &L.up_proj}));
    KUIPER_RETURN_IF_ERROR(tile_stack(L.o_proj, {}));
    KUIPER_RETURN_IF_ERROR(tile_stack(L.down_proj, {}));
  }
  KUIPER_RETURN_IF_ERROR(tile_stack(lm_head_, {}));
  // The separate copies went back to the device allocator, in sizes nothing else asks for (an 8B
  // model: 240 MB a layer, 8.4 GB in all): give them back.
  KUIPER_ASSIGN_OR_RETURN(Allocator * allocator, allocator_for(options_.device));
  allocator->release_cached();
  return Status::Ok();
}

Result<QwenModel::Workspace> QwenModel::make_workspace(int64_t cap) const {
  const ModelConfig& c = config_;
  const DeviceType dev = options_.device;
  const DataType act = options_.activation;
  Workspace w;
  w.capacity = cap;
  // The pass's int32 inputs share one buffer, so that a pass uploads them in one copy (a decode
  // step of one sequence: about a kilobyte); the block tables come last, so a pass copies only
  // the rows it uses.
  const int64_t rope_axes = c.is_mrope() ? 3 : 1;
  const int64_t sizes[] = {cap, cap, rope_axes * cap, cap + 1, cap, 1, cap, cap, cap,
                           cap * table_width_};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  KUIPER_ASSIGN_OR_RETURN(w.inputs, Tensor::empty({total}, DataType::kInt32, dev));
  Workspace::Offsets& o = w.offsets;
  const std::pair<Tensor*, int64_t*> parts[] = {
      {&w.ids, &o.ids},         {&w.positions, &o.positions},     {&w.rope_positions, &o.rope},
      {&w.query_begin, &o.query_begin}, {&w.starts, &o.starts},       {&w.live, &o.live},
      {&w.logit_index, &o.logit_index}, {&w.fed_from, &o.fed_from},
      {&w.fed_to, &o.fed_to},           {&w.block_tables, &o.block_tables}};
  int64_t at = 0;
  for (size_t i = 0; i < std::size(parts); ++i) {
    *parts[i].first = w.inputs.rows(at, sizes[i]);
    *parts[i].second = at;
    at += sizes[i];
  }
  KUIPER_ASSIGN_OR_RETURN(w.picked, Tensor::empty({cap, c.hidden_size}, residual_dtype(act), dev));
  KUIPER_ASSIGN_OR_RETURN(w.x, Tensor::empty({cap, c.hidden_size}, residual_dtype(act), dev));
  KUIPER_ASSIGN_OR_RETURN(w.h, Tensor::empty({cap, c.hidden_size}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(w.o, Tensor::empty({cap, c.hidden_size}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(w.attn, Tensor::empty({cap, c.q_dim()}, act, dev));
  const int64_t I = c.intermediate_size;
  if (cap == 1) {
    KUIPER_ASSIGN_OR_RETURN(w.qkv, Tensor::empty({1, c.q_dim() + 2 * c.kv_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(w.q, row_slice(w.qkv, 0, c.q_dim()));
    KUIPER_ASSIGN_OR_RETURN(w.k, row_slice(w.qkv, c.q_dim(), c.kv_dim()));
    KUIPER_ASSIGN_OR_RETURN(w.v, row_slice(w.qkv, c.q_dim() + c.kv_dim(), c.kv_dim()));
    KUIPER_ASSIGN_OR_RETURN(w.gate_up, Tensor::empty({1, 2 * I}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(w.gate, row_slice(w.gate_up, 0, I));
    KUIPER_ASSIGN_OR_RETURN(w.up, row_slice(w.gate_up, I, I));
    KUIPER_ASSIGN_OR_RETURN(w.logits, Tensor::empty({1, c.vocab_size}, DataType::kFp32, dev));
  } else {
    KUIPER_ASSIGN_OR_RETURN(w.q, Tensor::empty({cap, c.q_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(w.k, Tensor::empty({cap, c.kv_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(w.v, Tensor::empty({cap, c.kv_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(w.gate, Tensor::empty({cap, I}, act, dev));
    // The stacked GEMMs' outputs where the weights are stacked (the GPU: stack_projections; the
    // workspaces are made before the weights load, so the device says it, not the layers).
    if (dev != DeviceType::kCpu) {
      KUIPER_ASSIGN_OR_RETURN(w.qkv, Tensor::empty({cap, c.q_dim() + 2 * c.kv_dim()}, act, dev));
      KUIPER_ASSIGN_OR_RETURN(w.gate_up, Tensor::empty({cap, 2 * I}, act, dev));
    } else {
      KUIPER_ASSIGN_OR_RETURN(w.up, Tensor::empty({cap, I}, act, dev));
    }
  }
  return w;
}

Status QwenModel::run_layer(Layer& L, const Workspace& ws, const Pass& pass) {
  const ModelConfig& c = config_;
  const int64_t T = pass.T;
  const double eps = c.rms_norm_eps;
  Tensor x = ws.x.rows(0, T), h = ws.h.rows(0, T);
  Tensor q = ws.q.rows(0, T), k = ws.k.rows(0, T), v = ws.v.rows(0, T);
  Tensor attn = ws.attn.rows(0, T), gate = ws.gate.rows(0, T);
  Tensor positions = ws.positions.rows(0, T);  // the rows' places in the pool

  // The GPU reads the stacked matrices (see Layer). One token (the one-token workspace) through
  // op::linear's fused forms: the RMSNorms ride in the GEMVs that follow them, SwiGLU in the
  // gate/up GEMV and the residual adds in the o and down GEMVs. More rows keep the norms apart
  // (but for two rows, below) and run one product per stack (2 to 8 rows the multi-row GEMVs, more
  // cuBLAS; the weights read once for every row of the pass, and one q|k|v GEMM fills the GPU
  // where k and v alone, 1024 columns, leave most of it idle), the q/k/v split riding in the
  // attention-input kernel and the gate/up split in SwiGLU (or, for 2 to 8 rows, in the gate/up
  // product's epilogue). The CPU
  // keeps separate matrices, and Qwen3-VL's M-RoPE separate q, k and v; so do quantized parts
  // whose scale blocks straddle them, each stack on its own.
  const bool one_token = ws.capacity == 1;
  const bool stacked_qkv = L.qkv_proj.defined() && !one_token && pass.rope_axes_equal;
  // 2 to 8 rows (as many sequences decoding) take fused forms too where one kernel runs them
  // (op::linear_fuses: plain 16-bit weights; gemv_rows.cuh at two rows, gemv_rows_mma.cuh at 3 to
  // 8): the residual adds and SwiGLU, and at two rows the RMSNorms (at 3 to 8 the RMSNorm kernels
  // measured faster than staging x's fp32 rows normalised in every block; docs/PERFORMANCE.md).
  const bool fused_rows = stacked_qkv && T >= 2 && T <= 8 && L.gate_up_proj.defined() &&
                          ws.qkv.dtype() == L.qkv_proj.values.dtype() &&
                          op::linear_fuses(T, c.hidden_size, L.qkv_proj) &&
                          op::linear_fuses(T, c.hidden_size, L.gate_up_proj);
  const bool fold_norms = one_token || (fused_rows && T == 2);
  if (L.qkv_proj.defined() && fold_norms) {
    op::LinearOptions qkv;
    qkv.norm = &L.input_norm;
    qkv.eps = eps;
    qkv.bias = c.qkv_bias ? &L.qkv_bias : nullptr;
    Tensor out = ws.qkv.rows(0, T);
    KUIPER_RETURN_IF_ERROR(op::linear(x, L.qkv_proj, qkv, out));
  } else if (stacked_qkv) {
    KUIPER_RETURN_IF_ERROR(op::rmsnorm(x, L.input_norm, eps, h));
    Tensor qkv = ws.qkv.rows(0, T);
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.qkv_proj, c.qkv_bias ? &L.qkv_bias : nullptr, qkv));
  } else {
    KUIPER_RETURN_IF_ERROR(op::rmsnorm(x, L.input_norm, eps, h));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.q_proj, c.qkv_bias ? &L.q_bias : nullptr, q));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.k_proj, c.qkv_bias ? &L.k_bias : nullptr, k));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.v_proj, c.qkv_bias ? &L.v_bias : nullptr, v));
  }
  KUIPER_ASSIGN_OR_RETURN(Tensor q_heads, q.reshape({T, c.num_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(Tensor k_heads, k.reshape({T, c.num_kv_heads, c.head_dim}));
  // A decode pass hands the stacked q|k|v to the attention op, which prepares it (q/k norms,
  // RoPE, the cache write) inside its kernel where it can (op::AttentionInput).
  // One token (the one-token workspace) likewise: its q, k and v are views of the q|k|v product
  // (where the attention composes instead, op::qk_norm_rope_cache writes q over qkv's q heads,
  // each warp reading its head before writing it, as it did k in place before).
  // On the H100 (batch 1, graph) that took Qwen2.5-7B int4 from 382-385 to 398-400 tok/s, FP8
  // 261 to 271, bf16 178 to 181-182 (docs/PERFORMANCE.md).
  op::AttentionInput input;
  const bool qkv_input =
      stacked_qkv || (one_token && L.qkv_proj.defined() && pass.rope_axes_equal);
  if (qkv_input) {
    Tensor rotary = ws.rope_positions.rows(0, T);  // axis 0 of the [axes, T] positions
    KUIPER_ASSIGN_OR_RETURN(
        Tensor qkv_heads,
        ws.qkv.rows(0, T).reshape({T, c.num_heads + 2 * c.num_kv_heads, c.head_dim}));
    if (pass.decode) {
      input.qkv = qkv_heads;
      input.q_norm = c.qk_norm ? &L.q_norm : nullptr;
      input.k_norm = c.qk_norm ? &L.k_norm : nullptr;
      input.eps = eps;
      input.positions = positions;
      input.rope_positions = rotary;
      input.rope = c.rope();
    } else {
      KUIPER_RETURN_IF_ERROR(op::qk_norm_rope_cache(
          qkv_heads, q_heads, c.qk_norm ? &L.q_norm : nullptr, c.qk_norm ? &L.k_norm : nullptr,
          eps, positions, c.rope(), L.k_cache, L.v_cache, &rotary));
    }
  } else if (pass.rope_axes_equal) {  // RoPE (Qwen3-VL text: M-RoPE at (p, p, p) is RoPE at p)
    Tensor rotary = ws.rope_positions.rows(0, T);  // axis 0 of the [axes, T] positions
    KUIPER_RETURN_IF_ERROR(op::qk_norm_rope_cache(
        q_heads, k_heads, v, c.qk_norm ? &L.q_norm : nullptr, c.qk_norm ? &L.k_norm : nullptr, eps,
        positions, c.rope(), L.k_cache, L.v_cache, &rotary));
  } else {  // Qwen3-VL: the rotary positions are [3, T], apart from the cache rows
    KUIPER_ASSIGN_OR_RETURN(Tensor rope3, ws.rope_positions.rows(0, 3 * T).reshape({3, T}));
    if (c.qk_norm) {
      KUIPER_RETURN_IF_ERROR(op::rmsnorm(q_heads, L.q_norm, eps, q_heads));
      KUIPER_RETURN_IF_ERROR(op::rmsnorm(k_heads, L.k_norm, eps, k_heads));
    }
    KUIPER_RETURN_IF_ERROR(op::mrope(q_heads, rope3, c.rope(), c.mrope_section));
    KUIPER_RETURN_IF_ERROR(op::mrope(k_heads, rope3, c.rope(), c.mrope_section));
    KUIPER_RETURN_IF_ERROR(op::kv_write(k, L.k_cache, positions));
    KUIPER_RETURN_IF_ERROR(op::kv_write(v, L.v_cache, positions));
  }

  op::AttentionArgs args;
  args.q = q_heads;
  const int64_t pool_rows = L.k_cache.dim(0);
  KUIPER_ASSIGN_OR_RETURN(args.k_cache, L.k_cache.reshape({pool_rows, c.num_kv_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(args.v_cache, L.v_cache.reshape({pool_rows, c.num_kv_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(args.out, attn.reshape({T, c.num_heads, c.head_dim}));
  op::PagedBatch& batch = args.paged;
  const int64_t S = pass.sequences, W = pass.table_width;
  batch.query_begin = ws.query_begin.rows(0, S + 1);
  batch.starts = ws.starts.rows(0, S);
  batch.live = ws.live;
  KUIPER_ASSIGN_OR_RETURN(batch.block_tables, ws.block_tables.rows(0, S * W).reshape({S, W}));
  batch.block_size = kv_block_size();
  batch.max_queries = pass.max_queries;
  batch.max_keys = pass.max_keys;
  args.input = input;
  op::AttentionOp& attention = pass.decode ? *decode_attention_ : *prefill_attention_;
  KUIPER_RETURN_IF_ERROR(attention.forward(args));

  op::LinearOptions residual;
  residual.residual = true;
  KUIPER_RETURN_IF_ERROR(op::linear(attn, L.o_proj, residual, x));
  if (L.gate_up_proj.defined() && fold_norms) {
    op::LinearOptions mlp;
    mlp.norm = &L.post_norm;
    mlp.eps = eps;
    mlp.swiglu = true;
    KUIPER_RETURN_IF_ERROR(op::linear(x, L.gate_up_proj, mlp, gate));
  } else if (fused_rows) {
    KUIPER_RETURN_IF_ERROR(op::rmsnorm(x, L.post_norm, eps, h));
    op::LinearOptions mlp;
    mlp.swiglu = true;
    KUIPER_RETURN_IF_ERROR(op::linear(h, L.gate_up_proj, mlp, gate));
  } else if (L.gate_up_proj.defined()) {
    KUIPER_RETURN_IF_ERROR(op::rmsnorm(x, L.post_norm, eps, h));
    Tensor gate_up = ws.gate_up.rows(0, T);
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.gate_up_proj, nullptr, gate_up));
    KUIPER_RETURN_IF_ERROR(op::swiglu(gate_up, gate));
  } else {
    KUIPER_RETURN_IF_ERROR(op::rmsnorm(x, L.post_norm, eps, h));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.gate_proj, nullptr, gate));
    // A GPU workspace has no separate up (the stacked GEMM's gate_up serves): its first T * I
    // elements do.
    Tensor up = ws.up.defined() ? ws.up.rows(0, T) : Tensor();
    if (!up.defined()) {
      const int64_t I = c.intermediate_size;
      KUIPER_ASSIGN_OR_RETURN(Tensor flat, ws.gate_up.reshape({ws.gate_up.numel()}));
      KUIPER_ASSIGN_OR_RETURN(up, flat.rows(0, T * I).reshape({T, I}));
    }
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.up_proj, nullptr, up));
    KUIPER_RETURN_IF_ERROR(op::swiglu(gate, up, gate));
  }
  return op::linear(gate, L.down_proj, residual, x);
}

Status QwenModel::apply_image_rows(const Pass& pass, int64_t layer, Tensor& x) const {
  // The image embeddings replace the pad rows' token embeddings (layer -1); deepstack feature k
  // is added after layer k.
  for (const PassImage& image : pass.images) {
    const ImageFeatures& f = *image.features;
    if (layer >= static_cast<int64_t>(f.deepstack.size())) continue;
    Tensor dst = x.rows(image.at, image.count);
    if (layer < 0) {
      KUIPER_RETURN_IF_ERROR(dst.copy_from(f.embeds.rows(image.feature_row, image.count)));
    } else {
      KUIPER_RETURN_IF_ERROR(op::add(
          dst, f.deepstack[static_cast<size_t>(layer)].rows(image.feature_row, image.count), dst));
    }
  }
  return Status::Ok();
}

Status QwenModel::run_forward(const Workspace& ws, const Pass& pass, Tensor logits) {
  const int64_t T = pass.T;
  Tensor x = ws.x.rows(0, T);
  KUIPER_RETURN_IF_ERROR(op::embedding(embed_, ws.ids.rows(0, T), x));
  KUIPER_RETURN_IF_ERROR(apply_image_rows(pass, -1, x));
  for (size_t l = 0; l < layers_.size(); ++l) {
    KUIPER_RETURN_IF_ERROR(run_layer(layers_[l], ws, pass));
    KUIPER_RETURN_IF_ERROR(apply_image_rows(pass, static_cast<int64_t>(l), x));
  }
  const int64_t rows = pass.logit_rows;
  if (rows == 0) return Status::Ok();
  Tensor last = ws.x.rows(T - rows, rows);
  if (pass.gather) {  // the rows are scattered over the pass: gather them first
    last = ws.picked.rows(0, rows);
    KUIPER_RETURN_IF_ERROR(op::embedding(x, ws.logit_index.rows(0, rows), last));
  }
  if (rows == 1) {  // the final norm rides in the lm_head GEMV
    op::LinearOptions head;
    head.norm = &final_norm_;
    head.eps = config_.rms_norm_eps;
    return op::linear(last, lm_head_, head, logits);
  }
  Tensor normed = ws.h.rows(0, rows);
  KUIPER_RETURN_IF_ERROR(op::rmsnorm(last, final_norm_, config_.rms_norm_eps, normed));
  return op::matmul(normed, lm_head_, nullptr, logits);
}

int64_t QwenModel::graph_bucket(int64_t sequences) const {
  const int64_t most = std::max<int64_t>(options_.max_sequences, 1);
  for (int64_t b = 1;; b = b < 32 ? 2 * b : b + 32) {
    if (b >= sequences) return sequences > most && b > most ? 0 : b;
    if (b >= most) return 0;
  }
}

Status QwenModel::run_decode_graph(const Pass& pass, int64_t bucket) {
  const Workspace& ws = bucket == 1 ? decode_ws_ : batch_ws_;
  Tensor logits = bucket == 1 ? decode_ws_.logits : graph_logits_.rows(0, bucket);
  DeviceGraph& graph = decode_graphs_[bucket];
  if (!graph.empty()) return graph.replay();
  // The bucket's first step runs eagerly, which gives this step's logits and lets every op do
  // its one-time setup (workspace allocation, kernel attributes) outside the capture; then the
  // same step is captured, not executed, for the steps that follow.
  KUIPER_RETURN_IF_ERROR(run_forward(ws, pass, logits));
  Result<DeviceGraph> captured = DeviceGraph::capture([&] { return run_forward(ws, pass, logits); });
  if (!captured.ok()) return captured.status().With("the decode step");
  graph = std::move(captured).value();
  return Status::Ok();
}

namespace {

// t as `act` on `device` (t itself when it already is).
Result<Tensor> to_activation(const Tensor& t, DataType act, DeviceType device) {
  if (t.dtype() == act && t.device() == device) return t;
  KUIPER_ASSIGN_OR_RETURN(Tensor host, t.to(DeviceType::kCpu));
  Tensor converted = host;
  if (host.dtype() != act) {
    KUIPER_ASSIGN_OR_RETURN(converted, Tensor::empty(host.shape(), act));
    KUIPER_RETURN_IF_ERROR(convert_elements(host.raw(), host.dtype(), converted.raw(), act,
                                            static_cast<size_t>(host.numel())));
  }
  return converted.to(device);
}

}  // namespace

Result<QwenModel::ImageRows> QwenModel::image_rows(const SequenceInput& s) const {
  ImageRows r;
  const DataType act = options_.activation;
  const DeviceType dev = options_.device;
  // The embeddings are copied over residual rows, the deepstack features added to them.
  KUIPER_ASSIGN_OR_RETURN(r.features.embeds,
                          to_activation(s.image->embeds, residual_dtype(act), dev));
  for (const Tensor& d : s.image->deepstack) {
    KUIPER_ASSIGN_OR_RETURN(Tensor converted, to_activation(d, act, dev));
    r.features.deepstack.push_back(std::move(converted));
  }
  const int64_t T = static_cast<int64_t>(s.tokens.size());
  int64_t feature_row = s.image_row;
  for (int64_t t = 0; t < T;) {
    int64_t end = t;
    while (end < T && s.tokens[static_cast<size_t>(end)] == config_.image_token_id) ++end;
    if (end > t) {
      r.runs.push_back({t, feature_row, end - t});
      feature_row += end - t;
      t = end;
    } else {
      ++t;
    }
  }
  return r;
}

void QwenModel::stage(const SequenceInput& s, const ImageRows* image, int64_t t, int64_t n,
                      Pass* pass) {
  const int64_t bs = kv_block_size(), T = static_cast<int64_t>(s.tokens.size());
  const int64_t axes = config_.is_mrope() ? 3 : 1;
  const int64_t at = pass->T;
  Staging& st = staging_;
  st.query_begin.push_back(static_cast<int32_t>(at));
  st.starts.push_back(static_cast<int32_t>(s.start + t));
  st.blocks.push_back(
      Span<const int32_t>(s.blocks.data(), static_cast<size_t>((s.start + t + n + bs - 1) / bs)));
  for (int64_t j = t; j < t + n; ++j) {
    const int64_t p = s.start + j;
    st.ids.push_back(s.tokens[static_cast<size_t>(j)]);
    st.rows.push_back(static_cast<int32_t>(s.blocks[static_cast<size_t>(p / bs)] * bs + p % bs));
    const size_t first = st.rope.size();  // the row's axis-0 position
    for (int64_t a = 0; a < axes; ++a) {
      const int32_t r = s.rope_positions.empty()
                            ? static_cast<int32_t>(p + s.rope_offset)
                            : s.rope_positions[static_cast<size_t>(a * T + j)];
      st.rope.push_back(r);
      pass->rope_axes_equal = pass->rope_axes_equal && r == st.rope[first];
    }
  }
  // The logits rows the span wants from these rows.
  if (s.logits == LogitRows::kAll) {
    for (int64_t j = 0; j < n; ++j) st.logit_index.push_back(static_cast<int32_t>(at + j));
  } else if (s.logits == LogitRows::kLast && t + n == T) {
    st.logit_index.push_back(static_cast<int32_t>(at + n - 1));
  }
  if (s.fed >= 0 && t + n == T) {  // the span's last token comes from the fed tokens
    st.fed_from.push_back(static_cast<int32_t>(s.fed));
    st.fed_to.push_back(static_cast<int32_t>(at + n - 1));
  }
  if (image != nullptr) {
    for (const ImageRun& run : image->runs) {
      const int64_t lo = std::max(run.row, t), hi = std::min(run.row + run.count, t + n);
      if (lo < hi) {
        pass->images.push_back({&image->features, at + lo - t, run.feature_row + lo - run.row,
                                hi - lo});
      }
    }
  }
  pass->T += n;
  pass->sequences += 1;
  pass->max_queries = std::max(pass->max_queries, n);
  pass->max_keys = std::max(pass->max_keys, s.start + t + n);
  pass->table_width =
      std::max(pass->table_width, static_cast<int64_t>(st.blocks.back().size()));
}

void QwenModel::stage_padding(Pass* pass, int64_t sequences) {
  const int64_t axes = config_.is_mrope() ? 3 : 1;
  Staging& st = staging_;
  // The flash2 fp16/bf16 decode skips the pads (PagedBatch::live); the other attention kinds
  // attend for each over its one key, written by the pad itself, in a split of its own. (The
  // flash2 decode's balanced split, which spreads every sequence's keys over its blocks, once
  // took the pads too: their units, one key each, fell to one block that ran them one after
  // another, and full-batch decode at 12 sequences in the graph of 16 ran at 1170 tok/s against
  // 1940 eagerly; H200, Qwen3-8B fp16.)
  pass->pads = sequences;
  for (int64_t i = 0; i < sequences; ++i) {
    st.query_begin.push_back(static_cast<int32_t>(pass->T));
    st.starts.push_back(0);
    st.blocks.push_back(Span<const int32_t>(&pad_block_, 1));
    st.ids.push_back(0);
    st.rows.push_back(static_cast<int32_t>(pad_block_ * kv_block_size()));
    for (int64_t a = 0; a < axes; ++a) st.rope.push_back(0);
    st.logit_index.push_back(static_cast<int32_t>(pass->T));
    pass->T += 1;
    pass->sequences += 1;
  }
}

Status QwenModel::upload(const Workspace& ws, const Pass& pass) {
  Staging& st = staging_;
  const int64_t T = pass.T, S = pass.sequences, W = pass.table_width;
  const int64_t axes = config_.is_mrope() ? 3 : 1;
  st.query_begin.push_back(static_cast<int32_t>(T));
  const Workspace::Offsets& at = ws.offsets;
  st.host.resize(static_cast<size_t>(at.block_tables + S * W));
  auto put = [&](int64_t offset, const std::vector<int32_t>& v, int64_t n) {
    std::copy(v.begin(), v.begin() + n, st.host.begin() + offset);
  };
  put(at.ids, st.ids, T);
  put(at.positions, st.rows, T);
  put(at.query_begin, st.query_begin, S + 1);
  put(at.starts, st.starts, S);
  st.host[static_cast<size_t>(at.live)] = static_cast<int32_t>(S - pass.pads);
  if (pass.gather) put(at.logit_index, st.logit_index, pass.logit_rows);
  const auto fed = static_cast<int64_t>(st.fed_from.size());
  put(at.fed_from, st.fed_from, fed);
  put(at.fed_to, st.fed_to, fed);
  // [axes, T] rotary positions from the staged [T, axes].
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t a = 0; a < axes; ++a) {
      st.host[static_cast<size_t>(at.rope + a * T + t)] =
          st.rope[static_cast<size_t>(t * axes + a)];
    }
  }
  // [S, W] block tables; entries past a sequence's blocks name the pad block (never read but
  // by the pads, whose tables it fills).
  std::fill(st.host.begin() + at.block_tables, st.host.end(), pad_block_);
  for (int64_t i = 0; i < S; ++i) {
    const Span<const int32_t>& b = st.blocks[static_cast<size_t>(i)];
    std::copy(b.begin(), b.end(), st.host.begin() + at.block_tables + i * W);
  }
  // Queued without waiting (a step may be launched while the last one runs): the pass's kernels
  // follow the copy on the stream.
  Tensor dst = ws.inputs.rows(0, static_cast<int64_t>(st.host.size()));
  return inputs_upload_.copy(dst.raw(), dst.device(), st.host.data(),
                             st.host.size() * sizeof(int32_t));
}

Result<Tensor> QwenModel::run_batch(Span<const SequenceInput> batch, const Tensor* tokens) {
  // The image features first (converted to the activation dtype where needed): a failure here
  // leaves the cache as it was.
  std::vector<ImageRows> images;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].image == nullptr) continue;
    if (images.empty()) images.resize(batch.size());
    KUIPER_ASSIGN_OR_RETURN(images[i], image_rows(batch[i]));
  }
  int64_t rows = 0, longest = 0;
  for (const SequenceInput& s : batch) {
    rows += logit_rows(s);
    longest = std::max(longest, static_cast<int64_t>(s.tokens.size()));
  }
  // A pass holds up to prefill_chunk rows (0: a whole span); a graph captured on the old batch
  // workspace goes with it.
  if (options_.prefill_chunk == 0 && longest > batch_ws_.capacity) {
    for (auto it = decode_graphs_.begin(); it != decode_graphs_.end();) {
      it = it->first > 1 ? decode_graphs_.erase(it) : std::next(it);
    }
    batch_ws_ = Workspace();  // release the old buffers before allocating the larger ones
    KUIPER_ASSIGN_OR_RETURN(batch_ws_, make_workspace(longest));
  }
  if (logits_.dim(0) < rows) {
    logits_ = Tensor();
    KUIPER_ASSIGN_OR_RETURN(logits_, Tensor::empty({rows, config_.vocab_size}, DataType::kFp32,
                                                   options_.device));
  }
  const int64_t capacity = options_.prefill_chunk > 0
                               ? std::min(options_.prefill_chunk, batch_ws_.capacity)
                               : batch_ws_.capacity;
  // The batch's rows run in passes, consecutive pieces of the entries' spans one after another,
  // each at most `capacity` rows; a span is cut where a pass fills. The logits rows come out in
  // the same order, so each pass's rows follow the last pass's.
  Pass pass;
  int64_t out_row = 0;
  Tensor result;
  // The inputs, then the fed rows' ids (forward(batch, tokens)) over their placeholders.
  auto upload_and_feed = [&](const Workspace& ws) -> Status {
    KUIPER_RETURN_IF_ERROR(upload(ws, pass));
    const auto fed = static_cast<int64_t>(staging_.fed_from.size());
    if (fed == 0) return Status::Ok();
    Tensor ids = ws.ids;
    return op::copy_indexed(*tokens, ws.fed_from.rows(0, fed), ws.fed_to.rows(0, fed), ids);
  };
  auto flush = [&]() -> Status {
    if (pass.T == 0) return Status::Ok();
    const int64_t R = static_cast<int64_t>(staging_.logit_index.size());
    pass.logit_rows = R;
    pass.decode = pass.T == pass.sequences;
    for (int64_t r = 0; r < R && !pass.gather; ++r) {
      pass.gather = staging_.logit_index[static_cast<size_t>(r)] != pass.T - R + r;
    }
    const int64_t bucket = options_.cuda_graph && pass.decode && pass.rope_axes_equal &&
                                   pass.images.empty() && R == pass.T
                               ? graph_bucket(pass.sequences)
                               : 0;
    if (bucket > 0) {
      stage_padding(&pass, bucket - pass.sequences);
      pass.logit_rows = bucket;
      pass.table_width = table_width_;
      pass.max_queries = 1;
      pass.max_keys = table_width_ * kv_block_size();
      const Workspace& ws = bucket == 1 ? decode_ws_ : batch_ws_;
      KUIPER_RETURN_IF_ERROR(upload_and_feed(ws));
      KUIPER_RETURN_IF_ERROR(run_decode_graph(pass, bucket));
      Tensor graph_rows = (bucket == 1 ? decode_ws_.logits : graph_logits_).rows(0, R);
      if (out_row == 0 && R == rows) {
        result = graph_rows;  // the whole batch: no copy
      } else {
        Tensor dst = logits_.rows(out_row, R);
        KUIPER_RETURN_IF_ERROR(dst.copy_from(graph_rows));
      }
    } else {
      const Workspace& ws = pass.T == 1 ? decode_ws_ : batch_ws_;
      KUIPER_RETURN_IF_ERROR(upload_and_feed(ws));
      KUIPER_RETURN_IF_ERROR(run_forward(ws, pass, R > 0 ? logits_.rows(out_row, R) : Tensor()));
    }
    out_row += R;
    pass = Pass();
    staging_.clear();
    return Status::Ok();
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& s = batch[i];
    const ImageRows* image = batch[i].image == nullptr ? nullptr : &images[i];
    const int64_t T = static_cast<int64_t>(s.tokens.size());
    for (int64_t t = 0; t < T;) {
      const int64_t n = std::min(T - t, capacity - pass.T);
      stage(s, image, t, n, &pass);
      t += n;
      if (pass.T == capacity) KUIPER_RETURN_IF_ERROR(flush());
    }
  }
  KUIPER_RETURN_IF_ERROR(flush());
  return result.defined() ? result : logits_.rows(0, rows);
}

Result<ImageFeatures> QwenModel::encode_images(const ImagePixels& images) {
  if (vision_ == nullptr) return Model::encode_images(images);
  return vision_->forward(images.values, images.grids);
}

}  // namespace kuiper
