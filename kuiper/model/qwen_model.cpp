#include "kuiper/model/qwen_model.h"

#include <numeric>

#include "kuiper/op/ops.h"

namespace kuiper {

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelOptions& options) {
  KUIPER_ASSIGN_OR_RETURN(std::shared_ptr<ModelFile> file, ModelFile::open(path));
  switch (file->config().arch) {
    case Architecture::kQwen2:
    case Architecture::kQwen3: {
      KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<QwenModel> model,
                              QwenModel::create(std::move(file), options));
      return std::unique_ptr<Model>(std::move(model));
    }
    default:
      return Status::Error(path + ": architecture '" + architecture_name(file->config().arch) +
                           "' is not supported by this build");
  }
}

Result<std::unique_ptr<QwenModel>> QwenModel::create(std::shared_ptr<ModelFile> file,
                                                     const ModelOptions& options) {
  const ModelConfig& c = file->config();
  if (options.device == DeviceType::kCpu && options.activation != DataType::kFp32) {
    return Status::Error(std::string("the CPU backend computes in fp32, not ") +
                         dtype_name(options.activation));
  }
  if (options.activation != DataType::kFp32 && options.activation != DataType::kFp16) {
    return Status::Error(std::string("activations must be fp32 or fp16, not ") +
                         dtype_name(options.activation));
  }
  const int64_t max_context =
      options.max_context > 0 ? options.max_context : c.max_position_embeddings;
  std::unique_ptr<QwenModel> model(new QwenModel(std::move(file), options, max_context));

  op::AttentionRequest request;
  request.kind = options.attention;
  request.dtype = options.activation;
  request.device = options.device;
  request.head_dim = c.head_dim;
  request.phase = op::AttentionPhase::kPrefill;
  KUIPER_ASSIGN_OR_RETURN(model->prefill_attention_, op::make_attention(request));
  request.phase = op::AttentionPhase::kDecode;
  KUIPER_ASSIGN_OR_RETURN(model->decode_attention_, op::make_attention(request));

  KUIPER_RETURN_IF_ERROR(model->load_weights().With(model->file().path()));
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

}  // namespace

