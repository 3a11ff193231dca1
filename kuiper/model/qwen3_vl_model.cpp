#include "kuiper/model/qwen3_vl_model.h"

#include <algorithm>
#include <numeric>

#include "kuiper/op/ops.h"

namespace kuiper {

Result<RopeIndex> qwen3_vl_rope_index(const std::vector<int32_t>& ids, int64_t image_token_id,
                                      int64_t merge,
                                      const std::vector<std::array<int64_t, 3>>& grids) {
  const int64_t T = static_cast<int64_t>(ids.size());
  if (merge <= 0) return Status::Error("rope index: spatial merge size must be positive");
  RopeIndex r;
  r.positions.assign(static_cast<size_t>(3 * T), 0);
  int64_t next = 0;  // the position the next text token takes: the running max + 1
  size_t image = 0;
  for (int64_t i = 0; i < T;) {
    if (ids[static_cast<size_t>(i)] != image_token_id) {
      for (int a = 0; a < 3; ++a) r.positions[static_cast<size_t>(a * T + i)] = static_cast<int32_t>(next);
      ++next;
      ++i;
      continue;
    }
    if (image == grids.size()) {
      return Status::Error("the prompt has image tokens beyond its " + std::to_string(grids.size()) +
                           " image(s) (token " + std::to_string(i) + ")");
    }
    const auto& g = grids[image];
    if (g[0] <= 0 || g[1] <= 0 || g[2] <= 0 || g[1] % merge != 0 || g[2] % merge != 0) {
      return Status::Error("image " + std::to_string(image) + ": grid (" + std::to_string(g[0]) +
                           ", " + std::to_string(g[1]) + ", " + std::to_string(g[2]) +
                           ") is not a positive grid with h and w multiples of the merge size " +
                           std::to_string(merge));
    }
    const int64_t gt = g[0], gh = g[1] / merge, gw = g[2] / merge, n = gt * gh * gw;
    int64_t run = 0;
    while (i + run < T && ids[static_cast<size_t>(i + run)] == image_token_id) ++run;
    if (run < n) {
      return Status::Error("image " + std::to_string(image) + " needs " + std::to_string(n) +
                           " image tokens but the prompt has " + std::to_string(run) +
                           " at token " + std::to_string(i));
    }
    for (int64_t t = 0; t < gt; ++t) {
      for (int64_t h = 0; h < gh; ++h) {
        for (int64_t w = 0; w < gw; ++w) {
          const size_t k = static_cast<size_t>(i + (t * gh + h) * gw + w);
          r.positions[k] = static_cast<int32_t>(next + t);
          r.positions[static_cast<size_t>(T) + k] = static_cast<int32_t>(next + h);
          r.positions[static_cast<size_t>(2 * T) + k] = static_cast<int32_t>(next + w);
        }
      }
    }
    r.spans.emplace_back(i, n);
    next += std::max({gt, gh, gw});
    i += n;
    ++image;
  }
  if (image != grids.size()) {
    return Status::Error("the prompt has tokens for " + std::to_string(image) + " image(s) but " +
                         std::to_string(grids.size()) + " were given");
  }
  r.delta = next - T;
  return r;
}

Qwen3VLModel::Qwen3VLModel(std::unique_ptr<QwenModel> text, std::unique_ptr<VisionEncoder> vision)
    : Model(text->config(), text->file_, text->options(), text->max_context()),
      text_(std::move(text)),
      vision_(std::move(vision)) {}

Qwen3VLModel::~Qwen3VLModel() = default;

Result<std::unique_ptr<Qwen3VLModel>> Qwen3VLModel::create(std::shared_ptr<ModelFile> file,
                                                           const ModelOptions& options) {
  if (file->config().arch != Architecture::kQwen3VL || !file->config().is_mrope()) {
    return Status::Error(file->path() + ": not a Qwen3-VL model file");
  }
  KUIPER_ASSIGN_OR_RETURN(std::unique_ptr<QwenModel> text, QwenModel::create(file, options));
  // The vision tower reads its weights from the same mapped file (the model file checked them).
  const ModelFile* f = file.get();
  Result<std::unique_ptr<VisionEncoder>> vision = VisionEncoder::create(
      *file->config().vision, [f](const std::string& name) { return f->tensor(name); },
      options.device, options.activation);
  if (!vision.ok()) return vision.status().With(file->path() + ": vision tower");
  return std::unique_ptr<Qwen3VLModel>(
      new Qwen3VLModel(std::move(text), std::move(vision).value()));
}

int64_t Qwen3VLModel::rope_delta_at(int64_t position) const {
  int64_t delta = 0;
  for (const auto& [first, d] : deltas_) {
    if (first <= position) delta = d;
  }
  return delta;
}

void Qwen3VLModel::truncate_deltas(int64_t start) {
  deltas_.erase(std::remove_if(deltas_.begin(), deltas_.end(),
                               [start](const auto& e) { return e.first > start; }),
                deltas_.end());
}

Result<Tensor> Qwen3VLModel::forward(const std::vector<int32_t>& ids, int64_t start,
                                     bool all_logits) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == config_.image_token_id) {
      return Status::Error("forward: token " + std::to_string(i) +
                           " is an image token; prompts with images go through "
                           "forward_with_images");
    }
  }
  return run(ids, start, all_logits, nullptr, nullptr);
}

