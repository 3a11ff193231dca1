// Qwen3-VL against Hugging Face transformers (golden.safetensors of shared/fixtures/qwen3-vl-tiny):
// the 3-D rotary positions of the image prompt, the text-only chat prompt, and the image prompt
// with the golden vision tower outputs (embeddings and deepstack features): last-position logits,
// top ids at every position, and the greedy continuation, which runs through decode with the
// rope delta; then the whole path from the golden pixel values and from test_image.png through
// the image processor and the vision tower (the runtime's encode_image_span). CPU fp32 always;
// the same on CUDA fp32 (eager and CUDA-graph decode) in Cuda* tests, and bf16 against
// transformers' bf16 (golden_bf16.safetensors) for every attention kind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kuiper/base/allocator.h"
#include "kuiper/model/model.h"
#include "kuiper/model/rope_index.h"
#include "kuiper/runtime/vision_input.h"
#include "support/assertions.h"
#include "support/cli.h"
#include "support/fixture_checkpoint.h"
#include "support/golden.h"
#include "support/paths.h"
#include "support/tensors.h"

namespace kuiper::test {
namespace {

const char kFixture[] = "qwen3-vl-tiny";

Tensor golden_tensor(const Golden& g, const std::string& name) {
  const GoldenTensor& t = g.at(name);
  Tensor out = Tensor::empty(t.shape, DataType::kFp32).value();
  std::copy(t.f32.begin(), t.f32.end(), out.data<float>());
  return out;
}

std::array<int64_t, 3> golden_grid(const Golden& g, const std::string& name) {
  const std::vector<int32_t>& v = g.at(name).i32;
  return {v[0], v[1], v[2]};
}

std::unique_ptr<Model> load_vl(const ModelOptions& options,
                               DataType file_dtype = DataType::kFp32) {
  const std::string path = converted_fixture(kFixture, file_dtype);
  Result<std::unique_ptr<Model>> model = Model::load(path, options);
  EXPECT_OK(model);
  return model.ok() ? std::move(model).value() : nullptr;
}

// Blocks 0, 1, 2, ...: a sequence with the pool to itself (only those its positions reach are read).
const std::vector<int32_t>& first_blocks() {
  static const std::vector<int32_t> blocks = [] {
    std::vector<int32_t> b(1 << 16);
    for (size_t j = 0; j < b.size(); ++j) b[j] = static_cast<int32_t>(j);
    return b;
  }();
  return blocks;
}

// A span of one sequence in KV blocks 0, 1, 2, ... at 1-D positions shifted by rope_offset.
SequenceInput span_input(const std::vector<int32_t>& ids, int64_t start, LogitRows rows,
                         int64_t rope_offset = 0) {
  SequenceInput s;
  s.tokens = ids;
  s.start = start;
  s.blocks = first_blocks();
  s.logits = rows;
  s.rope_offset = rope_offset;
  return s;
}

Result<Tensor> forward_one(Model& model, const SequenceInput& s) {
  return model.forward(Span<const SequenceInput>(&s, 1));
}

// The image prompt `ids` at cache position 0 with the images' `features`: its 3-D positions from
// qwen3_vl_rope_index. Returns the logits; `index` gets the positions and the rope delta.
Result<Tensor> forward_image_prompt(Model& model, const std::vector<int32_t>& ids,
                                    const std::vector<std::array<int64_t, 3>>& grids,
                                    const ImageFeatures& features, LogitRows rows,
                                    RopeIndex* index) {
  const ModelConfig& c = model.config();
  KUIPER_ASSIGN_OR_RETURN(*index, qwen3_vl_rope_index(ids, c.image_token_id,
                                                      c.vision->spatial_merge_size, grids));
  SequenceInput s = span_input(ids, 0, rows);
  s.rope_positions = index->positions;
  s.image = &features;
  return forward_one(model, s);
}

// Every position's top ids against the golden ones where the golden ranking is unambiguous, and
// the last position's logits within 1e-4 (max abs error over max abs value).
void expect_logits_match(const std::vector<float>& all, const Golden& g, const std::string& p,
                         size_t V) {
  const size_t T = g.at(p + ".ids").i32.size();
  ASSERT_EQ(all.size(), T * V);
  const std::vector<float>& last = g.at(p + ".logits_last").f32;
  const double err = relative_max_error(all.data() + (T - 1) * V, last.data(), V);
  EXPECT_LE(err, 1e-4);
  std::printf("[ measured ] %s: last-position logits max rel error %.3g\n", p.c_str(), err);
  const GoldenTensor& top_ids = g.at(p + ".top_ids");
  const GoldenTensor& top_vals = g.at(p + ".top_vals");
  int compared = 0;
  for (size_t t = 0; t < T; ++t) {
    const std::vector<int32_t> ours = top_k(all.data() + t * V, V, 8);
    const int32_t* gid = top_ids.i32.data() + t * 8;
    const float* gval = top_vals.f32.data() + t * 8;
    for (int r = 0; r < 7; ++r) {
      const bool clear = (r == 0 || gval[r - 1] - gval[r] > 1e-4f) && gval[r] - gval[r + 1] > 1e-4f;
      if (!clear) continue;
      EXPECT_EQ(ours[r], gid[r]) << p << " position " << t << " rank " << r;
      ++compared;
    }
  }
  EXPECT_GT(compared, static_cast<int>(T));
}

// Teacher-forced greedy decode from `logits` (the prompt's last row): each step feeds the golden
// token at the next cache position (rotating at it + rope_offset, the delta the prompt's images
// leave) and must pick the golden token where its margin is clear.
void expect_greedy(Model& model, Result<Tensor> logits, const Golden& g, const std::string& p,
                   int64_t rope_offset) {
  const std::vector<int32_t>& greedy = g.at(p + ".greedy").i32;
  const std::vector<float>& margin = g.at(p + ".greedy_margin").f32;
  const int64_t T = static_cast<int64_t>(g.at(p + ".ids").i32.size());
  const size_t V = static_cast<size_t>(model.config().vocab_size);
  int checked = 0;
  for (size_t step = 0; step < greedy.size(); ++step) {
    ASSERT_OK(logits);
    const std::vector<float> row = host_floats(*logits);
    ASSERT_EQ(row.size(), V);
    if (margin[step] > 1e-2f) {
      EXPECT_EQ(top_k(row.data(), V, 1)[0], greedy[step]) << p << " step " << step;
      ++checked;
    }
    const std::vector<int32_t> token = {greedy[step]};
    logits = forward_one(model, span_input(token, T + static_cast<int64_t>(step), LogitRows::kLast,
                                           rope_offset));
  }
  EXPECT_GT(checked, static_cast<int>(greedy.size()) / 2);
}

TEST(VlRopeIndex, MatchesGoldenPositionIds) {
  Golden g = Golden::load(kFixture);
  const std::vector<int32_t>& ids = g.at("img.ids").i32;
  const ModelConfig config =
      ModelConfig::from_hf(nlohmann::json::parse(
                               read_text(fixtures_dir() + "/" + kFixture + "/config.json")))
          .value();
  for (const char* grid : {"image.grid_thw_fast", "image.grid_thw_slow"}) {
    Result<RopeIndex> r = qwen3_vl_rope_index(ids, config.image_token_id,
                                              config.vision->spatial_merge_size,
                                              {golden_grid(g, grid)});
    ASSERT_OK(r);
    EXPECT_EQ(r->positions, g.at("img.position_ids").i32) << grid;
    const int32_t max = *std::max_element(r->positions.begin(), r->positions.end());
    EXPECT_EQ(r->delta, max + 1 - static_cast<int64_t>(ids.size()));
    EXPECT_LT(r->delta, 0);  // 70 image tokens span a 7x10 grid: later positions move back
    ASSERT_EQ(r->spans.size(), 1u);
    EXPECT_EQ(r->spans[0].second, 70);
    EXPECT_EQ(ids[static_cast<size_t>(r->spans[0].first) - 1], config.vision_start_token_id);
    EXPECT_EQ(ids[static_cast<size_t>(r->spans[0].first + 70)], config.vision_end_token_id);
  }
}

TEST(VlRopeIndex, TextIsArangeAndMismatchesAreErrors) {
  const int32_t pad = 9;
  Result<RopeIndex> text = qwen3_vl_rope_index({1, 2, 3}, pad, 2, {});
  ASSERT_OK(text);
  EXPECT_EQ(text->positions, std::vector<int32_t>({0, 1, 2, 0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(text->delta, 0);

  // Two images, (1, 4, 6) -> 2x3 merged and (2, 2, 2) -> 2 frames of 1x1, between text.
  std::vector<int32_t> ids = {5, pad, pad, pad, pad, pad, pad, 6, pad, pad, 7};
  Result<RopeIndex> two = qwen3_vl_rope_index(ids, pad, 2, {{1, 4, 6}, {2, 2, 2}});
  ASSERT_OK(two);
  EXPECT_EQ(two->positions, std::vector<int32_t>({0, 1, 1, 1, 1, 1, 1, 4, 5, 6, 7,    // t
                                                  0, 1, 1, 1, 2, 2, 2, 4, 5, 5, 7,    // h
                                                  0, 1, 2, 3, 1, 2, 3, 4, 5, 5, 7}));  // w
  EXPECT_EQ(two->delta, 8 - 11);
  EXPECT_EQ(two->spans, (std::vector<std::pair<int64_t, int64_t>>{{1, 6}, {8, 2}}));

  EXPECT_EQ(qwen3_vl_rope_index(ids, pad, 2, {{1, 4, 6}}).status().message(),
            "the prompt has image tokens beyond its 1 image(s) (token 8)");
  EXPECT_EQ(qwen3_vl_rope_index(ids, pad, 2, {{1, 4, 6}, {2, 2, 2}, {1, 2, 2}}).status().message(),
            "the prompt has tokens for 2 image(s) but 3 were given");
  EXPECT_EQ(qwen3_vl_rope_index(ids, pad, 2, {{1, 4, 8}, {2, 2, 2}}).status().message(),
            "image 0 needs 8 image tokens but the prompt has 6 at token 1");
  EXPECT_FALSE(qwen3_vl_rope_index(ids, pad, 2, {{1, 3, 6}, {2, 2, 2}}).ok());
}

ImageFeatures golden_features(const Golden& g) {
  return {golden_tensor(g, "image.vision_embeds"),
          {golden_tensor(g, "image.deepstack0"), golden_tensor(g, "image.deepstack1")}};
}

// The golden checks on one device.
void text_only_chat(const ModelOptions& options) {
  Golden g = Golden::load(kFixture);
  auto model = load_vl(options);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t>& ids = g.at("chat.ids").i32;
  Result<Tensor> logits = model->forward(ids, 0, true);
  ASSERT_OK(logits);
  expect_logits_match(host_floats(*logits), g, "chat",
                      static_cast<size_t>(model->config().vocab_size));
}

void image_prompt_with_golden_vision(const ModelOptions& options) {
  Golden g = Golden::load(kFixture);
  auto model = load_vl(options);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t>& ids = g.at("img.ids").i32;
  const std::vector<std::array<int64_t, 3>> grids = {golden_grid(g, "image.grid_thw_fast")};
  const ImageFeatures features = golden_features(g);
  const size_t V = static_cast<size_t>(model->config().vocab_size);
  RopeIndex index;
  Result<Tensor> all = forward_image_prompt(*model, ids, grids, features, LogitRows::kAll, &index);
  ASSERT_OK(all);
  expect_logits_match(host_floats(*all), g, "img", V);

  const std::vector<int32_t>& pos = g.at("img.position_ids").i32;
  const int64_t T = static_cast<int64_t>(ids.size());
  EXPECT_EQ(index.delta, *std::max_element(pos.begin(), pos.end()) + 1 - T);

  // Again with only the last row, then decode: the delta carries into every step.
  Result<Tensor> last = forward_image_prompt(*model, ids, grids, features, LogitRows::kLast, &index);
  ASSERT_OK(last);
  expect_greedy(*model, std::move(last), g, "img", index.delta);
}

ProcessedImage golden_pixels(const Golden& g, const std::string& kind) {
  ProcessedImage im;
  const GoldenTensor& t = g.at("image.pixel_values_" + kind);
  im.pixel_values = t.f32;
  im.patches = t.shape[0];
  im.patch_dim = t.shape[1];
  im.grid = golden_grid(g, "image.grid_thw_" + kind);
  return im;
}

// The whole path: pixel values through the vision tower, then the decoder. `tolerance` bounds
// the last-position logits' error; the greedy continuation is checked as above.
void image_prompt_from_pixels(const ModelOptions& options, const ProcessedImage& image,
                              double tolerance) {
  Golden g = Golden::load(kFixture);
  auto model = load_vl(options);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t>& ids = g.at("img.ids").i32;
  const size_t V = static_cast<size_t>(model->config().vocab_size);

  // The tower's output against the golden one, for the record.
  Result<ImagePixels> pixels = image_pixels({image});
  ASSERT_OK(pixels);
  Result<ImageFeatures> vision = model->encode_images(*pixels);
  ASSERT_OK(vision);
  const std::vector<float> want = g.at("image.vision_embeds").f32;
  const std::vector<float> got = host_floats(vision->embeds);
  ASSERT_EQ(got.size(), want.size());
  std::printf("[ measured ] vision embeds max rel error %.3g\n",
              relative_max_error(got.data(), want.data(), want.size()));

  Result<ImageSpan> span = encode_image_span(*model, ids, 0, {image});
  ASSERT_OK(span);
  SequenceInput prompt = span_input(ids, 0, LogitRows::kLast);
  prompt.rope_positions = span->index.positions;
  prompt.image = &span->features;
  Result<Tensor> last = forward_one(*model, prompt);
  ASSERT_OK(last);
  const std::vector<float> row = host_floats(*last);
  const std::vector<float>& golden_last = g.at("img.logits_last").f32;
  ASSERT_EQ(row.size(), V);
  const double err = relative_max_error(row.data(), golden_last.data(), V);
  std::printf("[ measured ] img from pixels: last-position logits max rel error %.3g\n", err);
  EXPECT_LE(err, tolerance);
  expect_greedy(*model, std::move(last), g, "img", span->index.delta);
}

Result<ProcessedImage> test_image_pixels(const Model& model) {
  KUIPER_ASSIGN_OR_RETURN(Image image, load_image(fixtures_dir() + "/" + kFixture + "/test_image.png"));
  KUIPER_ASSIGN_OR_RETURN(ImageProcessorConfig config,
                          ImageProcessorConfig::from_json(
                              model.file()->metadata().at("preprocessor_config")));
  return preprocess_image(image, config);
}

void image_prompt_from_png(const ModelOptions& options) {
  auto model = load_vl(options);
  ASSERT_NE(model, nullptr);
  Result<ProcessedImage> image = test_image_pixels(*model);
  ASSERT_OK(image);
  image_prompt_from_pixels(options, *image, 1e-3);
}

// Without the image's vision rows the model must not match: the test can fail.
void wrong_vision_rows_do_not_match(const ModelOptions& options) {
  Golden g = Golden::load(kFixture);
  auto model = load_vl(options);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t>& ids = g.at("img.ids").i32;
  const ImageFeatures embeds_only = {golden_tensor(g, "image.vision_embeds"), {}};
  RopeIndex index;
  Result<Tensor> no_deepstack =
      forward_image_prompt(*model, ids, {golden_grid(g, "image.grid_thw_fast")}, embeds_only,
                           LogitRows::kLast, &index);
  ASSERT_OK(no_deepstack);
  const std::vector<float>& want = g.at("img.logits_last").f32;
  EXPECT_GT(relative_max_error(host_floats(*no_deepstack).data(), want.data(), want.size()), 1e-3);
}

TEST(VlModel, TextOnlyChatMatchesHuggingFace) { text_only_chat(ModelOptions{}); }

TEST(VlModel, ImagePromptWithGoldenVisionEmbedsMatchesHuggingFace) {
  image_prompt_with_golden_vision(ModelOptions{});
}

TEST(VlModel, ImagePromptFromGoldenPixelValuesMatchesHuggingFace) {
  image_prompt_from_pixels(ModelOptions{}, golden_pixels(Golden::load(kFixture), "fast"), 1e-4);
}

TEST(VlModel, ImagePromptFromTestImagePngMatchesHuggingFace) {
  image_prompt_from_png(ModelOptions{});
}

// Prefill in pieces smaller than the image (16 tokens; the image has 70 pad tokens): each piece
// takes its share of the vision rows and deepstack features, every position's logits still
// match, and so does the greedy continuation.
TEST(VlModel, ChunkedPrefillMatchesHuggingFace) {
  ModelOptions options;
  options.prefill_chunk = 16;
  image_prompt_with_golden_vision(options);
  text_only_chat(options);
}

TEST(VlModel, ImagesThatDoNotFitThePromptAreErrors) {
  auto model = load_vl(ModelOptions{});
  ASSERT_NE(model, nullptr);
  Golden g = Golden::load(kFixture);
  const std::vector<int32_t>& ids = g.at("img.ids").i32;
  ProcessedImage image = golden_pixels(g, "fast");
  Result<ImageSpan> r = encode_image_span(*model, ids, 0, {image, image});
  EXPECT_EQ(r.status().message(), "the prompt has tokens for 1 image(s) but 2 were given");
  // Patches of the wrong size for the tower, and pixel values that do not fill the grid.
  ImagePixels half;
  half.values = Tensor::empty({2 * image.patches, image.patch_dim / 2}, DataType::kFp32).value();
  half.grids = {image.grid};
  Result<ImageFeatures> features = model->encode_images(half);
  EXPECT_NE(features.status().message().find("pixel_values must be CPU fp32 [patches, 1536]"),
            std::string::npos)
      << features.status().message();
  image.patch_dim = 768;
  r = encode_image_span(*model, ids, 0, {image});
  EXPECT_NE(r.status().message().find("image 0: 280 patches of 768 values"), std::string::npos)
      << r.status().message();
}

TEST(VlModel, TextModelsTakeNoImages) {
  Result<std::unique_ptr<Model>> text =
      Model::load(converted_fixture("qwen3-tiny", DataType::kFp32), ModelOptions{});
  ASSERT_OK(text);
  ImagePixels pixels;
  EXPECT_EQ((*text)->encode_images(pixels).status().message(), "a qwen3 model takes no images");
}

// The delta belongs to the cache rows after the image: cutting the cache back to before the image
// (a new conversation, a rewound prefix) drops it; continuing after it keeps it.
TEST(VlModel, RopeDeltaFollowsTheCache) {
  Golden g = Golden::load(kFixture);
  const std::vector<int32_t>& ids = g.at("img.ids").i32;
  const int64_t T = static_cast<int64_t>(ids.size());
  const ModelConfig config =
      ModelConfig::from_hf(nlohmann::json::parse(
                               read_text(fixtures_dir() + "/" + kFixture + "/config.json")))
          .value();
  Result<RopeIndex> index = qwen3_vl_rope_index(ids, config.image_token_id,
                                                config.vision->spatial_merge_size,
                                                {golden_grid(g, "image.grid_thw_fast")});
  ASSERT_OK(index);
  RopeDeltas deltas;
  deltas.add(*index, 0, T);
  const int64_t delta = deltas.at(T);
  EXPECT_EQ(delta, index->delta);
  EXPECT_LT(delta, 0);
  EXPECT_EQ(deltas.at(0), 0);
  deltas.truncate(T - 1);  // rewrites the last row only
  EXPECT_EQ(deltas.at(T), delta);
  deltas.truncate(0);  // a new prompt from the start
  EXPECT_EQ(deltas.at(T), 0);
  // The same prompt again after 5 cached text tokens (rotary positions 5 on): the same delta.
  RopeIndex later = *index;
  for (int32_t& p : later.positions) p += 5;
  deltas.add(later, 5, T);
  EXPECT_EQ(deltas.at(T + 5), delta);
  EXPECT_EQ(deltas.at(4), 0);
}

TEST(VlModel, DeepstackMatters) { wrong_vision_rows_do_not_match(ModelOptions{}); }

TEST(VlModel, BadInputsAreClearErrors) {
  auto model = load_vl(ModelOptions{});
  ASSERT_NE(model, nullptr);
  Golden g = Golden::load(kFixture);
  const std::vector<int32_t>& ids = g.at("img.ids").i32;
  Result<Tensor> r = model->forward(ids, 0, false);
  EXPECT_EQ(r.status().message(),
            "forward: the span holds 70 image tokens (" +
                std::to_string(model->config().image_token_id) + ") but no image features");
  const ImageFeatures short_embeds = {golden_tensor(g, "image.vision_embeds").rows(0, 69), {}};
  RopeIndex index;
  r = forward_image_prompt(*model, ids, {golden_grid(g, "image.grid_thw_fast")}, short_embeds,
                           LogitRows::kLast, &index);
  EXPECT_EQ(r.status().message(),
            "forward: the span's 70 image tokens take feature rows 0..70 of 69");
}

ModelOptions cuda_options(bool graph) {
  ModelOptions o;
  o.device = DeviceType::kCuda;
  o.activation = DataType::kFp32;
  o.cuda_graph = graph;
  return o;
}

TEST(CudaVlModel, TextOnlyChatMatchesHuggingFace) {
  SKIP_WITHOUT_CUDA();
  text_only_chat(cuda_options(false));
}

TEST(CudaVlModel, ImagePromptWithGoldenVisionEmbedsMatchesHuggingFace) {
  SKIP_WITHOUT_CUDA();
  image_prompt_with_golden_vision(cuda_options(false));
}

TEST(CudaVlModel, ImagePromptFromGoldenPixelValuesMatchesHuggingFace) {
  SKIP_WITHOUT_CUDA();
  image_prompt_from_pixels(cuda_options(false), golden_pixels(Golden::load(kFixture), "fast"),
                           1e-4);
}

TEST(CudaVlModel, ImagePromptFromTestImagePngMatchesHuggingFace) {
  SKIP_WITHOUT_CUDA();
  image_prompt_from_png(cuda_options(true));
}

// fp16 activations (the GPU default): the top token at every position where transformers' fp32
// top-2 are clearly apart, and the greedy continuation through graph decode where its margin is.
TEST(CudaVlModel, Fp16ImagePromptAgreesOnTopTokens) {
  SKIP_WITHOUT_CUDA();
  ModelOptions options = cuda_options(true);
  options.activation = DataType::kFp16;
  auto model = load_vl(options);
  ASSERT_NE(model, nullptr);
  Golden g = Golden::load(kFixture);
  const std::vector<int32_t>& ids = g.at("img.ids").i32;
  const size_t V = static_cast<size_t>(model->config().vocab_size), T = ids.size();
  Result<ImageSpan> span = encode_image_span(*model, ids, 0, {golden_pixels(g, "fast")});
  ASSERT_OK(span);
  SequenceInput prompt = span_input(ids, 0, LogitRows::kAll);
  prompt.rope_positions = span->index.positions;
  prompt.image = &span->features;
  Result<Tensor> all = forward_one(*model, prompt);
  ASSERT_OK(all);
  const std::vector<float> logits = host_floats(*all);
  const std::vector<float>& last = g.at("img.logits_last").f32;
  std::printf("[ measured ] fp16 img: last-position logits max rel error %.3g\n",
              relative_max_error(logits.data() + (T - 1) * V, last.data(), V));
  const GoldenTensor& top_ids = g.at("img.top_ids");
  const GoldenTensor& top_vals = g.at("img.top_vals");
  int compared = 0;
  for (size_t t = 0; t < T; ++t) {
    if (top_vals.f32[t * 8] - top_vals.f32[t * 8 + 1] < 0.05f) continue;
    EXPECT_EQ(top_k(logits.data() + t * V, V, 1)[0], top_ids.i32[t * 8]) << "position " << t;
    ++compared;
  }
  EXPECT_GT(compared, static_cast<int>(T) / 2);
  const std::vector<int32_t>& greedy = g.at("img.greedy").i32;
  const std::vector<float>& margin = g.at("img.greedy_margin").f32;
  prompt.logits = LogitRows::kLast;
  Result<Tensor> step = forward_one(*model, prompt);
  for (size_t i = 0; i < greedy.size(); ++i) {
    ASSERT_OK(step);
    const std::vector<float> row = host_floats(*step);
    if (margin[i] > 0.05f) EXPECT_EQ(top_k(row.data(), V, 1)[0], greedy[i]) << "step " << i;
    const std::vector<int32_t> token = {greedy[i]};
    step = forward_one(*model, span_input(token, static_cast<int64_t>(T + i), LogitRows::kLast,
                                          span->index.delta));
  }
}

TEST(CudaVlModel, ChunkedPrefillWithGraphDecodeMatchesHuggingFace) {
  SKIP_WITHOUT_CUDA();
  ModelOptions options = cuda_options(true);
  options.prefill_chunk = 16;
  image_prompt_with_golden_vision(options);
}

TEST(CudaVlModel, ImagePromptWithGraphDecodeMatchesHuggingFace) {
  SKIP_WITHOUT_CUDA();
  image_prompt_with_golden_vision(cuda_options(true));
}

// bf16 activations and KV cache against transformers run in bf16 (golden_bf16.safetensors), from
// the bf16 checkpoint, for every attention kind, eager and graph decode: the text prompt, and the
// image prompt through the bf16 vision tower from the golden pixel values, each with the top
// token at every position and the greedy continuation (decode with the rope delta) where the
// margin allows.
TEST(CudaVlModel, Bf16MatchesBf16Goldens) {
  SKIP_WITHOUT_CUDA();
  const Golden g = Golden::load(kFixture, "golden_bf16.safetensors");
  for (AttentionKind kind : {AttentionKind::kMha, AttentionKind::kFlash1, AttentionKind::kFlash2}) {
    for (bool graph : {false, true}) {
      const std::string what =
          std::string(kFixture) + " " + attention_name(kind) + " bf16" + (graph ? " graph" : "");
      ModelOptions options = cuda_options(graph);
      options.activation = DataType::kBf16;
      options.attention = kind;
      auto model = load_vl(options, DataType::kBf16);
      ASSERT_NE(model, nullptr);
      const size_t V = static_cast<size_t>(model->config().vocab_size);
      int compared = 0;
      // The prompt p's rows, then its greedy continuation fed one golden token at a time.
      auto check = [&](const std::string& p, const std::vector<float>& rows, int64_t rope_offset) {
        compared += expect_prompt_rows_match(rows, g, p, kHalfTolerance, what);
        if (rows.size() < V) return;
        std::vector<float> last(rows.end() - static_cast<std::ptrdiff_t>(V), rows.end());
        const std::vector<int32_t>& greedy = g.at(p + ".greedy").i32;
        const int64_t T = static_cast<int64_t>(g.at(p + ".ids").i32.size());
        for (size_t i = 0; i < greedy.size(); ++i) {
          compared += expect_greedy_step(last, g, p, i, kHalfTolerance, what);
          if (i + 1 == greedy.size()) break;
          last = host_floats(forward_one(
              *model, span_input({greedy[i]}, T + static_cast<int64_t>(i), LogitRows::kLast,
                                 rope_offset)));
        }
      };
      check("chat", host_floats(model->forward(g.at("chat.ids").i32, 0, true)), 0);

      const std::vector<int32_t>& ids = g.at("img.ids").i32;
      Result<ImageSpan> span = encode_image_span(*model, ids, 0, {golden_pixels(g, "fast")});
      ASSERT_OK(span);
      const std::vector<float>& want = g.at("image.vision_embeds").f32;
      double scale = 0;
      for (float v : want) scale = std::max(scale, std::fabs(double(v)));
      EXPECT_LE(max_abs_error(host_floats(span->features.embeds), want) / scale, kHalfTolerance)
          << what << ": vision embeds";
      SequenceInput prompt = span_input(ids, 0, LogitRows::kAll);
      prompt.rope_positions = span->index.positions;
      prompt.image = &span->features;
      check("img", host_floats(forward_one(*model, prompt)), span->index.delta);
      EXPECT_GT(compared, 0) << what << ": no position or step with a clear margin";
    }
  }
}

}  // namespace
}  // namespace kuiper::test
