#include "kuiper/model/vision_encoder.h"

#include <cmath>
#include <utility>

#include "kuiper/op/ops.h"

namespace kuiper {

namespace vision {

std::vector<float> linspace_f32(float start, float end, int64_t steps) {
  std::vector<float> v(static_cast<size_t>(std::max<int64_t>(steps, 0)));
  if (steps == 1) v[0] = start;
  if (steps <= 1) return v;
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  for (int64_t i = 0; i < steps; ++i) {
    v[i] = i < halfway ? start + step * static_cast<float>(i)
                       : end - step * static_cast<float>(steps - i - 1);
  }
  return v;
}

std::vector<float> interpolated_position_embeddings(
    const std::vector<float>& table, int64_t side, int64_t hidden, int64_t merge,
    const std::vector<std::array<int64_t, 3>>& grids) {
  int64_t total = 0;
  for (const auto& g : grids) total += g[0] * g[1] * g[2];
  std::vector<float> out(static_cast<size_t>(total * hidden));
  std::vector<float> grid_embeds;
  int64_t row = 0;  // next output patch
  for (const auto& g : grids) {
    const int64_t t = g[0], h = g[1], w = g[2];
    // The bilinear corners and weights of each axis, in fp32 as torch computes them.
    auto axis = [side](int64_t n, std::vector<int64_t>& lo, std::vector<int64_t>& hi,
                       std::vector<float>& frac) {
      const std::vector<float> x = linspace_f32(0.0f, static_cast<float>(side - 1), n);
      lo.resize(n);
      hi.resize(n);
      frac.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        lo[i] = static_cast<int64_t>(x[i]);  // .int() truncates; x >= 0
        hi[i] = std::min(lo[i] + 1, side - 1);
        frac[i] = x[i] - static_cast<float>(lo[i]);
      }
    };
    std::vector<int64_t> h_lo, h_hi, w_lo, w_hi;
    std::vector<float> dh, dw;
    axis(h, h_lo, h_hi, dh);
    axis(w, w_lo, w_hi, dw);
    // Row-major [h, w] embeddings first: the four corners weighted, summed in torch's order.
    grid_embeds.assign(static_cast<size_t>(h * w * hidden), 0.0f);
    for (int64_t i = 0; i < h; ++i) {
      for (int64_t j = 0; j < w; ++j) {
        const int64_t idx[4] = {h_lo[i] * side + w_lo[j], h_lo[i] * side + w_hi[j],
                                h_hi[i] * side + w_lo[j], h_hi[i] * side + w_hi[j]};
        const float wt[4] = {(1.0f - dh[i]) * (1.0f - dw[j]), (1.0f - dh[i]) * dw[j],
                             dh[i] * (1.0f - dw[j]), dh[i] * dw[j]};
        float* o = grid_embeds.data() + (i * w + j) * hidden;
        for (int64_t c = 0; c < hidden; ++c) {
          float s = table[idx[0] * hidden + c] * wt[0];
          for (int k = 1; k < 4; ++k) s += table[idx[k] * hidden + c] * wt[k];
          o[c] = s;
        }
      }
    }
    // Then into merge-block order, once per frame.
    for (int64_t f = 0; f < t; ++f) {
      for (int64_t bh = 0; bh < h / merge; ++bh) {
        for (int64_t bw = 0; bw < w / merge; ++bw) {
          for (int64_t ih = 0; ih < merge; ++ih) {
            for (int64_t iw = 0; iw < merge; ++iw, ++row) {
              const int64_t src = (bh * merge + ih) * w + bw * merge + iw;
              std::copy_n(grid_embeds.data() + src * hidden, hidden,
                          out.data() + row * hidden);
            }
          }
        }
      }
    }
  }
  return out;
}

std::vector<int32_t> patch_positions(int64_t merge,
                                     const std::vector<std::array<int64_t, 3>>& grids) {
  std::vector<int32_t> pos;
  for (const auto& g : grids) {
    const int64_t t = g[0], h = g[1], w = g[2];
    for (int64_t f = 0; f < t; ++f) {
      for (int64_t bh = 0; bh < h / merge; ++bh) {
        for (int64_t bw = 0; bw < w / merge; ++bw) {
          for (int64_t ih = 0; ih < merge; ++ih) {
            for (int64_t iw = 0; iw < merge; ++iw) {
              pos.push_back(static_cast<int32_t>(bh * merge + ih));
              pos.push_back(static_cast<int32_t>(bw * merge + iw));
            }
          }
        }
      }
    }
  }
  return pos;
}

std::vector<int32_t> frame_cu_seqlens(const std::vector<std::array<int64_t, 3>>& grids) {
  std::vector<int32_t> cu{0};
  for (const auto& g : grids) {
    for (int64_t f = 0; f < g[0]; ++f) cu.push_back(static_cast<int32_t>(cu.back() + g[1] * g[2]));
  }
  return cu;
}

}  // namespace vision

