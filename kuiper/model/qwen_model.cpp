#include "kuiper/model/qwen_model.h"
#include "kuiper/model/qwen3_vl_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kuiper/op/ops.h"
#ifdef KUIPER_WITH_CUDA
#include "kuiper/base/cuda_runtime.h"
#endif

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
    case Architecture::kQwen3VL: {
      KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3VLModel> model,
                              Qwen3VLModel::create(std::move(file), options));
      return std::unique_ptr<Model>(std::move(model));
    }
    default:
      return Status::Error(path + ": architecture '" + architecture_name(file->config().arch) +
                           "' is not supported by this build");
  }
}

Result<std::unique_ptr<Model>> Model::random(const ModelConfig& config,
                                             const ModelOptions& options, uint64_t seed) {
  switch (config.arch) {
    case Architecture::kQwen2:
    case Architecture::kQwen3: {
      KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<QwenModel> model,
                              QwenModel::create_random(config, options, seed));
      return std::unique_ptr<Model>(std::move(model));
    }
    default:
      return Status::Error(std::string("architecture '") + architecture_name(config.arch) +
                           "' has no random-weight model");
  }
}

// The decode step captured once as a CUDA graph. Everything it touches has a fixed address
// (weights, KV cache, the decode workspace) and everything that changes per step (token,
// position) is read from device memory, so the same graph serves every step.
struct QwenModel::DecodeGraph {
#ifdef KUIPER_WITH_CUDA
  cudaGraphExec_t exec = nullptr;
  ~DecodeGraph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
  }
#endif
};

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
  if (options.activation != DataType::kFp32 && options.activation != DataType::kFp16) {
    return Status::Error(std::string("activations must be fp32 or fp16, not ") +
                         dtype_name(options.activation));
  }
  if (options.cuda_graph && options.device != DeviceType::kCuda) {
    return Status::Error(std::string("CUDA graph decode needs the cuda device, not ") +
                         device_name(options.device));
  }
  const int64_t max_context =
      options.max_context > 0 ? options.max_context : config.max_position_embeddings;
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
  request.graph_safe = options.cuda_graph;
  Result<std::unique_ptr<op::AttentionOp>> decode = op::make_attention(request);
  if (!decode.ok()) {
    return options.cuda_graph ? decode.status().With("CUDA graph decode") : decode.status();
  }
  model->decode_attention_ = std::move(decode).value();
  KUIPER_ASSIGN_OR_RETURN(model->decode_ws_, model->make_workspace(1, 1));
  if (options.cuda_graph) model->graph_ = std::make_unique<DecodeGraph>();
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
  auto get = [&](const std::string& name, const std::vector<int64_t>&, Tensor& out) -> Status {
    KUIPER_ASSIGN_OR_RETURN(Tensor host, f.tensor(name));
    KUIPER_ASSIGN_OR_RETURN(out, place(host, dev, act));
    return Status::Ok();
  };
  KUIPER_RETURN_IF_ERROR(model->build_weights(get).With(path));
  return model;
}

Result<std::unique_ptr<QwenModel>> QwenModel::create_random(const ModelConfig& config,
                                                            const ModelOptions& options,
                                                            uint64_t seed) {
  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<QwenModel> model, make(config, nullptr, options));
  // Every weight in the activation dtype, as place() leaves matrices of a loaded model. Scales
  // keep activations O(1) through the layers: uniform(-s, s) has variance s^2/3, so matrices use
  // s = sqrt(3 / fan_in); norm weights sit near 1.
  uint64_t index = 0;
  auto get = [&](const std::string& name, const std::vector<int64_t>& shape,
                 Tensor& out) -> Status {
    KUIPER_ASSIGN_OR_RETURN(out, Tensor::empty(shape, options.activation, options.device));
    float scale = 0.1f, offset = 0.0f;
    if (ends_with(name, "norm.weight")) {
      offset = 1.0f;
    } else if (ends_with(name, "embed_tokens.weight")) {
      scale = 1.0f;
    } else if (shape.size() == 2) {
      scale = std::sqrt(3.0f / static_cast<float>(shape[1]));
    }
    return op::fill_random(out, seed * 1000003u + index++, scale, offset).With(name);
  };
  KUIPER_RETURN_IF_ERROR(model->build_weights(get).With("random weights"));
  return model;
}

