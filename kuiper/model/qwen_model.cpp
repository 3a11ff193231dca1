#include "kuiper/model/qwen_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

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
  KUIPER_ASSIGN_OR_RETURN(model->decode_ws_, model->make_workspace(1));
  if (options.cuda_graph) model->decode_graphs_.resize(static_cast<size_t>(options.max_sequences));
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

template <typename Fetch>
Status QwenModel::build_weights(Fetch&& fetch) {
  auto get = [&](const std::string& name, const std::vector<int64_t>& shape, Tensor& out) {
    const Status s = fetch(name, shape, out);
    if (s.ok()) weight_bytes_ += static_cast<int64_t>(out.nbytes());
    return s;
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
    const int64_t pool_rows = kv_blocks() * kv_block_size();
    KUIPER_ASSIGN_OR_RETURN(L.k_cache, Tensor::empty({pool_rows, c.kv_dim()}, act, dev));
    KUIPER_ASSIGN_OR_RETURN(L.v_cache, Tensor::empty({pool_rows, c.kv_dim()}, act, dev));
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
  KUIPER_ASSIGN_OR_RETURN(w.ids, Tensor::empty({cap}, DataType::kInt32, dev));
  KUIPER_ASSIGN_OR_RETURN(w.positions, Tensor::empty({cap}, DataType::kInt32, dev));
  const int64_t rope_axes = c.is_mrope() ? 3 : 1;
  KUIPER_ASSIGN_OR_RETURN(w.rope_positions,
                          Tensor::empty({rope_axes * cap}, DataType::kInt32, dev));
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
    KUIPER_ASSIGN_OR_RETURN(w.up, Tensor::empty({cap, I}, act, dev));
  }
  return w;
}