namespace {

// A host vector as a tensor of `dtype` on `device`.
template <typename T>
Result<Tensor> upload(const std::vector<T>& host, std::vector<int64_t> shape, DataType host_type,
                      DataType dtype, DeviceType device) {
  Tensor h = Tensor::view(const_cast<T*>(host.data()), shape, host_type, DeviceType::kCpu);
  if (dtype != host_type) {
    KUIPER_ASSIGN_OR_RETURN(Tensor c, Tensor::empty(shape, dtype));
    KUIPER_RETURN_IF_ERROR(
        convert_elements(h.raw(), host_type, c.raw(), dtype, static_cast<size_t>(h.numel())));
    return c.to(device);
  }
  return h.to(device);  // a copy even on the CPU: the view does not own the vector
}

Result<Tensor> new_activation(std::vector<int64_t> shape, DataType dtype, DeviceType device) {
  return Tensor::empty(std::move(shape), dtype, device);
}

}  // namespace

Result<std::unique_ptr<VisionEncoder>> VisionEncoder::create(const VisionConfig& config,
                                                             const WeightGetter& get,
                                                             DeviceType device,
                                                             DataType activation) {
  KUIPER_RETURN_IF_ERROR(config.validate());
  const bool half = activation == DataType::kFp16 || activation == DataType::kBf16;
  if (activation != DataType::kFp32 && !(half && device == DeviceType::kCuda)) {
    return Status::Error(std::string("vision encoder: activations of ") + dtype_name(activation) +
                         " on " + device_name(device) +
                         " are not supported (fp32, or fp16 or bf16 on cuda)");
  }
  std::unique_ptr<VisionEncoder> enc(new VisionEncoder());
  enc->config_ = config;
  enc->device_ = device;
  enc->activation_ = activation;

  // Fetch every expected tensor, check its shape, and place it: on the GPU matrices are converted
  // to the activation dtype (cuBLAS multiplies like types) and everything is uploaded.
  std::vector<TensorSpec> specs = expected_vision_tensors(config);
  auto fetch = [&](const std::string& name, Tensor& out,
                   std::vector<int64_t> as_shape = {}) -> Status {
    const TensorSpec* spec = nullptr;
    for (const TensorSpec& s : specs) {
      if (s.name == name) spec = &s;
    }
    if (spec == nullptr) return Status::Error("vision encoder: no tensor spec for " + name);
    KUIPER_ASSIGN_OR_RETURN(Tensor host, get(name));
    if (!host.defined() || host.device() != DeviceType::kCpu ||
        (host.dtype() != DataType::kFp32 && host.dtype() != DataType::kFp16 &&
         host.dtype() != DataType::kBf16)) {
      return Status::Error("vision encoder: " + name + " must be a float CPU tensor, got " +
                           (host.defined() ? host.describe() : std::string("nothing")));
    }
    if (host.shape() != spec->shape) {
      return Status::Error("vision encoder: " + name + " has shape " +
                           shape_string(host.shape()) + ", the config implies " +
                           shape_string(spec->shape));
    }
    if (!as_shape.empty()) {
      KUIPER_ASSIGN_OR_RETURN(host, host.reshape(as_shape));
    }
    if (device == DeviceType::kCpu) {
      out = host;
      return Status::Ok();
    }
    Tensor src = host;
    if (host.ndim() == 2 && host.dtype() != activation) {
      KUIPER_ASSIGN_OR_RETURN(src, Tensor::empty(host.shape(), activation));
      KUIPER_RETURN_IF_ERROR(convert_elements(host.raw(), host.dtype(), src.raw(), activation,
                                              static_cast<size_t>(host.numel())));
    }
    KUIPER_ASSIGN_OR_RETURN(out, src.to(device));
    return Status::Ok();
  };
  // A row range [begin, begin + count) of a fetched tensor (q, k and v of the fused qkv).
  auto split = [](const Tensor& t, int64_t part, int64_t size) { return t.rows(part * size, size); };

  const std::string v = "model.visual.";
  const int64_t H = config.hidden_size;
  KUIPER_RETURN_IF_ERROR(fetch(v + "patch_embed.proj.weight", enc->patch_w_, {H, config.patch_dim()}));
  KUIPER_RETURN_IF_ERROR(fetch(v + "patch_embed.proj.bias", enc->patch_b_));
  {
    const std::string name = v + "pos_embed.weight";
    KUIPER_ASSIGN_OR_RETURN(Tensor table, get(name));
    const std::vector<int64_t> want{config.num_position_embeddings, H};
    if (!table.defined() || table.device() != DeviceType::kCpu || table.shape() != want) {
      return Status::Error("vision encoder: " + name + " must be a CPU tensor of shape " +
                           shape_string(want) + ", got " +
                           (table.defined() ? table.describe() : std::string("nothing")));
    }
    enc->pos_embed_.resize(static_cast<size_t>(table.numel()));
    KUIPER_RETURN_IF_ERROR(convert_elements(table.raw(), table.dtype(), enc->pos_embed_.data(),
                                            DataType::kFp32, enc->pos_embed_.size())
                               .With(name));
  }
  for (int64_t b = 0; b < config.depth; ++b) {
    const std::string p = v + "blocks." + std::to_string(b) + ".";
    Block blk;
    Tensor qkv_w, qkv_b;
    KUIPER_RETURN_IF_ERROR(fetch(p + "norm1.weight", blk.norm1_w));
    KUIPER_RETURN_IF_ERROR(fetch(p + "norm1.bias", blk.norm1_b));
    KUIPER_RETURN_IF_ERROR(fetch(p + "attn.qkv.weight", qkv_w));
    KUIPER_RETURN_IF_ERROR(fetch(p + "attn.qkv.bias", qkv_b));
    blk.q_w = split(qkv_w, 0, H);
    blk.k_w = split(qkv_w, 1, H);
    blk.v_w = split(qkv_w, 2, H);
    blk.q_b = split(qkv_b, 0, H);
    blk.k_b = split(qkv_b, 1, H);
    blk.v_b = split(qkv_b, 2, H);
    KUIPER_RETURN_IF_ERROR(fetch(p + "attn.proj.weight", blk.proj_w));
    KUIPER_RETURN_IF_ERROR(fetch(p + "attn.proj.bias", blk.proj_b));
    KUIPER_RETURN_IF_ERROR(fetch(p + "norm2.weight", blk.norm2_w));
    KUIPER_RETURN_IF_ERROR(fetch(p + "norm2.bias", blk.norm2_b));
    KUIPER_RETURN_IF_ERROR(fetch(p + "mlp.linear_fc1.weight", blk.fc1_w));
    KUIPER_RETURN_IF_ERROR(fetch(p + "mlp.linear_fc1.bias", blk.fc1_b));
    KUIPER_RETURN_IF_ERROR(fetch(p + "mlp.linear_fc2.weight", blk.fc2_w));
    KUIPER_RETURN_IF_ERROR(fetch(p + "mlp.linear_fc2.bias", blk.fc2_b));
    enc->blocks_.push_back(std::move(blk));
  }
  auto merger = [&](const std::string& p, bool postshuffle, Merger& m) -> Status {
    m.postshuffle_norm = postshuffle;
    KUIPER_RETURN_IF_ERROR(fetch(p + "norm.weight", m.norm_w));
    KUIPER_RETURN_IF_ERROR(fetch(p + "norm.bias", m.norm_b));
    KUIPER_RETURN_IF_ERROR(fetch(p + "linear_fc1.weight", m.fc1_w));
    KUIPER_RETURN_IF_ERROR(fetch(p + "linear_fc1.bias", m.fc1_b));
    KUIPER_RETURN_IF_ERROR(fetch(p + "linear_fc2.weight", m.fc2_w));
    KUIPER_RETURN_IF_ERROR(fetch(p + "linear_fc2.bias", m.fc2_b));
    return Status::Ok();
  };
  KUIPER_RETURN_IF_ERROR(merger(v + "merger.", false, enc->merger_));
  enc->deepstack_.resize(config.deepstack_visual_indexes.size());
  for (size_t i = 0; i < enc->deepstack_.size(); ++i) {
    KUIPER_RETURN_IF_ERROR(
        merger(v + "deepstack_merger_list." + std::to_string(i) + ".", true, enc->deepstack_[i]));
  }
  return enc;
}