namespace {

// t as the model's activation dtype on its device (a copy unless it already is).
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

Result<VisionOutput> Qwen3VLModel::encode_images(const std::vector<ProcessedImage>& images) {
  const VisionConfig& vc = vision_->config();
  int64_t patches = 0;
  std::vector<std::array<int64_t, 3>> grids;
  for (size_t i = 0; i < images.size(); ++i) {
    const ProcessedImage& im = images[i];
    const int64_t grid_patches = im.grid[0] * im.grid[1] * im.grid[2];
    if (im.patch_dim != vc.patch_dim() || im.patches != grid_patches ||
        static_cast<int64_t>(im.pixel_values.size()) != im.patches * im.patch_dim) {
      return Status::Error("image " + std::to_string(i) + ": " + std::to_string(im.patches) +
                           " patches of " + std::to_string(im.patch_dim) + " values for grid (" +
                           std::to_string(im.grid[0]) + ", " + std::to_string(im.grid[1]) + ", " +
                           std::to_string(im.grid[2]) + "); the vision tower takes patches of " +
                           std::to_string(vc.patch_dim()));
    }
    patches += im.patches;
    grids.push_back(im.grid);
  }
  if (images.empty()) return Status::Error("encode_images: no images");
  KUIPER_ASSIGN_OR_RETURN(Tensor pixels, Tensor::empty({patches, vc.patch_dim()}, DataType::kFp32));
  float* dst = pixels.data<float>();
  for (const ProcessedImage& im : images) {
    dst = std::copy(im.pixel_values.begin(), im.pixel_values.end(), dst);
  }
  return vision_->forward(pixels, grids);
}

Result<Tensor> Qwen3VLModel::forward_with_images(const std::vector<int32_t>& ids, int64_t start,
                                                 const std::vector<ProcessedImage>& images,
                                                 bool all_logits) {
  if (images.empty()) return forward(ids, start, all_logits);
  std::vector<std::array<int64_t, 3>> grids;
  for (const ProcessedImage& im : images) grids.push_back(im.grid);
  // The token layout first: a prompt that does not fit its images fails before the tower runs.
  Result<RopeIndex> layout =
      qwen3_vl_rope_index(ids, config_.image_token_id, config_.vision->spatial_merge_size, grids);
  if (!layout.ok()) return layout.status();
  KUIPER_ASSIGN_OR_RETURN(VisionOutput vision, encode_images(images));
  return forward_with_vision_embeds(ids, start, grids, vision.embeds, vision.deepstack,
                                    all_logits);
}

Result<Tensor> Qwen3VLModel::forward_with_vision_embeds(
    const std::vector<int32_t>& ids, int64_t start,
    const std::vector<std::array<int64_t, 3>>& grids, const Tensor& embeds,
    const std::vector<Tensor>& deepstack, bool all_logits) {
  const ModelConfig& c = config_;
  const int64_t merge = c.vision->spatial_merge_size;
  KUIPER_ASSIGN_OR_RETURN(RopeIndex index,
                          qwen3_vl_rope_index(ids, c.image_token_id, merge, grids));
  int64_t tokens = 0;
  for (const auto& span : index.spans) tokens += span.second;
  auto check = [&](const Tensor& t, const std::string& what) -> Status {
    if (!t.defined() || t.ndim() != 2 || t.dim(0) != tokens || t.dim(1) != c.hidden_size) {
      return Status::Error(what + " must be [" + std::to_string(tokens) + ", " +
                           std::to_string(c.hidden_size) + "] for the prompt's image tokens, got " +
                           (t.defined() ? t.describe() : std::string("nothing")));
    }
    return Status::Ok();
  };
  KUIPER_RETURN_IF_ERROR(check(embeds, "vision embeddings"));
  if (static_cast<int64_t>(deepstack.size()) > c.num_layers) {
    return Status::Error("more deepstack features (" + std::to_string(deepstack.size()) +
                         ") than decoder layers (" + std::to_string(c.num_layers) + ")");
  }
  const DataType act = options_.activation;
  const DeviceType dev = options_.device;
  KUIPER_ASSIGN_OR_RETURN(Tensor emb, to_activation(embeds, act, dev));
  std::vector<Tensor> ds;
  for (size_t k = 0; k < deepstack.size(); ++k) {
    KUIPER_RETURN_IF_ERROR(check(deepstack[k], "deepstack feature " + std::to_string(k)));
    KUIPER_ASSIGN_OR_RETURN(Tensor d, to_activation(deepstack[k], act, dev));
    ds.push_back(std::move(d));
  }

  // Positions continue the cache: this prompt's first token sits at start + the delta there.
  truncate_deltas(start);
  const int64_t base = start + rope_delta_at(start);
  for (int32_t& p : index.positions) p += static_cast<int32_t>(base);

  // The vision rows replace the image-pad embeddings; deepstack k is added after layer k. x holds
  // prompt rows [x0, x0 + x.dim(0)) (one prefill piece): each image's overlap with them.
  auto hook = [&](int64_t layer, Tensor& x, int64_t x0) -> Status {
    if (layer >= static_cast<int64_t>(ds.size())) return Status::Ok();
    int64_t row = 0;  // the image's first row in emb and ds
    for (const auto& [first, count] : index.spans) {
      const int64_t lo = std::max(first, x0), hi = std::min(first + count, x0 + x.dim(0));
      if (lo < hi) {
        Tensor dst = x.rows(lo - x0, hi - lo);
        const int64_t src = row + (lo - first);
        if (layer < 0) {
          KUIPER_RETURN_IF_ERROR(dst.copy_from(emb.rows(src, hi - lo)));
        } else {
          KUIPER_RETURN_IF_ERROR(
              op::add(dst, ds[static_cast<size_t>(layer)].rows(src, hi - lo), dst));
        }
      }
      row += count;
    }
    return Status::Ok();
  };
  const int64_t delta_before = rope_delta_at(start);
  KUIPER_ASSIGN_OR_RETURN(Tensor logits, run(ids, start, all_logits, &index.positions, hook));
  // Tokens after each image (in this prompt and later) sit at cache position + the delta it
  // leaves: one entry per image, so a prompt rewritten from between two images keeps the first
  // one's delta. The t row of positions gives it for a token after the image in this prompt.
  for (const auto& [first, count] : index.spans) {
    const int64_t after = first + count;
    const int64_t delta = after < static_cast<int64_t>(ids.size())
                              ? index.positions[static_cast<size_t>(after)] - (start + after)
                              : delta_before + index.delta;
    deltas_.emplace_back(start + after, delta);
  }
  return logits;
}

Result<Tensor> Qwen3VLModel::run(const std::vector<int32_t>& ids, int64_t start, bool all_logits,
                                 const std::vector<int32_t>* rope3,
                                 const HiddenHook& hook) {
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
  truncate_deltas(start);
  std::vector<int32_t> slots(static_cast<size_t>(T));
  std::iota(slots.begin(), slots.end(), static_cast<int32_t>(start));
  std::vector<int32_t> shifted;
  if (rope3 == nullptr) {  // text: cache position + delta on all three axes
    const int32_t delta = static_cast<int32_t>(rope_delta_at(start));
    shifted.reserve(static_cast<size_t>(3 * T));
    for (int a = 0; a < 3; ++a) {
      for (int32_t s : slots) shifted.push_back(s + delta);
    }
    rope3 = &shifted;
  }
  const int64_t logit_rows = all_logits ? T : 1;
  QwenModel& m = *text_;
  // Prefill pieces as QwenModel::forward makes them: the workspace holds one piece (and every
  // row's logits when all_logits), each piece attending to the cache the earlier ones wrote.
  const int64_t chunk =
      T > 1 && m.options_.prefill_chunk > 0 ? std::min(m.options_.prefill_chunk, T) : T;
  if (T > 1 && (m.prefill_ws_.capacity < chunk || m.prefill_ws_.logits.dim(0) < logit_rows)) {
    m.prefill_ws_ = QwenModel::Workspace();  // release the old buffers first
    KUIPER_ASSIGN_OR_RETURN(m.prefill_ws_, m.make_workspace(chunk, logit_rows));
  }
  const QwenModel::Workspace& ws = T == 1 ? m.decode_ws_ : m.prefill_ws_;
  auto upload = [](const Tensor& dst, const int32_t* src, int64_t n) {
    Tensor host = Tensor::view(const_cast<int32_t*>(src), {n}, DataType::kInt32, DeviceType::kCpu);
    Tensor d = dst;
    return d.copy_from(host);
  };
  std::vector<int32_t> piece_rope;
  for (int64_t c0 = 0; c0 < T; c0 += chunk) {
    const int64_t n = std::min(chunk, T - c0);
    // The piece's [3, n] rotary positions, and whether its three axes agree (text only).
    piece_rope.clear();
    for (int a = 0; a < 3; ++a) {
      const auto axis = rope3->begin() + a * T + c0;
      piece_rope.insert(piece_rope.end(), axis, axis + n);
    }
    bool axes_equal = true;
    for (int64_t t = 0; t < n && axes_equal; ++t) {
      const int32_t p = piece_rope[static_cast<size_t>(t)];
      axes_equal = piece_rope[static_cast<size_t>(n + t)] == p &&
                   piece_rope[static_cast<size_t>(2 * n + t)] == p;
    }
    KUIPER_RETURN_IF_ERROR(upload(ws.ids.rows(0, n), ids.data() + c0, n));
    KUIPER_RETURN_IF_ERROR(upload(ws.positions.rows(0, n), slots.data() + c0, n));
    KUIPER_RETURN_IF_ERROR(upload(ws.rope_positions.rows(0, 3 * n), piece_rope.data(), 3 * n));
    m.rope_axes_equal_ = axes_equal;

    // The decode graph is captured (and replayed) only for text tokens: it holds the fused
    // kernel, which rotates every axis by the first one's position.
    if (T == 1 && m.graph_ != nullptr && !hook && axes_equal) {
      // The graph reads the token, its cache row and its rotary positions from device memory.
      KUIPER_RETURN_IF_ERROR(m.run_decode_graph(start));
      continue;
    }
    if (hook) {
      m.hidden_hook_ = [&hook, c0](int64_t layer, Tensor& x) { return hook(layer, x, c0); };
    }
    const bool last = c0 + n == T;
    const int64_t rows = all_logits ? n : (last ? 1 : 0);
    Status s = m.run_forward(ws, n, start + c0, rows, all_logits ? c0 : 0);
    m.hidden_hook_ = nullptr;
    KUIPER_RETURN_IF_ERROR(s);
  }
  return ws.logits.rows(0, logit_rows);
}

}  // namespace kuiper