Status QwenModel::run_layer(Layer& L, const Workspace& ws, const Pass& pass) {
  const ModelConfig& c = config_;
  const int64_t T = pass.T, block_size = kv_block_size();
  // Today's kernels on the sequence's block, a contiguous [block_size, kv_dim] view of the pool.
  Tensor k_cache = L.k_cache.rows(pass.block * block_size, block_size);
  Tensor v_cache = L.v_cache.rows(pass.block * block_size, block_size);
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
  if (pass.rope_axes_equal) {  // RoPE (Qwen3-VL text: M-RoPE at (p, p, p) is RoPE at p)
    Tensor rotary = ws.rope_positions.rows(0, T);  // axis 0 of the [axes, T] positions
    KUIPER_RETURN_IF_ERROR(op::qk_norm_rope_cache(
        q_heads, k_heads, v, c.qk_norm ? &L.q_norm : nullptr, c.qk_norm ? &L.k_norm : nullptr, eps,
        positions, c.rope(), k_cache, v_cache, &rotary));
  } else {  // Qwen3-VL: the rotary positions are [3, T], apart from the cache rows
    KUIPER_ASSIGN_OR_RETURN(Tensor rope3, ws.rope_positions.rows(0, 3 * T).reshape({3, T}));
    if (c.qk_norm) {
      KUIPER_RETURN_IF_ERROR(op::rmsnorm(q_heads, L.q_norm, eps, q_heads));
      KUIPER_RETURN_IF_ERROR(op::rmsnorm(k_heads, L.k_norm, eps, k_heads));
    }
    KUIPER_RETURN_IF_ERROR(op::mrope(q_heads, rope3, c.rope(), c.mrope_section));
    KUIPER_RETURN_IF_ERROR(op::mrope(k_heads, rope3, c.rope(), c.mrope_section));
    KUIPER_RETURN_IF_ERROR(op::kv_write(k, k_cache, positions));
    KUIPER_RETURN_IF_ERROR(op::kv_write(v, v_cache, positions));
  }

  op::AttentionArgs args;
  args.q = q_heads;
  KUIPER_ASSIGN_OR_RETURN(args.k_cache, k_cache.reshape({block_size, c.num_kv_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(args.v_cache, v_cache.reshape({block_size, c.num_kv_heads, c.head_dim}));
  KUIPER_ASSIGN_OR_RETURN(args.out, attn.reshape({T, c.num_heads, c.head_dim}));
  args.start = pass.start;
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

Status QwenModel::apply_image_rows(const Pass& pass, int64_t layer, Tensor& x) const {
  if (pass.image == nullptr) return Status::Ok();
  const ImageFeatures& f = pass.image->features;
  if (layer >= static_cast<int64_t>(f.deepstack.size())) return Status::Ok();
  // The image embeddings replace the pad rows' token embeddings (layer -1); deepstack feature k
  // is added after layer k. Each run's overlap with the pass's rows.
  for (const ImageRun& run : pass.image->runs) {
    const int64_t lo = std::max(run.row, pass.row0);
    const int64_t hi = std::min(run.row + run.count, pass.row0 + pass.T);
    if (lo >= hi) continue;
    Tensor dst = x.rows(lo - pass.row0, hi - lo);
    const int64_t src = run.feature_row + (lo - run.row);
    if (layer < 0) {
      KUIPER_RETURN_IF_ERROR(dst.copy_from(f.embeds.rows(src, hi - lo)));
    } else {
      KUIPER_RETURN_IF_ERROR(
          op::add(dst, f.deepstack[static_cast<size_t>(layer)].rows(src, hi - lo), dst));
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
  const int64_t first = T - rows;
  Tensor last = ws.x.rows(first, rows);
  if (rows == 1) {  // the final norm rides in the lm_head GEMV
    op::LinearOptions head;
    head.norm = &final_norm_;
    head.eps = config_.rms_norm_eps;
    return op::linear(last, lm_head_, head, logits);
  }
  Tensor normed = ws.h.rows(first, rows);
  KUIPER_RETURN_IF_ERROR(op::rmsnorm(last, final_norm_, config_.rms_norm_eps, normed));
  return op::matmul(normed, lm_head_, nullptr, logits);
}

Status QwenModel::run_decode_step(const Pass& pass) {
  // The graph holds the fused qk-norm / RoPE / cache-write kernel, which rotates every axis by
  // the first one's position, and no image rows: M-RoPE tokens whose axes differ run eagerly.
  const bool graph_safe = pass.image == nullptr && pass.rope_axes_equal;
  if (decode_graphs_.empty() || !graph_safe) {
    return run_forward(decode_ws_, pass, decode_ws_.logits);
  }
  DeviceGraph& graph = decode_graphs_[static_cast<size_t>(pass.block)];
  if (!graph.empty()) return graph.replay();
  // The block's first step runs eagerly, which gives this step's logits and lets every op do its
  // one-time setup (workspace allocation, kernel attributes) outside the capture; then the same
  // step is captured, not executed, for the steps that follow.
  KUIPER_RETURN_IF_ERROR(run_forward(decode_ws_, pass, decode_ws_.logits));
  Result<DeviceGraph> captured =
      DeviceGraph::capture([&] { return run_forward(decode_ws_, pass, decode_ws_.logits); });
  if (!captured.ok()) return captured.status().With("the decode step");
  graph = std::move(captured).value();
  return Status::Ok();
}

namespace {

// Copies n host int32 values into the first n entries of a device tensor.
Status upload(const Tensor& dst, const int32_t* src, int64_t n) {
  Tensor host = Tensor::view(const_cast<int32_t*>(src), {n}, DataType::kInt32, DeviceType::kCpu);
  Tensor rows = dst.rows(0, n);
  return rows.copy_from(host);
}

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

Status QwenModel::run_sequence(const SequenceInput& s, const ImageRows* image, Tensor logits) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(s.tokens.size());
  // Cache rows, and the rotary positions: [3, T] for M-RoPE, [1, T] otherwise (the 1-D ones on
  // every axis when none are given).
  host_positions_.resize(static_cast<size_t>(T));
  std::iota(host_positions_.begin(), host_positions_.end(), static_cast<int32_t>(s.start));
  const int64_t rope_axes = c.is_mrope() ? 3 : 1;
  host_rope_.resize(static_cast<size_t>(rope_axes * T));
  if (s.rope_positions.empty()) {
    for (int64_t a = 0; a < rope_axes; ++a) {
      std::iota(host_rope_.begin() + a * T, host_rope_.begin() + (a + 1) * T,
                static_cast<int32_t>(s.start + s.rope_offset));
    }
  } else {
    std::copy(s.rope_positions.begin(), s.rope_positions.end(), host_rope_.begin());
  }
  // Prefill, options_.prefill_chunk rows at a time: the workspace holds one pass, and each pass
  // attends to the cache the earlier ones wrote.
  const int64_t chunk = T > 1 && options_.prefill_chunk > 0 ? std::min(options_.prefill_chunk, T) : T;
  if (T > 1 && prefill_ws_.capacity < chunk) {
    prefill_ws_ = Workspace();  // release the old buffers before allocating the larger ones
    KUIPER_ASSIGN_OR_RETURN(prefill_ws_, make_workspace(chunk));
  }
  const Workspace& ws = T == 1 ? decode_ws_ : prefill_ws_;
  for (int64_t c0 = 0; c0 < T; c0 += chunk) {
    Pass pass;
    pass.T = std::min(chunk, T - c0);
    pass.start = s.start + c0;
    pass.block = s.blocks[0];  // one block holds the whole context (see batch.h)
    pass.row0 = c0;
    const int64_t n = pass.T;
    KUIPER_RETURN_IF_ERROR(upload(ws.ids, s.tokens.data() + c0, n));
    KUIPER_RETURN_IF_ERROR(upload(ws.positions, host_positions_.data() + c0, n));
    // The pass's [axes, n] rotary positions, and whether its axes agree (M-RoPE: text only).
    host_pass_rope_.resize(static_cast<size_t>(rope_axes * n));
    bool equal = true;
    for (int64_t a = 0; a < rope_axes; ++a) {
      for (int64_t t = 0; t < n; ++t) {
        const int32_t p = host_rope_[static_cast<size_t>(a * T + c0 + t)];
        host_pass_rope_[static_cast<size_t>(a * n + t)] = p;
        equal = equal && p == host_rope_[static_cast<size_t>(c0 + t)];
      }
    }
    pass.rope_axes_equal = equal;
    KUIPER_RETURN_IF_ERROR(upload(ws.rope_positions, host_pass_rope_.data(), rope_axes * n));
    if (image != nullptr) {
      for (const ImageRun& run : image->runs) {
        if (run.row < c0 + n && run.row + run.count > c0) pass.image = image;
      }
    }
    if (T == 1) {  // a decode step: its logits row goes to decode_ws_.logits
      pass.logit_rows = 1;
      KUIPER_RETURN_IF_ERROR(run_decode_step(pass));
      continue;
    }
    const bool last = c0 + n == T;
    pass.logit_rows = s.logits == LogitRows::kAll ? n : (last && s.logits == LogitRows::kLast ? 1 : 0);
    const int64_t row = s.logits == LogitRows::kAll ? c0 : 0;
    KUIPER_RETURN_IF_ERROR(
        run_forward(ws, pass, pass.logit_rows > 0 ? logits.rows(row, pass.logit_rows) : Tensor()));
  }
  if (T == 1 && logit_rows(s) == 1 && logits.raw() != decode_ws_.logits.raw()) {
    return logits.copy_from(decode_ws_.logits);
  }
  return Status::Ok();
}

Result<Tensor> QwenModel::run_batch(Span<const SequenceInput> batch) {
  // The image features first (converted to the activation dtype where needed): a failure here
  // leaves the cache as it was.
  std::vector<ImageRows> images;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].image == nullptr) continue;
    if (images.empty()) images.resize(batch.size());
    KUIPER_ASSIGN_OR_RETURN(images[i], image_rows(batch[i]));
  }
  auto image_of = [&](size_t i) {
    return batch[i].image == nullptr ? nullptr : &images[i];
  };
  // A lone decode step returns its workspace's logits row in place (the decode graph writes it).
  if (batch.size() == 1 && batch[0].tokens.size() == 1) {
    KUIPER_RETURN_IF_ERROR(run_sequence(batch[0], image_of(0), decode_ws_.logits));
    return decode_ws_.logits.rows(0, logit_rows(batch[0]));
  }
  int64_t rows = 0;
  for (const SequenceInput& s : batch) rows += logit_rows(s);
  if (!logits_.defined() || logits_.dim(0) < std::max<int64_t>(rows, 1)) {
    logits_ = Tensor();  // release the old buffer before allocating the larger one
    KUIPER_ASSIGN_OR_RETURN(logits_, Tensor::empty({std::max<int64_t>(rows, 1), config_.vocab_size},
                                                   DataType::kFp32, options_.device));
  }
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t n = logit_rows(batch[i]);
    KUIPER_RETURN_IF_ERROR(run_sequence(batch[i], image_of(i), logits_.rows(row, n)));
    row += n;
  }
  return logits_.rows(0, rows);
}

Result<ImageFeatures> QwenModel::encode_images(const ImagePixels& images) {
  if (vision_ == nullptr) return Model::encode_images(images);
  return vision_->forward(images.values, images.grids);
}

}  // namespace kuiper