// norm -> merge^2 patches per token -> fc1 -> GELU (exact erf, torch nn.GELU()) -> fc2. The
// deepstack mergers normalise the merged token, the final one each patch before merging; the
// merge itself is only a reshape, the patches of a token being consecutive rows.
Result<Tensor> VisionEncoder::run_merger(const Merger& m, const Tensor& x) const {
  const int64_t M = config_.merged_dim(), tokens = x.numel() / M;
  KUIPER_ASSIGN_OR_RETURN(Tensor normed, new_activation(x.shape(), activation_, device_));
  if (m.postshuffle_norm) {
    KUIPER_ASSIGN_OR_RETURN(Tensor merged, x.reshape({tokens, M}));
    KUIPER_ASSIGN_OR_RETURN(normed, normed.reshape({tokens, M}));
    KUIPER_RETURN_IF_ERROR(op::layernorm(merged, m.norm_w, m.norm_b, config_.layer_norm_eps, normed));
  } else {
    KUIPER_RETURN_IF_ERROR(op::layernorm(x, m.norm_w, m.norm_b, config_.layer_norm_eps, normed));
    KUIPER_ASSIGN_OR_RETURN(normed, normed.reshape({tokens, M}));
  }
  KUIPER_ASSIGN_OR_RETURN(Tensor hidden, new_activation({tokens, M}, activation_, device_));
  KUIPER_RETURN_IF_ERROR(op::matmul(normed, m.fc1_w, &m.fc1_b, hidden));
  KUIPER_RETURN_IF_ERROR(op::gelu(hidden, op::GeluKind::kErf, hidden));
  KUIPER_ASSIGN_OR_RETURN(Tensor out,
                          new_activation({tokens, config_.out_hidden_size}, activation_, device_));
  KUIPER_RETURN_IF_ERROR(op::matmul(hidden, m.fc2_w, &m.fc2_b, out));
  return out;
}

