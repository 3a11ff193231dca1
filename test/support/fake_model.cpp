#include "support/fake_model.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace kuiper::test {

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t float_bits(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

}  // namespace

std::unique_ptr<FakeModel> FakeModel::create(const FakeModelShape& shape) {
  ModelConfig c;
  c.arch = shape.vision ? Architecture::kQwen3VL : Architecture::kQwen3;
  c.vocab_size = shape.vocab;
  c.hidden_size = 2;
  c.num_layers = 1;
  c.eos_token_ids = shape.eos_token_ids;
  c.max_position_embeddings = shape.max_context;
  if (shape.vision) {
    c.mrope_section = {1, 1, 1};
    c.mrope_interleaved = true;
    c.image_token_id = shape.vocab - 1;
    VisionConfig v;
    v.spatial_merge_size = 2;
    c.vision = v;
  }
  ModelOptions options;
  options.max_context = shape.max_context;
  return std::unique_ptr<FakeModel>(new FakeModel(c, options, shape.block_size, shape.blocks));
}

FakeModel::FakeModel(ModelConfig config, const ModelOptions& options, int64_t block_size,
                     int64_t blocks)
    : Model(std::move(config), nullptr, options, options.max_context),
      rows_(static_cast<size_t>(block_size * blocks), 0) {
  kv_block_size_ = block_size;
  kv_blocks_ = blocks;
}

Result<ImageFeatures> FakeModel::encode_images(const ImagePixels& images) {
  // Row k of an image: a hash of its pixels and k, so other pixels give other features.
  const int64_t merge = config_.vision->spatial_merge_size;
  const int64_t patch_dim = images.values.dim(1);
  int64_t rows = 0;
  for (const auto& g : images.grids) rows += g[0] * g[1] * g[2] / (merge * merge);
  ImageFeatures out;
  KUIPER_ASSIGN_OR_RETURN(out.embeds, Tensor::empty({rows, config_.hidden_size}, DataType::kFp32));
  const float* pixels = images.values.data<float>();
  float* embeds = out.embeds.data<float>();
  int64_t row = 0;
  for (const auto& g : images.grids) {
    const int64_t patches = g[0] * g[1] * g[2];
    uint64_t h = 0;
    for (int64_t i = 0; i < patches * patch_dim; ++i) h = mix(h ^ float_bits(pixels[i]));
    pixels += patches * patch_dim;
    for (int64_t k = 0; k < patches / (merge * merge); ++k, ++row) {
      for (int64_t j = 0; j < config_.hidden_size; ++j) {
        embeds[row * config_.hidden_size + j] = static_cast<float>(mix(h + k * 7 + j) >> 40);
      }
    }
    ++encoded_images_;
  }
  return out;
}

Result<Tensor> FakeModel::run_batch(Span<const SequenceInput> batch, const Tensor* tokens) {
  if (tokens != nullptr) {
    ++fed_steps_;
    const auto host = [](const SequenceInput& s) { return s.fed < 0; };
    if (std::any_of(batch.begin(), batch.end(), host)) ++mixed_fed_steps_;
  }
  const int64_t V = config_.vocab_size, bs = kv_block_size();
  int64_t rows = 0;
  for (const SequenceInput& s : batch) rows += logit_rows(s);
  KUIPER_ASSIGN_OR_RETURN(Tensor logits, Tensor::empty({std::max<int64_t>(rows, 1), V},
                                                       DataType::kFp32));
  std::vector<std::pair<int64_t, int64_t>> spans;
  int64_t row = 0;
  for (size_t entry = 0; entry < batch.size(); ++entry) {
    const SequenceInput& s = batch[entry];
    const int64_t T = static_cast<int64_t>(s.tokens.size());
    spans.emplace_back(s.start, T);
    auto cell = [&](int64_t position) -> uint64_t& {
      return rows_[static_cast<size_t>(s.blocks[static_cast<size_t>(position / bs)] * bs +
                                       position % bs)];
    };
    // Writes every row of the span, then reads back the prefix of each row that wants logits.
    int64_t pad = 0;
    for (int64_t t = 0; t < T; ++t) {
      // A fed entry's last token is read from the fed tokens; its own is a placeholder.
      const int32_t id = s.fed >= 0 && t == T - 1 ? tokens->data<int32_t>()[s.fed]
                                                  : s.tokens[static_cast<size_t>(t)];
      uint64_t what = static_cast<uint64_t>(id);
      if (s.image != nullptr && id == config_.image_token_id) {
        what = (1ull << 40) | float_bits(s.image->embeds.data<float>()[(s.image_row + pad++) *
                                                                      config_.hidden_size]);
      }
      uint64_t where = mix(static_cast<uint64_t>(s.start + t + s.rope_offset));
      if (!s.rope_positions.empty()) {
        where = 0;
        for (int64_t a = 0; a < 3; ++a) {
          where = mix(where ^ static_cast<uint64_t>(
                                  s.rope_positions[static_cast<size_t>(a * T + t)]));
        }
        if (s.rope_positions[static_cast<size_t>(t)] ==
                s.rope_positions[static_cast<size_t>(T + t)] &&
            s.rope_positions[static_cast<size_t>(t)] ==
                s.rope_positions[static_cast<size_t>(2 * T + t)]) {
          // Equal axes are the 1-D position: the same row either way of giving it.
          where = mix(static_cast<uint64_t>(s.rope_positions[static_cast<size_t>(t)]));
        }
      }
      cell(s.start + t) = (mix(what) ^ mix(where ^ 0x5555)) | 1;  // never 0
    }
    for (int64_t t = 0; t < T; ++t) {
      const bool wanted =
          s.logits == LogitRows::kAll || (s.logits == LogitRows::kLast && t == T - 1);
      if (!wanted) continue;
      uint64_t h = 0;
      for (int64_t p = 0; p <= s.start + t; ++p) {
        if (cell(p) == 0) {
          return Status::Error("fake model: position " + std::to_string(p) + " of a sequence at " +
                               std::to_string(s.start) + " was never written");
        }
        h = mix(h ^ cell(p));
      }
      float* out = logits.data<float>() + row * V;
      for (int64_t v = 0; v < V; ++v) {
        out[v] = static_cast<float>(mix(h ^ static_cast<uint64_t>(v)) >> 40) * 0x1.0p-21f;
      }
      // As in a real model, an image-pad token is never what comes next.
      if (config_.image_token_id >= 0) out[config_.image_token_id] = -100.0f;
      ++row;
    }
  }
  batches_.push_back(std::move(spans));
  return logits.rows(0, rows);
}

}  // namespace kuiper::test