template <typename Get>
Status QwenModel::build_weights(Get&& get) {
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
    KUIPER_RETURN_IF_ERROR(get("lm_head.weight", {c.vocab_size, H}, lm_head_));
  }
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = text + "layers." + std::to_string(l) + ".";
    KUIPER_RETURN_IF_ERROR(get(p + "input_layernorm.weight", {H}, L.input_norm));
    KUIPER_RETURN_IF_ERROR(get(p + "self_attn.q_proj.weight", {c.q_dim(), H}, L.q_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "self_attn.k_proj.weight", {c.kv_dim(), H}, L.k_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "self_attn.v_proj.weight", {c.kv_dim(), H}, L.v_proj));
    if (c.qkv_bias) {
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.q_proj.bias", {c.q_dim()}, L.q_bias));
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.k_proj.bias", {c.kv_dim()}, L.k_bias));
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.v_proj.bias", {c.kv_dim()}, L.v_bias));
    }
    if (c.qk_norm) {
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.q_norm.weight", {c.head_dim}, L.q_norm));
      KUIPER_RETURN_IF_ERROR(get(p + "self_attn.k_norm.weight", {c.head_dim}, L.k_norm));
    }
    KUIPER_RETURN_IF_ERROR(get(p + "self_attn.o_proj.weight", {H, c.q_dim()}, L.o_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "post_attention_layernorm.weight", {H}, L.post_norm));
    KUIPER_RETURN_IF_ERROR(get(p + "mlp.gate_proj.weight", {I, H}, L.gate_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "mlp.up_proj.weight", {I, H}, L.up_proj));
    KUIPER_RETURN_IF_ERROR(get(p + "mlp.down_proj.weight", {H, I}, L.down_proj));
    KUIPER_ASSIGN_OR_RETURN(L.k_cache, Tensor::empty({max_context_, c.kv_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(L.v_cache, Tensor::empty({max_context_, c.kv_dim()}, act, dev));
  }
  return dev == DeviceType::kCpu ? Status::Ok() : stack_projections();
}

namespace {

// One tensor holding `parts` one after another along dimension 0; each part is then replaced by
// its row view of the stack, so the separate copies are freed.
Result<Tensor> stack_rows(std::initializer_list<Tensor*> parts) {
  std::vector<int64_t> shape = (*parts.begin())->shape();
  shape[0] = 0;
  for (const Tensor* p : parts) shape[0] += p->dim(0);
  const Tensor& first = **parts.begin();
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

}  // namespace

Status QwenModel::stack_projections() {
  for (Layer& L : layers_) {
    KUIPER_ASSIGN_OR_RETURN(L.qkv_proj, stack_rows({&L.q_proj, &L.k_proj, &L.v_proj}));
    if (config_.qkv_bias) {
      KUIPER_ASSIGN_OR_RETURN(L.qkv_bias, stack_rows({&L.q_bias, &L.k_bias, &L.v_bias}));
    }
    KUIPER_ASSIGN_OR_RETURN(L.gate_up_proj, stack_rows({&L.gate_proj, &L.up_proj}));
  }
#ifdef KUIPER_WITH_CUDA
  // The separate copies went back to the caching allocator, in sizes nothing else asks for (an
  // 8B model: 240 MB a layer, 8.4 GB in all): return them to CUDA.
  cuda::release_cached_memory();
#endif
  return Status::Ok();
}

Result<QwenModel::Workspace> QwenModel::make_workspace(int64_t cap, int64_t logit_rows) const {
  const ModelConfig& c = config_;
  const DeviceType dev = options_.device;
  const DataType act = options_.activation;
  Workspace w;
  w.capacity = cap;
  KUIPER_ASSIGN_OR_RETURN(w.ids, Tensor::empty({cap}, DataType::kInt32, dev));
  KUIPER_ASSIGN_OR_RETURN(w.positions, Tensor::empty({cap}, DataType::kInt32, dev));
  if (c.is_mrope()) {
    KUIPER_ASSIGN_OR_RETURN(w.rope_positions, Tensor::empty({3 * cap}, DataType::kInt32, dev));
  }
  KUIPER_ASSIGN_OR_RETURN(w.x, Tensor::empty({cap, c.hidden_size}, act, dev));
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
  } else {
    KUIPER_ASSIGN_OR_RETURN(w.q, Tensor::empty({cap, c.q_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(w.k, Tensor::empty({cap, c.kv_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(w.v, Tensor::empty({cap, c.kv_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(w.gate, Tensor::empty({cap, I}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(w.up, Tensor::empty({cap, I}, act, dev));
  }
  KUIPER_ASSIGN_OR_RETURN(w.logits,
                          Tensor::empty({logit_rows, c.vocab_size}, DataType::kFp32, dev));
  return w;
}

Status QwenModel::run_layer(Layer& L, const Workspace& ws, int64_t T, int64_t start) {
  const ModelConfig& c = config_;
  const double eps = c.rms_norm_eps;
  Tensor x = ws.x.rows(0, T), h = ws.h.rows(0, T);
  Tensor q = ws.q.rows(0, T), k = ws.k.rows(0, T), v = ws.v.rows(0, T);
  Tensor attn = ws.attn.rows(0, T), gate = ws.gate.rows(0, T), up = ws.up.rows(0, T);
  Tensor positions = ws.positions.rows(0, T);

  // Decode on the GPU reads the stacked matrices (see Layer) through op::linear's fused forms:
  // the RMSNorms ride in the GEMVs that follow them, SwiGLU in the gate/up GEMV and the residual
  // adds in the o and down GEMVs. Prefill keeps the norms separate (cuBLAS GEMMs).
  const bool stacked = T == 1 && L.qkv_proj.defined() && ws.qkv.defined();
  if (stacked) {
    op::LinearOptions qkv;
    qkv.norm = &L.input_norm;
    qkv.eps = eps;
    qkv.bias = c.qkv_bias ? &L.qkv_bias : nullptr;
    Tensor out = ws.qkv;
    KUIPER_RETURN_IF_ERROR(op::linear(x, L.qkv_proj, qkv, out));
  } else {
    KUIPER_RETURN_IF_ERROR(op::rmsnorm(x, L.input_norm, eps, h));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.q_proj, c.qkv_bias ? &L.q_bias : nullptr, q));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.k_proj, c.qkv_bias ? &L.k_bias : nullptr, k));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.v_proj, c.qkv_bias ? &L.v_bias : nullptr, v));
  }
  KUIPER_ASSIGN_OR_RETURN(Tensor q_heads, q.reshape({T, c.num_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(Tensor k_heads, k.reshape({T, c.num_kv_heads, c.head_dim}));
  if (c.is_mrope() && rope_axes_equal_) {  // Qwen3-VL text: M-RoPE at (p, p, p) is RoPE at p
    Tensor rotary = ws.rope_positions.rows(0, T);  // axis 0 of the [3, T] positions
    KUIPER_RETURN_IF_ERROR(op::qk_norm_rope_cache(
        q_heads, k_heads, v, c.qk_norm ? &L.q_norm : nullptr, c.qk_norm ? &L.k_norm : nullptr, eps,
        positions, c.rope_theta, L.k_cache, L.v_cache, &rotary));
  } else if (c.is_mrope()) {  // Qwen3-VL: the rotary positions are [3, T], apart from the cache rows
    KUIPER_ASSIGN_OR_RETURN(Tensor rope3, ws.rope_positions.rows(0, 3 * T).reshape({3, T}));
    if (c.qk_norm) {
      KUIPER_RETURN_IF_ERROR(op::rmsnorm(q_heads, L.q_norm, eps, q_heads));
      KUIPER_RETURN_IF_ERROR(op::rmsnorm(k_heads, L.k_norm, eps, k_heads));
    }
    KUIPER_RETURN_IF_ERROR(op::mrope(q_heads, rope3, c.rope_theta, c.mrope_section));
    KUIPER_RETURN_IF_ERROR(op::mrope(k_heads, rope3, c.rope_theta, c.mrope_section));
    KUIPER_RETURN_IF_ERROR(op::kv_write(k, L.k_cache, positions));
    KUIPER_RETURN_IF_ERROR(op::kv_write(v, L.v_cache, positions));
  } else {
    KUIPER_RETURN_IF_ERROR(op::qk_norm_rope_cache(
        q_heads, k_heads, v, c.qk_norm ? &L.q_norm : nullptr, c.qk_norm ? &L.k_norm : nullptr, eps,
        positions, c.rope_theta, L.k_cache, L.v_cache));
  }

  op::AttentionArgs args;
  args.q = q_heads;
  KUIPER_ASSIGN_OR_RETURN(args.k_cache,
                          L.k_cache.reshape({max_context_, c.num_kv_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(args.v_cache,
                          L.v_cache.reshape({max_context_, c.num_kv_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(args.out, attn.reshape({T, c.num_heads, c.head_dim}));
  args.start = start;
  if (T == 1) args.device_position = positions;  // what graph-safe decode kernels read
  op::AttentionOp& attention = T == 1 ? *decode_attention_ : *prefill_attention_;
  KUIPER_RETURN_IF_ERROR(attention.forward(args));

  op::LinearOptions residual;
  residual.residual = true;
  KUIPER_RETURN_IF_ERROR(op::linear(attn, L.o_proj, residual, x));
  if (stacked) {
    op::LinearOptions mlp;
    mlp.norm = &L.post_norm;
    mlp.eps = eps;
    mlp.swiglu = true;
    KUIPER_RETURN_IF_ERROR(op::linear(x, L.gate_up_proj, mlp, gate));
  } else {
    KUIPER_RETURN_IF_ERROR(op::rmsnorm(x, L.post_norm, eps, h));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.gate_proj, nullptr, gate));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.up_proj, nullptr, up));
    KUIPER_RETURN_IF_ERROR(op::swiglu(gate, up, gate));
  }
  return op::linear(gate, L.down_proj, residual, x);
}

Status QwenModel::run_forward(const Workspace& ws, int64_t T, int64_t start, int64_t logit_rows,
                              int64_t logit_row0) {
  Tensor x = ws.x.rows(0, T);
  KUIPER_RETURN_IF_ERROR(op::embedding(embed_, ws.ids.rows(0, T), x));
  if (hidden_hook_) KUIPER_RETURN_IF_ERROR(hidden_hook_(-1, x));
  for (size_t l = 0; l < layers_.size(); ++l) {
    KUIPER_RETURN_IF_ERROR(run_layer(layers_[l], ws, T, start));
    if (hidden_hook_) KUIPER_RETURN_IF_ERROR(hidden_hook_(static_cast<int64_t>(l), x));
  }
  if (logit_rows == 0) return Status::Ok();
  const int64_t first = T - logit_rows;
  Tensor last = ws.x.rows(first, logit_rows);
  Tensor logits = ws.logits.rows(logit_row0, logit_rows);
  if (logit_rows == 1) {  // the final norm rides in the lm_head GEMV
    op::LinearOptions head;
    head.norm = &final_norm_;
    head.eps = config_.rms_norm_eps;
    return op::linear(last, lm_head_, head, logits);
  }
  Tensor normed = ws.h.rows(first, logit_rows);
  KUIPER_RETURN_IF_ERROR(op::rmsnorm(last, final_norm_, config_.rms_norm_eps, normed));
  return op::matmul(normed, lm_head_, nullptr, logits);
}

Status QwenModel::run_decode_graph(int64_t start) {
#ifdef KUIPER_WITH_CUDA
  const cudaStream_t stream = cuda::stream();
  if (graph_->exec != nullptr) {
    KUIPER_CUDA_CHECK(cudaGraphLaunch(graph_->exec, stream));
    return Status::Ok();
  }
  // The first step runs eagerly, which gives this step's logits and lets every op do its
  // one-time setup (workspace allocation, kernel attributes) outside the capture; then the
  // same step is captured, not executed, for the steps that follow. Nothing in the captured
  // step may allocate or synchronise, and a failure must still end the capture, or the stream
  // stays unusable.
  KUIPER_RETURN_IF_ERROR(run_forward(decode_ws_, 1, start, 1));
  KUIPER_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status body = run_forward(decode_ws_, 1, start, 1);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!body.ok() || ended != cudaSuccess) {
    (void)cudaGetLastError();  // the invalidated capture's error must not taint later launches
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    if (!body.ok()) return body.With("capturing the decode graph");
    return cuda::check(ended, "capturing the decode graph");
  }
  const cudaError_t made = cudaGraphInstantiate(&graph_->exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (made != cudaSuccess) graph_->exec = nullptr;
  return cuda::check(made, "cudaGraphInstantiate (decode step)");
#else
  (void)start;
  return Status::Error("this build of Kuiper has no CUDA support");
#endif
}

Result<Tensor> QwenModel::forward(const std::vector<int32_t>& ids, int64_t start,
                                  bool all_logits) {
  const ModelConfig& c = config_;
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
  const int64_t logit_rows = all_logits ? T : 1;
  std::vector<int32_t> positions(static_cast<size_t>(T));
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(start));
  if (T == 1) {
    Tensor host_ids = Tensor::view(const_cast<int32_t*>(ids.data()), {1}, DataType::kInt32,
                                   DeviceType::kCpu);
    Tensor host_pos = Tensor::view(positions.data(), {1}, DataType::kInt32, DeviceType::kCpu);
    Tensor dev_ids = decode_ws_.ids.rows(0, 1), dev_pos = decode_ws_.positions.rows(0, 1);
    KUIPER_RETURN_IF_ERROR(dev_ids.copy_from(host_ids));
    KUIPER_RETURN_IF_ERROR(dev_pos.copy_from(host_pos));
    if (graph_ != nullptr) {
      KUIPER_RETURN_IF_ERROR(run_decode_graph(start));
    } else {
      KUIPER_RETURN_IF_ERROR(run_forward(decode_ws_, 1, start, 1));
    }
    return decode_ws_.logits.rows(0, 1);
  }
  // Prefill, options_.prefill_chunk tokens at a time: the workspace holds one chunk (plus every
  // row's logits when all_logits), and each chunk attends to the cache the earlier ones wrote.
  const int64_t chunk = options_.prefill_chunk > 0 ? std::min(options_.prefill_chunk, T) : T;
  if (prefill_ws_.capacity < chunk || prefill_ws_.logits.dim(0) < logit_rows) {
    prefill_ws_ = Workspace();  // release the old buffers before allocating the larger ones
    KUIPER_ASSIGN_OR_RETURN(prefill_ws_, make_workspace(chunk, logit_rows));
  }
  const Workspace& ws = prefill_ws_;
  for (int64_t c0 = 0; c0 < T; c0 += chunk) {
    const int64_t n = std::min(chunk, T - c0);
    Tensor host_ids = Tensor::view(const_cast<int32_t*>(ids.data()) + c0, {n}, DataType::kInt32,
                                   DeviceType::kCpu);
    Tensor host_pos = Tensor::view(positions.data() + c0, {n}, DataType::kInt32, DeviceType::kCpu);
    Tensor dev_ids = ws.ids.rows(0, n), dev_pos = ws.positions.rows(0, n);
    KUIPER_RETURN_IF_ERROR(dev_ids.copy_from(host_ids));
    KUIPER_RETURN_IF_ERROR(dev_pos.copy_from(host_pos));
    const bool last = c0 + n == T;
    const int64_t rows = all_logits ? n : (last ? 1 : 0);
    KUIPER_RETURN_IF_ERROR(run_forward(ws, n, start + c0, rows, all_logits ? c0 : 0));
  }
  return ws.logits.rows(0, logit_rows);
}

}  // namespace kuiper