Status QwenModel::load_weights() {
  const ModelConfig& c = config();
  const DeviceType dev = options_.device;
  const DataType act = options_.activation;
  auto get = [&](const std::string& name, Tensor& out) -> Status {
    KUIPER_ASSIGN_OR_RETURN(Tensor host, file_->tensor(name));
    KUIPER_ASSIGN_OR_RETURN(out, place(host, dev, act));
    return Status::Ok();
  };
  KUIPER_RETURN_IF_ERROR(get("model.embed_tokens.weight", embed_));
  KUIPER_RETURN_IF_ERROR(get("model.norm.weight", final_norm_));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    KUIPER_RETURN_IF_ERROR(get("lm_head.weight", lm_head_));
  }
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    KUIPER_RETURN_IF_ERROR(get(p + "input_layernorm.weight", L.input_norm));
    KUIPER_RETURN_IF_ERROR(get(p + "self_attn.q_proj.weight", L.q_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "self_attn.k_proj.weight", L.k_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "self_attn.v_proj.weight", L.v_proj));
    if (c.qkv_bias) {
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.q_proj.bias", L.q_bias));
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.k_proj.bias", L.k_bias));
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.v_proj.bias", L.v_bias));
    }
    if (c.qk_norm) {
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.q_norm.weight", L.q_norm));
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.k_norm.weight", L.k_norm));
    }
    KUIPER_RETURN_IF_ERROR(get(p + "self_attn.o_proj.weight", L.o_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "post_attention_layernorm.weight", L.post_norm));
    KUIPER_RETURN_IF_ERROR(get(p + "mlp.gate_proj.weight", L.gate_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "mlp.up_proj.weight", L.up_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "mlp.down_proj.weight", L.down_proj));
    KUIPER_ASSIGN_OR_RETURN(L.k_cache, Tensor::empty({max_context_, c.kv_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(L.v_cache, Tensor::empty({max_context_, c.kv_dim()}, act, dev));
  }
  return Status::Ok();
}

Status QwenModel::ensure_workspace(int64_t T, bool all_logits) {
  const int64_t logit_rows = all_logits ? T : 1;
  if (ws_.capacity >= T && ws_.logits.defined() && ws_.logits.dim(0) >= logit_rows) {
    return Status::Ok();
  }
  const ModelConfig& c = config();
  const DeviceType dev = options_.device;
  const DataType act = options_.activation;
  const int64_t cap = std::max(T, ws_.capacity);
  Workspace w;
  w.capacity = cap;
  KUIPER_ASSIGN_OR_RETURN(w.ids, Tensor::empty({cap}, DataType::kInt32, dev));
  KUIPER_ASSIGN_OR_RETURN(w.positions, Tensor::empty({cap}, DataType::kInt32, dev));
  KUIPER_ASSIGN_OR_RETURN(w.x, Tensor::empty({cap, c.hidden_size}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(w.h, Tensor::empty({cap, c.hidden_size}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(w.o, Tensor::empty({cap, c.hidden_size}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(w.q, Tensor::empty({cap, c.q_dim()}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(w.attn, Tensor::empty({cap, c.q_dim()}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(w.k, Tensor::empty({cap, c.kv_dim()}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(w.v, Tensor::empty({cap, c.kv_dim()}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(w.gate, Tensor::empty({cap, c.intermediate_size}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(w.up, Tensor::empty({cap, c.intermediate_size}, act, dev));
  const int64_t rows = std::max(logit_rows, ws_.logits.defined() ? ws_.logits.dim(0) : 0);
  KUIPER_ASSIGN_OR_RETURN(w.logits, Tensor::empty({rows, c.vocab_size}, DataType::kFp32, dev));
  ws_ = std::move(w);
  return Status::Ok();
}

Status QwenModel::run_layer(Layer& L, int64_t T, int64_t start) {
  const ModelConfig& c = config();
  const double eps = c.rms_norm_eps;
  Tensor x = ws_.x.rows(0, T), h = ws_.h.rows(0, T), o = ws_.o.rows(0, T);
  Tensor q = ws_.q.rows(0, T), k = ws_.k.rows(0, T), v = ws_.v.rows(0, T);
  Tensor attn = ws_.attn.rows(0, T), gate = ws_.gate.rows(0, T), up = ws_.up.rows(0, T);
  Tensor positions = ws_.positions.rows(0, T);

  KUIPER_RETURN_IF_ERROR(op::rmsnorm(x, L.input_norm, eps, h));
  KUIPER_RETURN_IF_ERROR(op::matmul(h, L.q_proj, c.qkv_bias ? &L.q_bias : nullptr, q));
  KUIPER_RETURN_IF_ERROR(op::matmul(h, L.k_proj, c.qkv_bias ? &L.k_bias : nullptr, k));
  KUIPER_RETURN_IF_ERROR(op::matmul(h, L.v_proj, c.qkv_bias ? &L.v_bias : nullptr, v));
  KUIPER_ASSIGN_OR_RETURN(Tensor q_heads, q.reshape({T, c.num_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(Tensor k_heads, k.reshape({T, c.num_kv_heads, c.head_dim}));
  if (c.qk_norm) {
    KUIPER_RETURN_IF_ERROR(op::rmsnorm(q_heads, L.q_norm, eps, q_heads));
    KUIPER_RETURN_IF_ERROR(op::rmsnorm(k_heads, L.k_norm, eps, k_heads));
  }
  KUIPER_RETURN_IF_ERROR(op::rope(q_heads, positions, c.rope_theta));
  KUIPER_RETURN_IF_ERROR(op::rope(k_heads, positions, c.rope_theta));
  KUIPER_RETURN_IF_ERROR(op::kv_write(k, L.k_cache, start));
  KUIPER_RETURN_IF_ERROR(op::kv_write(v, L.v_cache, start));

  op::AttentionArgs args;
  args.q = q_heads;
  KUIPER_ASSIGN_OR_RETURN(args.k_cache,
                          L.k_cache.reshape({max_context_, c.num_kv_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(args.v_cache,
                          L.v_cache.reshape({max_context_, c.num_kv_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(args.out, attn.reshape({T, c.num_heads, c.head_dim}));
  args.start = start;
  op::AttentionOp& attention = T == 1 ? *decode_attention_ : *prefill_attention_;
  KUIPER_RETURN_IF_ERROR(attention.forward(args));

  KUIPER_RETURN_IF_ERROR(op::matmul(attn, L.o_proj, nullptr, o));
  KUIPER_RETURN_IF_ERROR(op::add(x, o, x));
  KUIPER_RETURN_IF_ERROR(op::rmsnorm(x, L.post_norm, eps, h));
  KUIPER_RETURN_IF_ERROR(op::matmul(h, L.gate_proj, nullptr, gate));
  KUIPER_RETURN_IF_ERROR(op::matmul(h, L.up_proj, nullptr, up));
  KUIPER_RETURN_IF_ERROR(op::swiglu(gate, up, gate));
  KUIPER_RETURN_IF_ERROR(op::matmul(gate, L.down_proj, nullptr, o));
  return op::add(x, o, x);
}

Result<Tensor> QwenModel::forward(const std::vector<int32_t>& ids, int64_t start,
                                  bool all_logits) {
  const ModelConfig& c = config();
  const int64_t T = static_cast<int64_t>(ids.size());
  if (T == 0) return Status::Error("forward: no tokens");
  if (start < 0 || start + T > max_context_) {
    return Status::Error("forward: positions " + std::to_string(start) + ".." +
                         std::to_string(start + T) + " exceed the context of " +
                         std::to_string(max_context_) + " tokens");
  }
  for (int32_t id : ids) {
    if (id < 0 || id >= c.vocab_size) {
      return Status::Error("token id " + std::to_string(id) + " is outside the vocabulary (" +
                           std::to_string(c.vocab_size) + ")");
    }
  }
  KUIPER_RETURN_IF_ERROR(ensure_workspace(T, all_logits));

  std::vector<int32_t> positions(static_cast<size_t>(T));
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(start));
  Tensor host_ids = Tensor::view(const_cast<int32_t*>(ids.data()), {T}, DataType::kInt32,
                                 DeviceType::kCpu);
  Tensor host_pos = Tensor::view(positions.data(), {T}, DataType::kInt32, DeviceType::kCpu);
  Tensor dev_ids = ws_.ids.rows(0, T);
  Tensor dev_pos = ws_.positions.rows(0, T);
  KUIPER_RETURN_IF_ERROR(dev_ids.copy_from(host_ids));
  KUIPER_RETURN_IF_ERROR(dev_pos.copy_from(host_pos));

  Tensor x = ws_.x.rows(0, T);
  KUIPER_RETURN_IF_ERROR(op::embedding(embed_, dev_ids, x));
  for (Layer& layer : layers_) KUIPER_RETURN_IF_ERROR(run_layer(layer, T, start));

  const int64_t first = all_logits ? 0 : T - 1, rows = T - first;
  Tensor last = ws_.x.rows(first, rows), normed = ws_.h.rows(first, rows);
  KUIPER_RETURN_IF_ERROR(op::rmsnorm(last, final_norm_, c.rms_norm_eps, normed));
  Tensor logits = ws_.logits.rows(0, rows);
  KUIPER_RETURN_IF_ERROR(op::matmul(normed, lm_head_, nullptr, logits));
  return logits;
}

}  // namespace kuiper