Result<ImageFeatures> VisionEncoder::forward(const Tensor& pixel_values,
                                             const std::vector<std::array<int64_t, 3>>& grids) {
  const VisionConfig& c = config_;
  const int64_t merge = c.spatial_merge_size, H = c.hidden_size, heads = c.num_heads;
  if (!pixel_values.defined() || pixel_values.device() != DeviceType::kCpu ||
      pixel_values.dtype() != DataType::kFp32 || pixel_values.ndim() != 2 ||
      pixel_values.dim(1) != c.patch_dim()) {
    return Status::Error("vision encoder: pixel_values must be CPU fp32 [patches, " +
                         std::to_string(c.patch_dim()) + "], got " +
                         (pixel_values.defined() ? pixel_values.describe() : std::string("nothing")));
  }
  if (grids.empty()) return Status::Error("vision encoder: no image grids");
  int64_t N = 0;
  for (const auto& g : grids) {
    if (g[0] <= 0 || g[1] <= 0 || g[2] <= 0 || g[1] % merge != 0 || g[2] % merge != 0) {
      return Status::Error("vision encoder: bad grid (" + std::to_string(g[0]) + ", " +
                           std::to_string(g[1]) + ", " + std::to_string(g[2]) +
                           "): t, h, w must be positive and h, w multiples of " +
                           std::to_string(merge));
    }
    N += g[0] * g[1] * g[2];
  }
  if (N != pixel_values.dim(0)) {
    return Status::Error("vision encoder: the grids hold " + std::to_string(N) +
                         " patches but pixel_values has " + std::to_string(pixel_values.dim(0)));
  }
  if (N > INT32_MAX) return Status::Error("vision encoder: too many patches");
  const DeviceType dev = device_;
  const DataType act = activation_;
  const int64_t side = static_cast<int64_t>(std::lround(std::sqrt(double(c.num_position_embeddings))));

  // Host-side layout: position embeddings, rotary positions, frame bounds.
  const std::vector<float> pos =
      vision::interpolated_position_embeddings(pos_embed_, side, H, merge, grids);
  KUIPER_ASSIGN_OR_RETURN(Tensor pos_t, upload(pos, {N, H}, DataType::kFp32, act, dev));
  KUIPER_ASSIGN_OR_RETURN(Tensor rot_pos, upload(vision::patch_positions(merge, grids), {N, 2},
                                                 DataType::kInt32, DataType::kInt32, dev));
  const std::vector<int32_t> cu_host = vision::frame_cu_seqlens(grids);
  KUIPER_ASSIGN_OR_RETURN(Tensor cu, upload(cu_host, {static_cast<int64_t>(cu_host.size())},
                                            DataType::kInt32, DataType::kInt32, dev));

  // Patch embedding + position embedding.
  Tensor pixels = pixel_values;
  if (act != DataType::kFp32 || dev != DeviceType::kCpu) {
    KUIPER_ASSIGN_OR_RETURN(pixels, Tensor::empty(pixel_values.shape(), act));
    KUIPER_RETURN_IF_ERROR(convert_elements(pixel_values.raw(), DataType::kFp32, pixels.raw(), act,
                                            static_cast<size_t>(pixel_values.numel())));
    KUIPER_ASSIGN_OR_RETURN(pixels, pixels.to(dev));
  }
  KUIPER_ASSIGN_OR_RETURN(Tensor x, new_activation({N, H}, act, dev));
  KUIPER_RETURN_IF_ERROR(op::matmul(pixels, patch_w_, &patch_b_, x));
  KUIPER_RETURN_IF_ERROR(op::add(x, pos_t, x));

  KUIPER_ASSIGN_OR_RETURN(Tensor h, new_activation({N, H}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(Tensor q, new_activation({N, H}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(Tensor k, new_activation({N, H}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(Tensor v, new_activation({N, H}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(Tensor attn, new_activation({N, H}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(Tensor mlp, new_activation({N, c.intermediate_size}, act, dev));
  KUIPER_ASSIGN_OR_RETURN(Tensor q3, q.reshape({N, heads, H / heads}));
  KUIPER_ASSIGN_OR_RETURN(Tensor k3, k.reshape({N, heads, H / heads}));
  constexpr double kRotaryTheta = 10000.0;

  ImageFeatures result;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const Block& L = blocks_[b];
    KUIPER_RETURN_IF_ERROR(op::layernorm(x, L.norm1_w, L.norm1_b, c.layer_norm_eps, h));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.q_w, &L.q_b, q));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.k_w, &L.k_b, k));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.v_w, &L.v_b, v));
    KUIPER_RETURN_IF_ERROR(op::rope_2d(q3, rot_pos, kRotaryTheta));
    KUIPER_RETURN_IF_ERROR(op::rope_2d(k3, rot_pos, kRotaryTheta));
    KUIPER_RETURN_IF_ERROR(op::varlen_attention(q, k, v, cu, heads, attn));
    KUIPER_RETURN_IF_ERROR(op::matmul(attn, L.proj_w, &L.proj_b, h));
    KUIPER_RETURN_IF_ERROR(op::add(x, h, x));
    KUIPER_RETURN_IF_ERROR(op::layernorm(x, L.norm2_w, L.norm2_b, c.layer_norm_eps, h));
    KUIPER_RETURN_IF_ERROR(op::matmul(h, L.fc1_w, &L.fc1_b, mlp));
    KUIPER_RETURN_IF_ERROR(op::gelu(mlp, op::GeluKind::kTanh, mlp));
    KUIPER_RETURN_IF_ERROR(op::matmul(mlp, L.fc2_w, &L.fc2_b, h));
    KUIPER_RETURN_IF_ERROR(op::add(x, h, x));
    for (size_t j = 0; j < c.deepstack_visual_indexes.size(); ++j) {
      if (c.deepstack_visual_indexes[j] != static_cast<int64_t>(b)) continue;
      KUIPER_ASSIGN_OR_RETURN(Tensor feature, run_merger(deepstack_[j], x));
      result.deepstack.push_back(std::move(feature));
    }
  }
  KUIPER_ASSIGN_OR_RETURN(result.embeds, run_merger(merger_, x));
  return result;
}

}  // namespace kuiper
